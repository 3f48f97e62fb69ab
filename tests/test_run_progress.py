"""run.json as the run goes: rewritten after every step the ranks finish, so a killed run keeps
the steps it did, and a resumed run continues them (executor/run_progress.py)."""

from __future__ import annotations

import json
import math

import pytest
from executor_plans import make_plan

from meshplan.errors import RunError
from meshplan.executor import run_plan
from meshplan.executor.reference import reference_losses
from meshplan.executor.run_progress import RunJsonWriter, steps_path
from meshplan.run_result import RunResult
from meshplan.schema import load

SGD = dict(optimizer="sgd", lr=0.5, grad_clip=1.0)


def _record(step: int, loss, t: float, peak: int, run_id: str = "r1") -> str:
    return json.dumps({"step": step, "loss": loss, "step_time_s": t, "peak_memory_bytes": peak, "run_id": run_id})


def test_writer_rewrites_run_json_when_every_rank_finished_a_step(tmp_path):
    plan = make_plan(dp=2)
    path = tmp_path / "run.json"
    writer = RunJsonWriter(path, plan, tmp_path, [0, 1], "r1")
    steps_path(tmp_path, 0).write_text(_record(1, 5.0, 0.2, 10) + "\n" + _record(2, 4.5, 0.4, 30) + "\n")
    # rank 1: step 1 whole, another run's line, and step 2 still being written (no newline yet)
    steps_path(tmp_path, 1).write_text(_record(1, 5.0, 0.4, 20) + "\n" + _record(9, 1.0, 9, 9, "old") + "\n")
    with open(steps_path(tmp_path, 1), "a") as f:
        f.write(_record(2, 4.5, 0.2, 40)[:25])
    writer.poll()
    run = load(RunResult, path)
    assert (run.complete, run.steps, run.losses) == (False, 1, [5.0])
    assert run.step_times_s == pytest.approx([0.3]) and run.peak_memory_per_rank_bytes == [10, 20]
    with open(steps_path(tmp_path, 1), "a") as f:
        f.write(_record(2, 4.5, 0.2, 40)[25:] + "\n")
    writer.poll()
    run = load(RunResult, path)
    assert (run.steps, run.losses, run.peak_memory_per_rank_bytes) == (2, [5.0, 4.5], [30, 40])
    assert run.step_times_s == pytest.approx([0.3, 0.3])


def test_writer_keeps_a_diverged_loss_apart_from_an_unknown_one(tmp_path):
    plan = make_plan(dp=1)
    steps_path(tmp_path, 0).write_text(_record(1, 5.0, 0.1, 1) + "\n" + _record(2, math.nan, 0.1, 1) + "\n")
    RunJsonWriter(tmp_path / "run.json", plan, tmp_path, [0], "r1").poll()
    run = json.loads((tmp_path / "run.json").read_text())  # strict JSON: no NaN token
    assert run["losses"] == [5.0, None] and any("diverged at step 2" in n for n in run["notes"])
    steps_path(tmp_path, 0).write_text(_record(1, None, 0.1, 1) + "\n")
    RunJsonWriter(tmp_path / "b.json", plan, tmp_path, [0], "r1").poll()
    run = json.loads((tmp_path / "b.json").read_text())
    assert run["losses"] == [None] and any("known when the run ends" in n for n in run["notes"])
    assert not any("diverged" in n for n in run["notes"])


@pytest.mark.slow
def test_killed_run_keeps_its_steps_and_resume_continues_them(tmp_path, monkeypatch):
    """Rank 1 dies before step 4 of 5: run.json holds steps 1-3 (complete: false), on the
    single-process trajectory; resuming from the step-2 checkpoint keeps steps 1-2 of it."""
    plan, out = make_plan(dp=2), tmp_path / "run"
    monkeypatch.setenv("MESHPLAN_FAULT", "1:3:exit")
    with pytest.raises(RunError, match=r"^rank 1 "):
        run_plan(plan, steps=5, out_dir=str(out), checkpoint_every=2, quiet=True, timeout_s=60, **SGD)
    partial = load(RunResult, out / "run.json")
    assert (partial.complete, partial.steps, len(partial.losses), len(partial.step_times_s)) == (False, 3, 3, 3)
    ref = reference_losses(plan, steps=5, **SGD)
    assert max(abs(a - b) / b for a, b in zip(partial.losses, ref)) <= 1e-4
    monkeypatch.delenv("MESHPLAN_FAULT")
    resumed = run_plan(plan, steps=5, out_dir=str(out), checkpoint_every=2, resume=True, quiet=True, **SGD)
    saved = load(RunResult, out / "run.json")
    assert saved.complete and saved.resumed_from_step == 2 and saved.losses_from_step == 0
    assert saved.losses[:2] == partial.losses[:2] and len(saved.losses) == 5 == len(resumed.losses)
    assert max(abs(a - b) / b for a, b in zip(saved.losses, ref)) <= 1e-4
    assert any("stopped after step 3" in n for n in saved.notes)
