"""The per-rank entry point torchrun starts: `python -m meshplan.executor.worker --plan plan.json ...`.

Several `--plan` files run one after another in the same process group (the tests batch many
plan variants into one launch; a run has one). Each rank reports through files the launcher
reads, so a crash at interpreter shutdown after the work is done cannot be mistaken for a
failure, and a real failure names its rank:
  out_dir/ranks/rank<R>.status.json   {"state": running|done|error, "variant", "step", "error"}
  <variant dir>/rank<R>.result.json   the RankResult, written before the final barrier
MESHPLAN_FAULT="rank:step:exit|hang|raise" makes one rank fail on purpose (tests of the timeout).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from meshplan.executor import multinode, waves
from meshplan.executor.run_dir import set_parent_death_signal
from meshplan.executor.train import TrainOptions, train
from meshplan.plan import Plan
from meshplan.schema import content_hash, load, write_text_atomic


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="meshplan.executor.worker")
    ap.add_argument("--plan", action="append", required=True, help="plan.json (repeat to run variants)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=None)
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--timeout-s", type=float, default=300)
    ap.add_argument("--run-id", default="", help="the launch's id, written into every status and result file")
    return ap.parse_args(argv)


def step_line(plan, record: dict, steps: int, variant: int | None = None) -> str:
    """[meshplan] step 3/8  loss 5.5561  time 87.7 ms  tokens/s 2,918  memory 4.7 MiB"""
    dt = record["step_time_s"]
    tokens = plan.global_batch_size * plan.seq_len / dt if dt > 0 else 0.0
    loss = "-" if record["loss"] is None else f"{record['loss']:.4f}"
    memory = f"  memory {record['peak_memory_bytes'] / 2**20:,.1f} MiB" if record["peak_memory_bytes"] else ""
    where = f" variant {variant}" if variant is not None else ""
    return (
        f"[meshplan]{where} step {record['step']}/{steps}  loss {loss}  time {dt * 1e3:,.1f} ms  "
        f"tokens/s {tokens:,.0f}{memory}"
    )


def variant_dir(out_dir: str, index: int, count: int) -> Path:
    return Path(out_dir) if count == 1 else Path(out_dir) / f"variant{index}"


class StepLog:
    """This rank's step records, one JSON line each, appended as each step ends
    (<variant dir>/rank<R>.steps.jsonl): the launcher turns them into run.json while the run goes
    (executor/run_progress.py), so a run that is killed keeps the steps it did. A line that cannot
    be written (a full disk) stops the log, never the training."""

    def __init__(self, path: Path, run_id: str = ""):
        self.path, self.run_id, self.broken = path, run_id, False

    def append(self, record: dict) -> None:
        if self.broken:
            return
        line = json.dumps({**record, "run_id": self.run_id}) + "\n"  # a NaN loss stays NaN (diverged)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:  # one write of a whole line: a reader skips a partial tail
                f.write(line)
        except OSError:
            self.broken = True


class Status:
    """This rank's status file (atomic rewrites; its mtime is the launcher's heartbeat)."""

    def __init__(self, out_dir: str, rank: int, run_id: str = ""):
        self.path = Path(out_dir) / "ranks" / f"rank{rank}.status.json"
        self.info = {
            "rank": rank,
            "state": "starting",
            "variant": 0,
            "step": -1,
            "error": "",
            "pid": os.getpid(),
            "run_id": run_id,
        }

    def update(self, **fields) -> None:
        self.info.update(fields, time=time.time())
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(self.info) + "\n")
            os.replace(tmp, self.path)  # atomic: the launcher never reads a half-written file
        except OSError:  # a full disk: no half-written file stays; the rank fails naming why
            tmp.unlink(missing_ok=True)
            raise


def _fault(rank: int, variant: int, step: int | str) -> None:
    """Test hook: MESHPLAN_FAULT="rank:step:mode", step an int or "end" (after teardown)."""
    spec = os.environ.get("MESHPLAN_FAULT", "")
    if not spec:
        return
    f_rank, f_step, mode = spec.split(":")
    if int(f_rank) != rank or f_step != str(step) or variant != 0:
        return
    if mode == "abort":
        os.abort()  # what the intermittent gloo shutdown crash looks like (SIGABRT)
    if mode == "exit":
        os._exit(17)
    if mode == "hang":
        while True:
            time.sleep(60)
    raise RuntimeError(f"injected failure on rank {rank} at step {step}")


def _device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def run_variants(args: argparse.Namespace, status: Status, device: torch.device) -> None:
    rank = dist.get_rank()
    for i, plan_path in enumerate(args.plan):
        plan = load(Plan, plan_path)
        out = variant_dir(args.out_dir, i, len(args.plan))
        options = TrainOptions(
            steps=args.steps,
            optimizer=args.optimizer,
            lr=args.lr,
            grad_clip=args.grad_clip,
            seed=args.seed,
            data=args.data,
            out_dir=str(out),
            checkpoint_every=args.checkpoint_every,
            resume=args.resume,
        )

        def on_step(step: int, i=i) -> None:
            status.info["current"] = step  # reported if this step raises
            _fault(rank, i, step)
            status.update(state="running", variant=i, step=step)

        log = StepLog(out / f"rank{rank}.steps.jsonl", args.run_id)

        def on_step_end(record: dict, i=i, plan=plan, steps=options.steps, log=log) -> None:
            log.append(record)  # the launcher rewrites run.json from these as the run goes
            if rank == 0:  # one line a step, rank 0
                print(step_line(plan, record, steps, i if len(args.plan) > 1 else None), flush=True)

        result = train(plan, options, device, on_step, on_step_end)
        write_text_atomic(
            out / f"rank{rank}.result.json", json.dumps({**result.to_json(), "run_id": args.run_id}) + "\n"
        )
        if rank == 0:
            print(f"[meshplan] variant {i}: losses {[round(x, 5) for x in result.losses]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    set_parent_death_signal(signal.SIGKILL)  # never outlive torchrun (e.g. when it is SIGKILLed)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = _device()
    backend = "nccl" if device.type == "cuda" else "gloo"
    # collectives wait longer than the launcher's no-progress watchdog, so a hang is reported
    # by the launcher (naming the rank that fell behind), not as a timeout on its peers
    dist.init_process_group(backend, timeout=timedelta(seconds=2 * args.timeout_s + 30))
    waves.rank_setup(dist.get_rank())  # waves=2 (executor/waves.py); a no-op otherwise
    status = Status(args.out_dir, dist.get_rank(), args.run_id)
    try:
        status.update(state="running")
        if multinode.is_multinode():  # every node: the same plan and flags; checkpoints: one out_dir
            multinode.check_ranks_agree(args, [content_hash(load(Plan, p)) for p in args.plan])
            multinode.check_shared_out_dir(args)
        run_variants(args, status, device)
    except BaseException as exc:
        try:
            status.update(
                state="error",
                step=status.info.get("current", -1),
                error=f"{type(exc).__name__}: {exc}".splitlines()[0][:500],
            )
        except OSError:  # the disk is full: the exception below in launch.log (or the pipe) says so
            pass
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # skip the collective teardown: peers may be blocked in a collective
    dist_rank = dist.get_rank()
    waves.rank_close()
    dist.barrier()  # every rank wrote its result before anyone may exit
    with contextlib.suppress(OSError):  # the result is written: a full disk now loses only this note
        status.update(state="done")
    dist.destroy_process_group()
    _fault(dist_rank, 0, "end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
