# meshplan batch settings for accelerate (see accelerate_config.yaml)
PER_DEVICE_TRAIN_BATCH_SIZE = 1
GRADIENT_ACCUMULATION_STEPS = 8
GLOBAL_BATCH_SIZE = 128  # = micro x accumulation x dp 16
SEQ_LEN = 8192
