"""`meshplan run` logs each step as it happens (torchtitan-style: step, loss, step time, tokens/s,
memory), from rank 0 only, with the losses run.json then records."""

from __future__ import annotations

import json
import re

from meshplan.cli import main
from meshplan.executor.worker import step_line
from tests.report_fixtures import gpt_plan

LINE = re.compile(r"^\[meshplan\] step (\d+)/3  loss ([\d.]+)  time [\d,.]+ ms  tokens/s [\d,]+", re.M)


def test_a_step_line_says_what_torchtitan_logs():
    plan = gpt_plan()
    line = step_line(plan, {"step": 2, "loss": 5.25, "step_time_s": 0.5, "peak_memory_bytes": 3 * 2**20}, 8)
    tokens = plan.global_batch_size * plan.seq_len / 0.5
    assert line == f"[meshplan] step 2/8  loss 5.2500  time 500.0 ms  tokens/s {tokens:,.0f}  memory 3.0 MiB"
    assert "loss -" in step_line(plan, {"step": 1, "loss": None, "step_time_s": 0.1, "peak_memory_bytes": 0}, 8, 1)


def test_run_logs_every_step_once_with_the_losses_of_run_json(tmp_path, capfd):
    plan = tmp_path / "plan.json"
    assert main(["plan", "--num-gpus", "2", "--global-batch", "4", "-o", str(plan), "-q"]) == 0
    out = tmp_path / "run"
    assert main(["run", str(plan), "--steps", "3", "--out-dir", str(out), "--timeout", "300"]) == 0
    printed = capfd.readouterr().out
    steps = LINE.findall(printed)
    assert [int(s) for s, _ in steps] == [1, 2, 3]  # once per step: rank 0 only
    losses = json.loads((out / "run.json").read_text())["losses"]
    assert [float(v) for _, v in steps] == [round(x, 4) for x in losses]


def _recorder(calls: list):
    """A stand-in for commands.output.progress that records every tick."""
    import contextlib

    @contextlib.contextmanager
    def fake(args, message):
        yield lambda done, total, label=None: calls.append((done, total, label))

    return fake


def test_a_bar_with_counts_on_a_terminal_and_nothing_when_piped(monkeypatch):
    import argparse
    import io

    from rich.console import Console

    from meshplan.commands import output

    args = argparse.Namespace(quiet=False, json=False)
    screen = io.StringIO()
    monkeypatch.setattr(output, "console", lambda: Console(file=screen, force_terminal=True, width=160))
    monkeypatch.setattr(output, "interactive", lambda: True)
    with output.progress(args, "searching plans") as tick:
        tick(3, 7, "candidates")
    assert "candidates: searching plans" in screen.getvalue() and "3/7" in screen.getvalue()
    monkeypatch.setattr(output, "interactive", lambda: False)  # a pipe, a CI log: no bar, no count
    screen.truncate(0)
    with output.progress(args, "searching plans") as tick:
        tick(3, 7, "candidates")
    assert "3/7" not in screen.getvalue()
    monkeypatch.setattr(output, "interactive", lambda: True)
    with output.progress(argparse.Namespace(quiet=True, json=False), "searching plans") as tick:
        tick(3, 7, "candidates")
    assert "3/7" not in screen.getvalue()


def test_plan_search_counts_candidates_to_the_total(tmp_path, monkeypatch):
    from meshplan.commands import planning
    from meshplan.plan import Plan
    from meshplan.schema import load

    calls: list = []
    monkeypatch.setattr(planning, "progress", _recorder(calls))  # where cmd_plan looks it up
    out = tmp_path / "plan.json"
    assert main(["plan", "--num-gpus", "8", "--cluster", "a100-80g", "-o", str(out), "-q"]) == 0
    ticks = [(d, t) for d, t, label in calls if label == "candidates"]
    assert ticks and all(d <= t for d, t in ticks)
    assert [d for d, _ in ticks] == sorted(d for d, _ in ticks)  # never backwards
    done, total = ticks[-1]
    search = load(Plan, out).search
    assert done == total and total >= search.num_evaluated and any(d == search.num_evaluated for d, _ in ticks)


def test_profile_counts_the_layers_it_analyses():
    from meshplan.profiler import profile_model

    calls: list = []
    profile = profile_model("gpt-tiny", {}, device="meta", progress=lambda d, t, label: calls.append((d, t, label)))
    layers = [(d, t) for d, t, label in calls if label == "analysing layers"]
    assert layers[0] == (0, len(profile.layers)) and layers[-1] == (len(profile.layers), len(profile.layers))
    assert len(layers) == len(profile.layers) + 1


def test_validate_counts_the_rows_it_predicts(tmp_path, monkeypatch):
    from pathlib import Path

    from meshplan.validation import published

    shipped = Path(published.__file__).parent.parent / "data" / "published-runs.csv"
    lines = shipped.read_text().splitlines()
    small = tmp_path / "runs.csv"
    small.write_text("\n".join(lines[:4]) + "\n")  # header + 3 rows
    monkeypatch.setattr(published, "validate_row", lambda row: {"row": row})
    monkeypatch.setattr(published, "memory_checks", lambda rows: [])
    monkeypatch.setattr("meshplan.validation.orderings.published_orderings", lambda: [])
    calls: list = []
    rows = published.validate_published(str(small), lambda d, t: calls.append((d, t)))
    assert calls == [(1, 3), (2, 3), (3, 3)] and len(rows) == 3
