"""meshplan.profiler: model capture, per-layer FLOPs, memory, timing (models come from meshplan.models)."""

from meshplan.profiler.api import profile_model

__all__ = ["profile_model"]
