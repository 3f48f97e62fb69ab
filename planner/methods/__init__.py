"""The planner's data-parallel method layer: one cost object per method of each axis of
meshplan/dp_methods.py (compression, sync, offload, comm schedule, waves); reads the cost layer."""
