"""The report's "Data-parallel methods" section, on plans the planner built with approximate
compression allowed: every priced option with its numbers, the chosen one marked, the convergence
caveat on approximate methods only, and measured vs predicted bytes per step."""

from __future__ import annotations

import html
import re

import pytest
from report_fixtures import flat_plan, run_for

from meshplan import dp_methods
from meshplan.models.analytic import gpt_profile
from meshplan.planner import PlanRequest
from meshplan.planner.search import search
from meshplan.presets import cluster_preset
from meshplan.report import fmt, write_report
from meshplan.report.dp_methods_section import method_text

CAVEAT = "changes the training mathematics"
ALLOW = {"compression": ("fp16", "powersgd")}


def planned(**request):
    # hidden 512: big enough that the gradient exchange is bandwidth-bound on NVLink, where PowerSGD's
    # fewer bytes outweigh its second round's latency (at 256 fp16 wins)
    profile = gpt_profile(layers=4, hidden=512, heads=4, seq=128, vocab=1024)
    return search(profile, cluster_preset("a100-80g", 4), PlanRequest(num_gpus=4, global_batch=16, **request))


def sections(plan, tmp_path, run=None) -> tuple[str, str]:
    """(Markdown, visible HTML text) of the Data-parallel methods section."""
    write_report(plan, tmp_path, run=run)
    md = (tmp_path / "report.md").read_text().split("## Data-parallel methods\n", 1)[1].split("\n## ", 1)[0]
    page = (tmp_path / "report.html").read_text()
    body = page.split('<section id="dp-methods">', 1)[1].split("</section>", 1)[0]
    return md.replace("\\|", "|"), body


def visible(body: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def md_rows(md: str) -> list[list[str]]:
    """Cells of the options table's body rows (bold markers stripped)."""
    rows = [
        [c.strip().strip("*") for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("| ")
    ]
    return [row for row in rows if len(row) > 3 and row[3] in ("exact", "approximate")]


@pytest.fixture(scope="module")
def allowed():
    # ZeRO-1, where compression applies (a ZeRO-2 plan, with the step's weight broadcast exposed, is
    # predicted faster here and prices no compression)
    plan = planned(allow=ALLOW, zero=1)
    assert len(plan.prediction.dp_method_options) == 3  # none, fp16, powersgd priced on the chosen split
    return plan


def test_every_option_is_listed_with_its_numbers(allowed, tmp_path):
    md, body = sections(allowed, tmp_path)
    rows = md_rows(md)
    page = visible(body)
    chosen_s = allowed.prediction.step_time_s
    assert len(rows) == len(allowed.prediction.dp_method_options)
    for option, row in zip(allowed.prediction.dp_method_options, rows):
        method = method_text(option.name, option.params)
        by_axis = ", ".join(f"{a} {fmt.nbytes(b)}" for a, b in option.comm_bytes_per_step.items())
        expected = [
            option.axis,
            method,
            "exact" if option.exact else "approximate",
            fmt.seconds(option.step_time_s),
            f"{option.step_time_s / chosen_s:.2f}x",
            by_axis,
            fmt.gib(option.peak_memory_bytes),
            "fits",
        ]
        assert row[1:] == expected
        for cell in expected:
            assert cell in page
    ratios = {row[2].split("(")[0]: float(row[5].rstrip("x")) for row in rows}
    assert ratios["powersgd"] == 1.00 and ratios["none"] > ratios["fp16"] > 1.0  # fewer bytes, faster step
    assert "powersgd(" in md and "rank=2" in md and "error_feedback=true" in md


def test_chosen_option_is_marked(allowed, tmp_path):
    md, body = sections(allowed, tmp_path)
    chosen = [o for o in allowed.prediction.dp_method_options if o.chosen]
    assert len(chosen) == 1 and chosen[0].name == allowed.dp_methods.compression.name == "powersgd"
    marked = [row for row in md_rows(md) if row[0] == "chosen"]
    assert len(marked) == 1 and marked[0][2].startswith("powersgd(")
    assert md.count("| **chosen** |") == 1
    rows_html = re.findall(r"<tr( class=\"chosen\")?>(.*?)</tr>", body)
    assert [visible(r) for c, r in rows_html if c] == [visible(r) for c, r in rows_html if "powersgd(" in r]


def test_convergence_caveat_on_approximate_methods_only(allowed, tmp_path):
    md, body = sections(allowed, tmp_path)
    caveats = [p for p in md.split("\n\n") if CAVEAT in p]
    assert len(caveats) == 2
    assert caveats[0].startswith("compression=fp16 (allowed) is approximate")
    assert caveats[1].startswith("compression=powersgd (chosen) is approximate")
    assert all("check convergence" in p and "compression=none" not in p for p in caveats)
    assert visible(body).count(CAVEAT) == 2


def test_exact_plan_has_no_caveat_and_names_plain_data_parallelism(tmp_path):
    plan = planned(zero=1)  # nothing allowed, ZeRO-1 (ByteScheduler, searched by default, is ZeRO-0 only): no option
    assert plan.dp_methods.approximate() == [] and not plan.prediction.dp_method_options
    md, body = sections(plan, tmp_path)
    report = (tmp_path / "report.md").read_text() + (tmp_path / "report.html").read_text()
    assert CAVEAT not in report
    predicted = ", ".join(f"{a} {fmt.nbytes(b)}" for a, b in plan.prediction.comm_bytes_per_step.items())
    assert plan.prediction.comm_bytes_per_step and predicted
    for text in (md, visible(body)):
        assert "plain synchronous data parallelism (DDP all-reduce)" in text
        assert f"Predicted bytes per step per rank: {predicted}." in text


def test_methods_that_do_not_compose_say_why(tmp_path):
    plan = planned(allow=ALLOW, zero=3)
    md, body = sections(plan, tmp_path)
    rows = {row[2].split("(")[0]: row for row in md_rows(md)}
    assert rows["none"][0] == "chosen" and rows["none"][-1] == "fits"
    for name in ("fp16", "powersgd"):
        assert rows[name][4:8] == ["-", "-", "-", "-"]
        why = f"compression={name} with zero_stage 3: runs with zero_stage 0/1 only"  # meshplan/feasibility.py
        assert rows[name][-1] == f"does not compose: {why}"
        assert rows[name][-1] in visible(body)
        assert f"compression={name} (allowed) is approximate: it {CAVEAT}" in md


def test_bytes_by_mesh_axis_in_mesh_order(tmp_path):
    plan = planned(dp=4, dp_shard=2, zero=3)  # HSDP: both data-parallel axes move bytes
    pred = plan.prediction.comm_bytes_per_step
    assert set(pred) == {"dp_replicate", "dp_shard"}
    md, _ = sections(plan, tmp_path)
    assert (f"dp_replicate {fmt.nbytes(pred['dp_replicate'])}, dp_shard {fmt.nbytes(pred['dp_shard'])}") in md


def test_measured_bytes_beside_predicted(allowed, tmp_path):
    predicted = allowed.prediction.comm_bytes_per_step["dp_replicate"]
    run = run_for(allowed)
    run.comm_bytes_per_step = {"dp_replicate": int(predicted * 1.25)}  # set, so it works before the field exists
    md, body = sections(allowed, tmp_path, run=run)
    row = f"| dp_replicate | {fmt.nbytes(predicted)} | {fmt.nbytes(predicted * 1.25)} | 1.25x |"
    assert row in md
    cells = re.findall(r"<td>(.*?)</td>", body.split("predicted vs measured", 1)[1])
    assert cells == ["dp_replicate", fmt.nbytes(predicted), fmt.nbytes(predicted * 1.25), "1.25x"]


def test_run_without_measured_bytes_says_so(allowed, tmp_path):
    run = run_for(allowed)
    if hasattr(run, "comm_bytes_per_step"):
        run.comm_bytes_per_step = {}
    md, body = sections(allowed, tmp_path, run=run)
    assert "The run recorded no data-parallel bytes per step" in md and "measured / predicted" not in md


def test_hand_built_plan_lists_its_non_default_methods(tmp_path):
    plan = flat_plan()  # CPU offload, a prediction without options or bytes
    md, body = sections(plan, tmp_path)
    assert (
        "This plan's data-parallel methods: offload=cpu(delayed_update=false). Predicted bytes per step per rank: 0 B."
        in md
    )
    assert dp_methods.method("offload", "cpu").exact and CAVEAT not in md


def test_nbytes_units():
    assert [fmt.nbytes(v) for v in (0, 512, 3584, 13214208, 1.5 * 1024**3)] == [
        "0 B",
        "512 B",
        "3.50 KiB",
        "12.6 MiB",
        "1.50 GiB",
    ]
