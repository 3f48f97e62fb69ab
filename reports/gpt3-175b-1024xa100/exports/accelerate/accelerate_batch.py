# meshplan batch settings for accelerate (see accelerate_config.yaml)
PER_DEVICE_TRAIN_BATCH_SIZE = 2
GRADIENT_ACCUMULATION_STEPS = 24
GLOBAL_BATCH_SIZE = 1536  # = micro x accumulation x dp 32
SEQ_LEN = 2048
