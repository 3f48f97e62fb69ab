"""One executor module per data-parallel method of the registry (meshplan/dp_methods.py).

`MODULES`, the executor's one registry: per axis, name -> module, each table typed by its axis'
Protocol (axes.py: Compression, Sync, CommSchedule, Offload, Waves), so mypy checks that every
module gives what the executor calls; `compression_of`, `sync_of`, `comm_schedule_of` and `offload_of`
return the plan's module on that axis, typed, with its resolved parameters. parallelize.py and
data_parallel.py apply them in the fixed order of parallelize.py's docstring (offload at
fully_shard and materialise, then comm_schedule and compression when DDP or the replica reducer
is built). What the axes' modules are:
- compression: allreduce (none), fp16 and powersgd run torch's DDP hooks; the all-gather and
  adaptive compressors (topk, accordion, accordion_topk, qsgd, nuqsgd, alq, amq) run a codec
  (compressed.py) in the hook and in the replica reducer; `TIMED_CODEC` is what `meshplan
  profile` times (codecs.py)
- sync: allreduce is DDP itself; master / local-sgd / crossbow / dabmd / gossip / async
  (sync_*.py) build a SyncMethod (sync.py) whose train_step replaces train.py's step (only
  local-sgd keeps DDP, with its `ddp_comm_hook`)
- comm_schedule: buckets (DDP's buckets); bytescheduler's `wrap` replaces DDP (bytescheduler.py)
- offload: device (none), offload_cpu and offload_nvme (host_optimizer.py, nvme_store.py,
  param_pager.py)
- waves: device: nothing to apply; waves=2 runs as two jobs of the plan (executor/waves.py,
  `meshplan run --waves 2`), each of which is waves=1 here
Bytes are counted as executor/methods/counting.py says (executor/README.md, "Bytes on the wire").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from meshplan import dp_methods
from meshplan.executor.methods import (
    accordion_powersgd,
    accordion_topk,
    allreduce,
    alq,
    amq,
    axes,
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


@dataclass(frozen=True)
class Registry:
    """The executor modules by axis and registry name (module docstring)."""

    compression: Mapping[str, axes.Compression]
    sync: Mapping[str, axes.Sync]
    comm_schedule: Mapping[str, axes.CommSchedule]
    offload: Mapping[str, axes.Offload]
    waves: Mapping[str, axes.Waves]

    def rows(self) -> dict[tuple[str, str], object]:
        """(axis, name) -> module, every axis."""
        return {(f.name, n): m for f in fields(self) for n, m in getattr(self, f.name).items()}


MODULES = Registry(
    compression={
        "none": allreduce,
        "fp16": fp16,
        "powersgd": powersgd,
        "topk": topk,  # compressed.py's codecs (all-gather, Accordion)
        "accordion": accordion_powersgd,
        "accordion_topk": accordion_topk,
        "qsgd": qsgd,
        "nuqsgd": nuqsgd,
        "alq": alq,
        "amq": amq,
    },
    sync={
        "allreduce": allreduce,
        "master": sync_master,  # sync.py's SyncMethod (train_step replaces train.py's)
        "local-sgd": sync_localsgd,
        "crossbow": sync_crossbow,
        "dabmd": sync_dabmd,
        "gossip": sync_gossip,
        "async": sync_async,
    },
    comm_schedule={"buckets": buckets, "bytescheduler": bytescheduler},
    offload={"none": device, "cpu": offload_cpu, "nvme": offload_nvme},
    waves={"1": device, "2": device},  # executor/waves.py launches the two waves, each a waves=1 job
)


def _params(plan: Plan, axis: str) -> tuple[str, dict]:
    """The plan's method name on `axis` (as the registry spells it) and its resolved parameters."""
    choice: MethodChoice = getattr(plan.dp_methods, axis)
    row = dp_methods.method(axis, choice.name, f"plan.dp_methods.{axis}.name")
    return row.name, row.resolve(choice.params, f"plan.dp_methods.{axis}.params")


def compression_of(plan: Plan) -> tuple[axes.Compression, dict]:
    name, params = _params(plan, "compression")
    return MODULES.compression[name], params


def sync_of(plan: Plan) -> tuple[axes.Sync, dict]:
    name, params = _params(plan, "sync")
    return MODULES.sync[name], params


def comm_schedule_of(plan: Plan) -> tuple[axes.CommSchedule, dict]:
    name, params = _params(plan, "comm_schedule")
    return MODULES.comm_schedule[name], params


def offload_of(plan: Plan) -> tuple[axes.Offload, dict]:
    name, params = _params(plan, "offload")
    return MODULES.offload[name], params
