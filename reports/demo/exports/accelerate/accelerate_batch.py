# meshplan batch settings for accelerate (see accelerate_config.yaml)
PER_DEVICE_TRAIN_BATCH_SIZE = 4
GRADIENT_ACCUMULATION_STEPS = 1
GLOBAL_BATCH_SIZE = 16  # = micro x accumulation x dp 4
SEQ_LEN = 32
