"""benchmarks/heldout_runs.py: torchtitan's published runs through the CLI path. None of them may
be called infeasible, and reports/heldout_runs.md is what the code produces."""

from __future__ import annotations

from pathlib import Path

from benchmarks import heldout_runs

REPORT = Path(__file__).resolve().parent.parent / "reports" / "heldout_runs.md"


def test_every_published_run_is_predicted_and_fits():
    for row in heldout_runs._rows():
        got = heldout_runs.predict(row)
        assert "error" not in got, (row["table"], row["label"], got)
        assert not got["binding"].startswith("OOM"), (row["table"], row["label"], got["binding"])


def test_the_checked_in_table_is_fresh():
    assert REPORT.read_text() == heldout_runs.run(), "regenerate with `make reports`"
