"""The training script `accelerate launch` runs from a meshplan accelerate export in
tests/test_accelerate_runs_deepspeed.py: the export tools' venv (accelerate, DeepSpeed) on CPU ranks,
never imported by pytest. It trains benchmarks/deepspeed_model.py with the batch the export's
accelerate_batch.py gives, through Accelerator.prepare (which builds DeepSpeed's engine from the
plugin's ds_config.json), and writes, on rank 0, engine_report.json: what the engine runs."""

from __future__ import annotations

import json
import os
import sys

import torch
from accelerate import Accelerator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from deepspeed_model import build  # noqa: E402  (a plain file: no package in this venv)


def main() -> None:
    consts: dict = {}
    exec(open("accelerate_batch.py").read(), consts)  # noqa: S102 - the export's own constants
    micro, accumulation = consts["PER_DEVICE_TRAIN_BATCH_SIZE"], consts["GRADIENT_ACCUMULATION_STEPS"]
    accelerator = Accelerator(gradient_accumulation_steps=accumulation)
    model, (tokens, targets) = build(batch=micro)
    steps = 6  # optimizer steps; the same learnable batch every micro-step, so the loss must fall
    data = torch.utils.data.TensorDataset(tokens.repeat(steps * accumulation * accelerator.num_processes, 1),
                                          targets.repeat(steps * accumulation * accelerator.num_processes, 1))  # fmt: skip
    loader = torch.utils.data.DataLoader(data, batch_size=micro)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    engine, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for x, y in loader:
        with accelerator.accumulate(engine):
            loss = torch.nn.functional.cross_entropy(engine(x).float().flatten(0, 1), y.flatten())
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    zero = engine._config.zero_config
    report = {
        "rank": torch.distributed.get_rank(),
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "engine": type(engine).__name__,
        "zero_stage": engine.zero_optimization_stage(),
        "overlap_comm": bool(zero.overlap_comm),
        "reduce_bucket_size": int(zero.reduce_bucket_size),
        "multi_rank_bucket_allreduce": bool(zero.use_multi_rank_bucket_allreduce),
        "accumulation": engine.gradient_accumulation_steps(),
        "micro_batch": engine.train_micro_batch_size_per_gpu(),
        "data_parallel": engine.dp_world_size,
        "communication_bytes": engine.communication_data_type.itemsize,
        "optimizer": type(engine.optimizer).__name__,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    accelerator.wait_for_everyone()
    # rank 0 of the process group (on CPU ranks accelerate's process_index reads 0 on every rank), to a
    # file, not stdout: the launcher interleaves the ranks' output
    if torch.distributed.get_rank() == 0:
        with open("engine_report.json.tmp", "w") as f:
            json.dump(report, f)
        os.replace("engine_report.json.tmp", "engine_report.json")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as benchmarks/deepspeed_worker.py: skip a teardown that can abort after the run
