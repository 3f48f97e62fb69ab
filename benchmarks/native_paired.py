"""Executor and native steps alternated in ONE torchrun launch: the low-noise overhead measure.

    torchrun --nproc-per-node 2 benchmarks/native_paired.py --mode ddp --plan plan.json --out paired.json

Each process builds the plan with `meshplan.executor.apply` (and the executor's optimizer,
clipping and loss reduction: `train._train_step`) and, beside it, the hand-written NativeTrainer
of native_train.py (whose logged loss is rank 0's local one: no extra all-reduce). Steps alternate executor, native, executor, ... (the first of each pair
alternating too), so both see the same host load; rank 0 writes the per-step wall times and
process CPU times (all threads, incl. gloo's; mean over ranks, as the executor reduces them) of both and their losses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from native_train import NativeTrainer, job_times, register_pid  # noqa: E402

from meshplan.executor.data import make_batches  # noqa: E402
from meshplan.executor.data_parallel import build_optimizer  # noqa: E402
from meshplan.executor.model import build_for_apply  # noqa: E402
from meshplan.executor.parallel_dims import build_mesh  # noqa: E402
from meshplan.executor.parallelize import apply  # noqa: E402
from meshplan.executor.train import _train_step  # noqa: E402
from meshplan.executor.worker import Status  # noqa: E402
from meshplan.plan import Plan  # noqa: E402
from meshplan.schema import load  # noqa: E402


class ExecutorTrainer:
    def __init__(self, plan: Plan, out_dir: str):
        self.status = Status(out_dir, dist.get_rank())  # the worker's per-step heartbeat write
        model = build_for_apply(plan)
        self.par = apply(model, plan, build_mesh(plan, "cpu"), device=torch.device("cpu"))
        self.opts = [build_optimizer(p, self.par.dims, plan, "adamw", 3e-4, 0.1) for p in self.par.parts]
        self.batches = make_batches(model, plan, self.par.dims.dp_rank, self.par.dims.dp_degree, 0, None)

    def step(self, step: int) -> float:
        self.status.update(state="running", step=step)
        return float(_train_step(self.par, self.opts, self.batches(step), 1.0)[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("ddp", "fsdp"), required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    register_pid()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    plan = load(Plan, args.plan)
    sides = {
        "executor": ExecutorTrainer(plan, str(Path(args.out).parent)),
        "native": NativeTrainer(args.mode, plan.model_name, plan.model_config, plan.global_batch_size),
    }
    times = {name: [] for name in sides}
    cpu = {name: [] for name in sides}
    losses = {name: [] for name in sides}
    for step in range(args.steps):
        order = ("executor", "native") if step % 2 == 0 else ("native", "executor")
        for name in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            losses[name].append(sides[name].step(step))
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    result = {name: job_times(ts) for name, ts in times.items()}
    cpu_result = {name: job_times(ts) for name, ts in cpu.items()}
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"step_times_s": result, "step_cpu_s": cpu_result, "losses": losses}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
