"""meshplan.profiler: model capture (zoo, user files, HF configs), per-layer FLOPs, memory, timing."""
from meshplan.profiler.api import profile_model
from meshplan.profiler.loader import load_model
from meshplan.profiler.tp_rules import tp_rules

__all__ = ["profile_model", "load_model", "tp_rules"]
