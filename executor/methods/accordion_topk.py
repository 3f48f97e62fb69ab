"""compression=accordion_topk: Accordion over top-k densities (accordion.py, topk.py)."""

from __future__ import annotations

from meshplan.executor.methods import allreduce, compressed
from meshplan.executor.methods.accordion import AccordionTopK, topk_hook

comm_hook = topk_hook

replica_reducer = compressed.replica_reducer(AccordionTopK)
check_optimizer = allreduce.check_optimizer
optimizer_kwargs = allreduce.optimizer_kwargs
TIMED_CODEC = AccordionTopK
