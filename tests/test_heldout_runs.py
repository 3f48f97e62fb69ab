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


def _flag(pins: str, name: str) -> int:
    words = pins.split()
    return int(words[words.index(name) + 1])


def test_pipeline_rows_run_torchtitans_default_microbatch_count():
    """A row that states its local batch but not its microbatch runs torchtitan's default at the
    benchmarks' commit: pp microbatches, for any schedule (two stages per rank when looped)."""
    pp_rows = [row for row in heldout_runs._rows() if _flag(row["pins"], "--pp") > 1]
    assert pp_rows
    for row in pp_rows:
        pins = row["pins"]
        pp, dp = _flag(pins, "--pp"), _flag(pins, "--dp")
        per_rank = 2 if "--schedule interleaved" in pins else 1
        assert _flag(pins, "--virtual-stages") == per_rank, row["label"]
        local_batch = row["batch"] // dp
        assert local_batch // _flag(pins, "--microbatch") == pp, row["label"]
    assert heldout_runs.torchtitan_pp_pins(32, 8, "interleaved").split()[-1] == "4"
    assert heldout_runs.torchtitan_pp_pins(32, 8, "1f1b").split()[-1] == "4"
