"""run.json across launches: a resumed run continues the earlier losses, a run already at --steps
is not run again, and a diverged loss is kept as null with a note (torch-free).

`meshplan run --steps 20 --checkpoint-every 10` then `meshplan run --steps 20 --resume`: --steps is
the run's total. If the first run finished, the second has nothing left to run and says so (exit 0,
run.json unchanged); if it stopped at step 13, the second resumes from the checkpoint at step 10
and run.json holds the losses of steps 1-10 from the first launch and 11-20 from the second.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

from meshplan.errors import MeshplanError
from meshplan.executor.checkpoint_manifest import checkpoint_root, resume_point
from meshplan.run_result import RunResult
from meshplan.schema import load


def earlier_run(path: Path) -> RunResult | None:
    """The run.json a resumed launch continues, if it is readable (else the resumed steps stand alone)."""
    if not path.is_file():
        return None
    try:
        return load(RunResult, path, "run.json")
    except MeshplanError as exc:
        print(f"meshplan run: warning: {exc}; run.json will hold the resumed steps only", file=sys.stderr)
        return None


def finished_run(path: Path, opts) -> RunResult | None:
    """--resume where the newest complete checkpoint is at --steps and run.json has every step:
    the finished run's result, with a note line; None when there is something to run."""
    if not opts.resume:
        return None
    done, _ = resume_point(path.parent)
    if done != opts.steps:
        return None
    earlier = earlier_run(path)
    if earlier is None or earlier.steps != opts.steps:
        return None  # the launcher's check says what is wrong
    print(
        f"meshplan run: nothing to run: the checkpoint in {checkpoint_root(path.parent)} is at step "
        f"{done} = --steps {opts.steps} and {path} holds that run; raise --steps to train further",
        file=sys.stderr,
        flush=True,
    )
    return earlier


def continue_history(result: RunResult, earlier: RunResult) -> None:
    """Prefix the resumed launch's losses and step times with the earlier run.json's up to the
    checkpoint it resumed from, when the earlier ones reach back to it (same plan, same start)."""
    start = result.resumed_from_step
    have = earlier.first_loss_step
    unknown = not earlier.complete and None in earlier.losses[:start]  # a sync method's, not yet known
    if earlier.plan_hash != result.plan_hash or have != 0 or earlier.steps < start or unknown:
        result.notes.append(
            f"resumed from step {start}: the earlier run.json did not hold steps 1-{start} of this plan; "
            "losses are those of the resumed steps"
        )
        return
    result.losses = earlier.losses[:start] + result.losses
    result.step_times_s = earlier.step_times_s[:start] + result.step_times_s
    result.losses_from_step = 0
    result.notes.append(f"resumed from step {start}: losses and step times of steps 1-{start} are the earlier run's")
    if not earlier.complete:
        result.notes.append(
            f"the earlier launch stopped after step {earlier.steps}; its run.json kept the steps it did"
        )


def finite_losses(losses: list[float]) -> tuple[list[float | None], int | None]:
    """(losses with every non-finite value as None, the first such step counted from 1 or None)."""
    bad = next((i for i, x in enumerate(losses) if not math.isfinite(x)), None)
    return [x if math.isfinite(x) else None for x in losses], None if bad is None else bad + 1


def divergence(result: RunResult) -> str | None:
    """One line if the run's loss diverged (not finite at some step)."""
    bad = next((i for i, x in enumerate(result.losses) if x is None), None)
    if bad is None:
        return None
    return (
        f"the loss diverged: step {result.first_loss_step + bad + 1}'s loss is not finite (NaN or inf); "
        "lower --lr, keep --grad-clip on, or check the data"
    )


def job_step_times(per_rank: list[list[float]]) -> list[float]:
    """The job's duration of each step from every rank's own step durations: their mean.

    Each rank's duration of a step includes its waits on the others, so the ranks advance at the
    job's pace and any rank's durations sum to the job's wall time (to within one step's skew).
    The max over ranks per step would add the ranks' jitter to every step — 30% on 4 ranks
    sharing 2 CPU cores (28.7 ms of wall time per DDP step reported as 37.8 ms) — which the job's
    throughput never pays."""
    return [statistics.fmean(ts) for ts in zip(*per_rank)]


def median_step_s(step_times: list[float], device: str) -> float:
    """Median step time after warm-up: step 0 is warm-up; on CPU step 1 ran under the
    live-tensor tracker (executor/train.py), so it is left out too when there are more."""
    return statistics.median(step_times[timed_steps(len(step_times), device)])


def timed_steps(count: int, device: str) -> slice:
    """The steps after warm-up that the step time is taken over (all of them if too few)."""
    skip = 2 if device == "cpu" and count > 2 else 1
    return slice(skip, None) if count > skip else slice(0, None)


def phase_fields(per_rank: list[list[dict[str, float]]], device: str) -> dict:
    """RunResult's per-phase seconds (executor/phases.py): each rank's mean per step over the
    timed steps, and the job's: the mean over ranks (as job_step_times)."""
    by_rank = []
    for steps in per_rank:
        timed = steps[timed_steps(len(steps), device)]
        names = sorted({name for step in timed for name in step})
        by_rank.append({n: statistics.fmean(step.get(n, 0.0) for step in timed) for n in names})
    names = sorted({n for r in by_rank for n in r})
    job = {n: statistics.fmean(r.get(n, 0.0) for r in by_rank) for n in names} if by_rank else {}
    return {"phase_times_s": job, "phase_times_per_rank_s": by_rank}
