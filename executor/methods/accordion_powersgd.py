"""compression=accordion: Accordion over per-tensor PowerSGD ranks (accordion.py, lowrank.py)."""

from __future__ import annotations

from meshplan.executor.methods import allreduce, compressed
from meshplan.executor.methods.accordion import AccordionPowerSGD, powersgd_hook

comm_hook = powersgd_hook

replica_reducer = compressed.replica_reducer(AccordionPowerSGD, warmup_param="start_iter")
check_optimizer = allreduce.check_optimizer
optimizer_kwargs = allreduce.optimizer_kwargs
TIMED_CODEC = AccordionPowerSGD
