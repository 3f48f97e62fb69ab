"""PlanRequest: what the user asks the planner (the `plan` / `estimate` flags).

A field left as None is searched; a set field pins that choice (users often fix one axis).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class PlanRequest:
    num_gpus: int
    global_batch: int
    seq: int | None = None
    """Sequence length; None keeps the profile's."""
    top_k: int = 5
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    microbatch: int | None = None
    schedule: str | None = None
    """torch.distributed.pipelining name ("GPipe", "1F1B", "Interleaved1F1B"); None searches."""
    virtual_stages: int | None = None
    recompute: str | None = None
    """"none" | "selective" | "full" applied to every block; None searches per layer."""
    zero: int | None = None
    sequence_parallel: bool | None = None
    allow_cross_node_tp: bool = False
    precision: str = "bf16"
