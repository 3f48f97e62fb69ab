"""A hand-written torch.distributed training script: the baseline for executor_overhead.

    torchrun --nproc-per-node 2 benchmarks/native_train.py --mode ddp --out native.json

The same model (zoo build, same init), data (the executor's seeded global batch, sliced per
rank), optimizer (AdamW lr 3e-4, wd 0.1, betas 0.9/0.95) and clipping (1.0) as `meshplan run`,
written the way a user would write it by hand: DDP, or FSDP2 fully_shard on the embedding,
each layer, the head and the root (ZeRO-3; torchtitan's units, which the executor uses too). Rank 0 writes the per-step wall time (mean over ranks, as the executor reduces it: launch.job_step_times) and its losses as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from meshplan.models.zoo import build_model


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--model", default="gpt-tiny")
    ap.add_argument("--config", default="{}", help="JSON overrides of the zoo config")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", required=True)
    return ap.parse_args()


def wrap(model: torch.nn.Module, mode: str, world: int) -> torch.nn.Module:
    if mode == "ddp":
        return DDP(model)
    mesh = init_device_mesh("cpu", (world,))
    for unit in [model.embed, *model.layers.values(), model.head]:  # torchtitan's FSDP units
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


class NativeTrainer:
    """The hand-written loop: model, optimizer, one step at a time."""

    def __init__(self, mode: str, model_name: str, config: dict, global_batch: int):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        model = build_model(model_name, config, device="cpu", seed=0)
        self.example_batch, self.loss_of = model.example_batch, model.loss
        self.model = wrap(model, mode, self.world)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))
        self.global_batch, self.per_rank = global_batch, global_batch // self.world

    def step(self, step: int) -> float:
        gen = torch.Generator().manual_seed(step)  # seed 0: the executor's seed * 1_000_003 + step
        x, y = self.example_batch(self.global_batch, gen)
        lo, hi = self.rank * self.per_rank, (self.rank + 1) * self.per_rank
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_of(self.model(x[lo:hi]), y[lo:hi])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss.item()


def job_times(times: list[float]) -> list[float]:
    """Every rank's step times gathered, reduced as the executor does (launch.job_step_times)."""
    from meshplan.executor.launch import job_step_times

    all_times = [None] * dist.get_world_size()
    dist.all_gather_object(all_times, times)
    return job_step_times(all_times)


def register_pid() -> None:
    """Leave this worker's pid where the benchmark can kill it: torchrun puts workers in their own
    sessions, and one stuck at gloo shutdown can outlive torchrun."""
    pid_dir = os.environ.get("MESHPLAN_BENCH_PID_DIR")
    if pid_dir:
        with open(os.path.join(pid_dir, f"worker.{os.getpid()}.pid"), "w") as fh:
            fh.write(str(os.getpid()))


def main() -> None:
    args = parse()
    register_pid()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    trainer = NativeTrainer(args.mode, args.model, json.loads(args.config), args.global_batch)
    times, losses = [], []
    for step in range(args.steps):
        start = time.perf_counter()
        losses.append(trainer.step(step))
        times.append(time.perf_counter() - start)
    times = job_times(times)
    if trainer.rank == 0:
        with open(args.out, "w") as fh:
            json.dump({"step_times_s": times, "losses": losses}, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
