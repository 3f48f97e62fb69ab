"""Golden validation against published runs (meshplan/data/published-runs.csv, shipped with the
package)."""

from __future__ import annotations

from pathlib import Path

import pytest

import meshplan
from meshplan.validation import validate_published, write_validation_report
from meshplan.validation.report import summary

CSV = Path(meshplan.__file__).parent / "data" / "published-runs.csv"


@pytest.fixture(scope="module")
def rows():
    return validate_published(str(CSV))


def test_every_row_predicted(rows):
    throughput = [r for r in rows if r["kind"] == "throughput"]
    assert len(throughput) == 30 and all(r["rel_error"] is not None for r in throughput)


def test_korthikanti_rows_within_12_percent(rows):
    """The rows that state every knob (Korthikanti et al. 2022 Tables 3 and 5)."""
    errs = [r["rel_error"] for r in rows if r["kind"] == "throughput" and "Korthikanti" in r["source"]]
    assert len(errs) == 9 and max(abs(e) for e in errs) <= 0.12


def test_mean_error_bounded(rows):
    """The 5% mean target is not met (reports/validation.md says why); hold the current level."""
    assert summary(rows)["mean_abs_error"] <= 0.10


def test_memory_within_10_percent(rows):
    mem = [r for r in rows if r["kind"] == "memory"]
    assert len(mem) == 12 and all(abs(r["rel_error"]) <= 0.10 for r in mem)


@pytest.mark.parametrize(
    "figure",
    [
        "Fig. 13: 162B GPT on 64 A100, batch 32",
        "Fig. 13: 162B GPT on 64 A100, batch 128",
        "Fig. 12",
        "Table 2: GPT-3 175B on 768 ",
        "Table 2: GPT-3 175B on 1536 ",
    ],
)
def test_published_orderings(rows, figure):
    (hit,) = [r for r in rows if r["kind"] == "ordering" and r["name"].startswith(figure)]
    assert hit["holds"], hit["detail"]


def test_table2_ptdp_beats_zero3_at_384(rows):
    (hit,) = [r for r in rows if r["kind"] == "ordering" and r["name"].startswith("Table 2: GPT-3 175B on 384 ")]
    assert hit["holds"], hit["detail"]


@pytest.mark.xfail(strict=True, reason="model lets the batch grow without recompute (reports/validation.md)")
def test_fig17_recompute_ordering(rows):
    (hit,) = [r for r in rows if r["kind"] == "ordering" and r["name"].startswith("Fig. 17")]
    assert hit["holds"], hit["detail"]


def test_report_has_per_row_errors(rows, tmp_path):
    out = tmp_path / "validation.md"
    write_validation_report(rows, str(out))
    text = out.read_text()
    assert text.count("\n| ") > 30 and "GPT 1T" in text and "%" in text


def test_data_parallel_cost_at_scale_matches_korthikanti_section_6_3(rows):
    """Held out from the A100 inter-node calibration (presets.A100_INTERNODE_EFFICIENCY, from
    Narayanan's network figures): 8-way data parallelism of the 530B model adds 1.32 s per step
    (37.83 -> 39.15 s, no overlap). The nominal 0.9 of the wire would predict 0.6 s."""
    runs = [
        r
        for r in rows
        if r["kind"] == "throughput"
        and r["model"] == "GPT 530B (MT-NLG)"
        and "Korthikanti" in r["source"]
        and "sp" in r["plan"]
    ]
    one, eight = sorted(runs, key=lambda r: r["num_gpus"])
    assert (one["num_gpus"], eight["num_gpus"]) == (280, 2240)
    assert eight["step_time_s"] - one["step_time_s"] == pytest.approx(39.15 - 37.83, rel=0.30)


def test_unstated_degrees_come_from_the_same_source_and_model():
    import csv

    from meshplan.validation.published import with_source_degrees

    with open(CSV, newline="") as fh:
        rows = list(csv.DictReader(fh))
    filled = with_source_degrees(rows)
    strong = [r for r in filled if "strong-scaling" in r["source"]]
    assert len(strong) == 2 and all((r["tp"], r["pp"]) == ("8", "6") for r in strong)
    assert [r for r in filled if "degrees_from" in r] == strong  # every other row states its own
    # no row of that source and architecture states them, or they do not divide the GPUs: searched
    lone = {**strong[0], "tp": "", "pp": "", "hidden": "12345"}
    odd = {**strong[0], "tp": "", "pp": "", "num_gpus": "100"}
    assert [(r["tp"], r["pp"]) for r in with_source_degrees(rows + [lone, odd])[-2:]] == [("", ""), ("", "")]
