# meshplan batch settings for accelerate (see accelerate_config.yaml)
PER_DEVICE_TRAIN_BATCH_SIZE = 2
GRADIENT_ACCUMULATION_STEPS = 1
GLOBAL_BATCH_SIZE = 128  # = micro x accumulation x dp 64
SEQ_LEN = 8192
