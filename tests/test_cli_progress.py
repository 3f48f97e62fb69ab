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
