"""compression=accordion: Accordion over per-tensor PowerSGD ranks (accordion.py, lowrank.py)."""

from __future__ import annotations

from meshplan.executor.methods import compressed
from meshplan.executor.methods.accordion import AccordionPowerSGD, powersgd_hook

comm_hook = powersgd_hook

replica_reducer = compressed.replica_reducer(AccordionPowerSGD, warmup_param="start_iter")
