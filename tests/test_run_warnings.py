"""Framework warnings once on the terminal, not once per rank; launch.log keeps every rank's
(executor/output_filter.py)."""

from __future__ import annotations

import pytest
from executor_plans import make_plan

from meshplan.executor import run_plan
from meshplan.executor.output_filter import WarningDedupe

CPP = "[rank{r}]:[W1202 01:52:01.{ns} reducer.cpp:1529] Warning: find_unused_parameters=True was specified (function operator())\n"
PY = "/x/torch/distributed/pipelining/stage.py:{line}: UserWarning: the stage has no buffers\n"


def test_a_warning_every_rank_prints_is_shown_once_and_nothing_else_is_dropped():
    lines = [CPP.format(r=r, ns=828077594 + r) for r in range(4)]
    lines += [PY.format(line=12), "  warnings.warn(msg)\n", PY.format(line=12), "  warnings.warn(msg)\n"]
    lines += [PY.format(line=13), "  warnings.warn(other)\n"]  # another place: another warning
    lines += ["[meshplan] step 1/2  loss 5.5626\n", "[meshplan] step 1/2  loss 5.5626\n", "  indented output\n"]
    dedupe = WarningDedupe()
    shown = [line for line in lines if dedupe.keep(line)]
    assert shown == [
        lines[0],
        PY.format(line=12),
        "  warnings.warn(msg)\n",
        PY.format(line=13),
        "  warnings.warn(other)\n",
        "[meshplan] step 1/2  loss 5.5626\n",
        "[meshplan] step 1/2  loss 5.5626\n",  # not a warning: a repeat is kept
        "  indented output\n",
    ]


@pytest.mark.slow
def test_ddp_warning_of_a_pipelined_plan_is_printed_once(tmp_path, capfd):
    """pp=2 x dp=2: DDP with find_unused_parameters warns on each of the 4 ranks."""
    plan = make_plan(pp=2, dp=2, microbatch=2, microbatches=2, schedule="GPipe")
    run_plan(plan, steps=2, out_dir=str(tmp_path), quiet=False)
    shown = capfd.readouterr().out
    log = (tmp_path / "launch.log").read_text()
    assert log.count("find_unused_parameters=True was specified") == 4
    assert shown.count("find_unused_parameters=True was specified") == 1
    assert shown.count("[meshplan] step") == 2
