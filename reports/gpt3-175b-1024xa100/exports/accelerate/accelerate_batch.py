# meshplan batch settings for accelerate (see accelerate_config.yaml)
PER_DEVICE_TRAIN_BATCH_SIZE = 6
GRADIENT_ACCUMULATION_STEPS = 4
GLOBAL_BATCH_SIZE = 1536  # = micro x accumulation x dp 64
SEQ_LEN = 2048
