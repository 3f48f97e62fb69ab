"""The executor times each step's phases (executor/phases.py); run.json keeps them and the
report puts them beside the cost model's terms, per term and per rank."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest
import torch

from meshplan.cli import main
from meshplan.executor import phases
from meshplan.executor.reference import reference_losses
from meshplan.plan import Plan
from meshplan.report import fmt
from meshplan.report.measured import measured_section
from meshplan.report.measured_phases import ROWS
from meshplan.run_result import RunResult
from meshplan.schema import load


def test_nested_phases_keep_their_own_time(monkeypatch):
    clock = iter([0.0, 1.0, 3.0, 4.0, 4.5, 10.0, 11.0])
    monkeypatch.setattr(phases.time, "perf_counter", lambda: next(clock))
    timer = phases.PhaseTimer(torch.device("cpu"))
    with timer.phase("pipeline"):  # 0 .. 10
        with timer.phase("forward"):  # 1 .. 3
            pass
        with timer.phase("backward"):  # 4 .. 4.5
            pass
    assert timer.end_step() == {"forward": 2.0, "backward": 0.5, "pipeline": 7.5}
    assert timer.end_step() == {}


def _text(items) -> str:
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif hasattr(item, "rows"):
            out += [" | ".join(item.headers)] + [" | ".join(r) for r in item.rows]
    return "\n".join(out)


@pytest.mark.slow
def test_pipelined_run_records_phases_that_sum_to_the_step_and_the_report_shows_them(tmp_path):
    plan_path, out = tmp_path / "plan.json", tmp_path / "run"
    assert main(["plan", "--num-gpus", "2", "--pp", "2", "--global-batch", "8", "-o", str(plan_path), "-q"]) == 0
    assert main(["run", str(plan_path), "--steps", "4", "--out-dir", str(out), "--optimizer", "sgd", "-q"]) == 0
    run, plan = load(RunResult, out / "run.json"), load(Plan, plan_path)
    got = run.phase_times_s
    assert {"data", "forward", "backward", "pipeline", "grad_clip", "optimizer"} <= set(got)
    assert all(got[k] > 0 for k in ("forward", "backward", "pipeline", "optimizer"))
    timed = statistics.fmean(run.step_times_s[2:])  # the steps the phases are averaged over (CPU)
    assert sum(got.values()) == pytest.approx(timed, rel=0.05)
    assert len(run.phase_times_per_rank_s) == 2
    for rank, own in enumerate(run.phase_times_per_rank_s):
        assert own["forward"] > 0 and own["backward"] > 0, rank
    # every rank's partial records carried the phases too
    records = [json.loads(x) for x in (out / "rank1.steps.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all("backward" in r["phases_s"] for r in records)
    # timing changes nothing that is computed: the single-process losses
    ref = reference_losses(plan, steps=4, optimizer="sgd", lr=3e-4, grad_clip=1.0)
    assert max(abs(a - b) / b for a, b in zip(run.losses, ref)) <= 1e-5

    text = _text(measured_section(plan, run).items)
    for name, terms, _ in ROWS:
        assert f"{name} | {terms}" in text
    forward_row = next(line for line in text.splitlines() if line.startswith("forward | "))
    assert fmt.seconds(got["forward"]) in forward_row
    assert "rank | pipeline stage | forward (predicted / measured)" in text
    assert "no phase times" not in text
    old = dataclasses.replace(run, phase_times_s={}, phase_times_per_rank_s=[])
    assert "no phase times" in _text(measured_section(plan, old).items)
