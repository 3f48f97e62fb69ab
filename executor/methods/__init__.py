"""One executor module per data-parallel method of the registry (meshplan/dp_methods.py).

(axis, name) -> module; parallelize.py and data_parallel.py apply them in the fixed order of
parallelize.py's docstring (offload at fully_shard and materialise, then comm_schedule and
compression when DDP or the replica reducer is built). What each module provides:
- compression (allreduce / fp16 / powersgd): `comm_hook(group, params, counter, axis)` ->
  (state, hook) for DDP.register_comm_hook, counting what it sends; fp16 also `WIRE_DTYPE` for
  the ReplicaGradReducer of tensor-parallel replicas; the all-gather and adaptive compressors (topk, accordion,
  accordion_topk, qsgd, nuqsgd, alq, amq) also `replica_reducer(...)` (compressed.py)
- sync=allreduce: `allreduce` (the comm hook and the ReplicaGradReducer)
- sync=master / local-sgd / crossbow / dabmd / gossip / async (sync_*.py): `build(par, params,
  counter)` -> a SyncMethod (sync.py) whose train_step replaces train.py's step, `USES_DDP`
  (only local-sgd keeps DDP, with its `ddp_comm_hook`)
- comm_schedule=buckets: `bucket_cap_mb(params)`, `bucket_bytes(params)`; bytescheduler also
  `wrap(part, group, params, counter)`, which replaces DDP (bytescheduler.py)
- offload (device / offload_cpu / offload_nvme): `fsdp_kwargs(params, device, zero)`,
  `shard_device(params, device, zero)`; cpu and nvme also `optimizer_class(...)`, the host
  optimizer step (host_optimizer.py, nvme_store.py)
- waves=1: `device` (nothing to apply); waves=2 runs as two jobs of the plan (executor/waves.py,
  `meshplan run --waves 2`), each of which is waves=1 here
Bytes are counted as executor/methods/counting.py says (executor/README.md, "Bytes on the wire").
"""

from __future__ import annotations

from types import ModuleType

from meshplan import dp_methods
from meshplan.executor.methods import (
    accordion_powersgd,
    accordion_topk,
    allreduce,
    alq,
    amq,
    buckets,
    bytescheduler,
    device,
    fp16,
    nuqsgd,
    offload_cpu,
    offload_nvme,
    powersgd,
    qsgd,
    sync_async,
    sync_crossbow,
    sync_dabmd,
    sync_gossip,
    sync_localsgd,
    sync_master,
    topk,
)
from meshplan.plan import MethodChoice, Plan

MODULES: dict[tuple[str, str], ModuleType] = {
    ("compression", "none"): allreduce,
    ("compression", "fp16"): fp16,
    ("compression", "powersgd"): powersgd,
    ("compression", "topk"): topk,  # compressed.py's codecs (all-gather, Accordion)
    ("compression", "accordion"): accordion_powersgd,
    ("compression", "accordion_topk"): accordion_topk,
    ("compression", "qsgd"): qsgd,
    ("compression", "nuqsgd"): nuqsgd,
    ("compression", "alq"): alq,
    ("compression", "amq"): amq,
    ("sync", "allreduce"): allreduce,
    ("sync", "master"): sync_master,  # sync.py's SyncMethod (train_step replaces train.py's)
    ("sync", "local-sgd"): sync_localsgd,
    ("sync", "crossbow"): sync_crossbow,
    ("sync", "dabmd"): sync_dabmd,
    ("sync", "gossip"): sync_gossip,
    ("sync", "async"): sync_async,
    ("comm_schedule", "buckets"): buckets,
    ("comm_schedule", "bytescheduler"): bytescheduler,
    ("offload", "none"): device,
    ("offload", "cpu"): offload_cpu,
    ("offload", "nvme"): offload_nvme,
    ("waves", "1"): device,
    ("waves", "2"): device,  # executor/waves.py launches the two waves, each a waves=1 job
}


def method(plan: Plan, axis: str) -> tuple[ModuleType, dict]:
    """The executor module of the plan's method on `axis` and its (resolved) parameters."""
    choice: MethodChoice = getattr(plan.dp_methods, axis)
    row = dp_methods.method(axis, choice.name, f"plan.dp_methods.{axis}.name")
    return MODULES[(axis, row.name)], row.resolve(choice.params, f"plan.dp_methods.{axis}.params")
