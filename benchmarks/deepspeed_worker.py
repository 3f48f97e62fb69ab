"""One rank of benchmarks/deepspeed_bytes.py: real DeepSpeed (the export tools' venv) training
benchmarks/deepspeed_model.py on CPU over gloo, with the zero_optimization block DeepSpeed's
defaults give and the export writes (overlap_comm, contiguous_gradients), bf16, AdamW.

    python benchmarks/deepspeed_worker.py CONFIG_JSON STEPS   (RANK, WORLD_SIZE, MASTER_ADDR/PORT set)

CONFIG_JSON: {"stage": 0-3, "micro_batch": B, "accumulation": M, "zero": {extra zero_optimization keys}}.
Prints one JSON line on rank 0: the optimizer class DeepSpeed chose and the last loss."""

from __future__ import annotations

import json
import os
import sys

import deepspeed
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepspeed_model import build  # noqa: E402  (a plain file beside this one: no package here)


def main() -> None:
    spec, steps = json.loads(sys.argv[1]), int(sys.argv[2])
    model, (tokens, targets) = build(batch=spec["micro_batch"])
    zero = {"stage": spec["stage"], "overlap_comm": True, "contiguous_gradients": True, **spec.get("zero", {})}
    config = {
        "train_micro_batch_size_per_gpu": spec["micro_batch"],
        "gradient_accumulation_steps": spec["accumulation"],
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    loss = torch.zeros(())
    for _ in range(steps * spec["accumulation"]):
        logits = engine(tokens)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        engine.backward(loss)
        engine.step()
    torch.distributed.barrier()  # every rank's last step is on the wire before anyone leaves
    if int(os.environ["RANK"]) == 0:
        print(json.dumps({"optimizer": type(engine.optimizer).__name__, "loss": float(loss)}), flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    # skip the interpreter's teardown: a thread of the loaded comm libraries still joinable there
    # aborts the process ("terminate called without an active exception") after the run is over
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
