"""run.json as the run goes: the launcher rewrites it from the ranks' step records (torch-free).

Every rank appends one JSON line per finished step to <variant dir>/rank<R>.steps.jsonl
(executor/worker.py's StepLog: step, loss, step time, peak memory). While torchrun runs, the
launcher's watch loop calls `RunJsonWriter.poll()`: when every rank of this node has finished
one more step, run.json is rewritten atomically with `complete: false` and the steps done so far,
so a run that is killed, fails or is interrupted keeps them. The launcher replaces it with the
full result once every rank reported. A resumed run's partial run.json continues the earlier
run's losses exactly as the final one does (run_history.continue_history).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from meshplan.errors import MeshplanError, os_error_text
from meshplan.executor import run_history
from meshplan.plan import Plan
from meshplan.run_result import RunResult
from meshplan.schema import content_hash, save


def steps_path(vdir: Path, rank: int) -> Path:
    return vdir / f"rank{rank}.steps.jsonl"


class RunJsonWriter:
    """Rewrites `path` (run.json) each time every rank in `ranks` has logged another step."""

    def __init__(self, path: Path, plan: Plan, vdir: Path, ranks: list[int], run_id: str, **context):
        self.path, self.plan, self.ranks, self.run_id = path, plan, ranks, run_id
        self.earlier: RunResult | None = context.get("earlier")
        """The run.json a resumed launch continues (its earlier steps stay in every rewrite)."""
        self.device: str = context.get("device", "cpu")
        self.files = [steps_path(vdir, r) for r in ranks]
        self.offsets = [0] * len(ranks)
        self.records: list[list[dict]] = [[] for _ in ranks]
        self.written = 0
        self.broken = False

    def poll(self) -> None:
        """Read the new whole lines of every rank; rewrite run.json if a step was completed."""
        if self.broken:
            return
        for i, path in enumerate(self.files):
            self._read(i, path)
        done = min(len(r) for r in self.records)
        if done <= self.written:
            return
        result = partial_result(self.plan, [r[:done] for r in self.records], self.run_id, self.device)
        if self.earlier is not None:
            run_history.continue_history(result, self.earlier)
        try:
            save(result, self.path)
        except (OSError, MeshplanError) as exc:  # a full disk: the run goes on, run.json stays as it was
            self.broken = True
            text = os_error_text(exc) if isinstance(exc, OSError) else str(exc)
            print(f"meshplan run: warning: run.json is no longer updated as the run goes: {text}", file=sys.stderr)
            return
        self.written = done

    def _read(self, i: int, path: Path) -> None:
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets[i])
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
        for line in data[:end].decode(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("run_id", "") == self.run_id:
                self.records[i].append(record)
        self.offsets[i] += end


def partial_result(plan: Plan, per_rank: list[list[dict]], run_id: str, device: str) -> RunResult:
    """The RunResult of the steps every rank has done: the job's step time per step (the mean
    over ranks, as at the end), rank 0's losses, every rank's peak memory so far."""
    first = per_rank[0]
    start = first[0]["step"] - 1
    done = first[-1]["step"]
    unknown = any(r["loss"] is None for r in first)
    losses, diverged_at = run_history.finite_losses([math.nan if r["loss"] is None else r["loss"] for r in first])
    step_times = run_history.job_step_times([[r["step_time_s"] for r in records] for records in per_rank])
    median_s = run_history.median_step_s(step_times, device)
    per_rank_peak = [max(r["peak_memory_bytes"] for r in records) for records in per_rank]
    notes = [f"in progress or stopped: {done - start} steps done of this launch, up to step {done}"]
    if unknown:
        notes.append("the losses of this replica-synchronisation method are known when the run ends (null until then)")
    elif diverged_at is not None:
        notes.append(f"the loss diverged at step {start + diverged_at}: non-finite losses are null")
    return RunResult(
        run_id=run_id,
        plan_hash=content_hash(plan),
        world_size=plan.world_size,
        steps=done,
        losses=losses,
        step_time_s=median_s,
        step_times_s=step_times,
        tokens_per_s=plan.global_batch_size * plan.seq_len / median_s if median_s > 0 else 0.0,
        peak_memory_bytes=max(per_rank_peak),
        peak_memory_per_rank_bytes=per_rank_peak,
        device=device,
        backend="nccl" if device == "cuda" else "gloo",
        resumed_from_step=start,
        complete=False,
        notes=notes,
        **run_history.phase_fields([[r.get("phases_s", {}) for r in records] for records in per_rank], device),
    )
