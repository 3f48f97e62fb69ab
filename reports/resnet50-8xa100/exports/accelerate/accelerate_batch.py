# meshplan batch settings for accelerate (see accelerate_config.yaml)
PER_DEVICE_TRAIN_BATCH_SIZE = 128
GRADIENT_ACCUMULATION_STEPS = 1
GLOBAL_BATCH_SIZE = 1024  # = micro x accumulation x dp 8
SEQ_LEN = 1
