# meshplan batch settings for accelerate (see accelerate_config.yaml)
PER_DEVICE_TRAIN_BATCH_SIZE = 1
GRADIENT_ACCUMULATION_STEPS = 6
GLOBAL_BATCH_SIZE = 1536  # = micro x accumulation x dp 256
SEQ_LEN = 2048
