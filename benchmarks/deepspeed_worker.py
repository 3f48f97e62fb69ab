"""One rank of benchmarks/deepspeed_bytes.py: real DeepSpeed (the export tools' venv) training
benchmarks/deepspeed_model.py on CPU over gloo, with the zero_optimization block DeepSpeed's
defaults give and the export writes (overlap_comm, contiguous_gradients), bf16, AdamW.

    python benchmarks/deepspeed_worker.py CONFIG_JSON S1,S2 MARK_DIR   (RANK, WORLD_SIZE, MASTER_ADDR/PORT set)

CONFIG_JSON: {"stage": 0-3, "micro_batch": B, "accumulation": M, "zero": {extra zero_optimization keys}}.
Trains S2 optimizer steps. After step S1 and after step S2 every rank's traffic of those steps is
done (a barrier); rank 0 then writes MARK_DIR/mark<k> and waits for MARK_DIR/ack<k>, which the
launcher writes once it has read the namespace's counters, and a second barrier holds the other
ranks until then: the counters' difference between the two marks is S2 - S1 steady-state steps
plus two barriers. Prints one JSON line on rank 0: the optimizer class DeepSpeed chose and the
last loss."""

from __future__ import annotations

import json
import os
import sys
import time

import deepspeed
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepspeed_model import build  # noqa: E402  (a plain file beside this one: no package here)

MARK_TIMEOUT_S = 120


def _mark(folder: str, k: int) -> None:
    """Rank 0: tell the launcher the traffic up to mark k is on the wire; wait until it has read
    the counters."""
    with open(os.path.join(folder, f"mark{k}"), "w"):
        pass
    ack, deadline = os.path.join(folder, f"ack{k}"), time.monotonic() + MARK_TIMEOUT_S
    while not os.path.exists(ack):
        if time.monotonic() > deadline:
            raise SystemExit(f"no {ack} from the launcher within {MARK_TIMEOUT_S} s")
        time.sleep(0.01)


def main() -> None:
    spec, marks, folder = json.loads(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], sys.argv[3]
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
    loss, done = torch.zeros(()), 0
    for k, upto in enumerate(marks):
        for _ in range((upto - done) * spec["accumulation"]):
            logits = engine(tokens)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
            engine.backward(loss)
            engine.step()
        done = upto
        torch.distributed.barrier()  # every rank's steps so far are on the wire
        if int(os.environ["RANK"]) == 0:
            _mark(folder, k)
        torch.distributed.barrier()  # nobody sends again before the counters are read
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
