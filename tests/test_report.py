"""write_report: the Markdown and the self-contained HTML say the same thing, deterministically."""

from __future__ import annotations

import dataclasses
import html
import re

import pytest
from report_fixtures import flat_plan, gpt_plan, run_for, searched_plan, uneven_plan

from meshplan.plan import Rejection
from meshplan.report import write_report
from meshplan.report.summary import binding_constraint

NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def html_text(page: str) -> str:
    """Visible text of the report outside the plots (SVG tick labels have no Markdown twin)."""
    body = page.split("<body>", 1)[1]
    body = re.sub(r"<svg.*?</svg>", " ", body, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def md_text(text: str) -> str:
    text = re.sub(r"\]\(plots/[a-z]+\.svg\)", "]", text)  # file names of the plots
    return text.replace("\\|", "|")


def numbers(text: str) -> set[str]:
    return set(NUMBER.findall(text))


@pytest.fixture()
def report(tmp_path):
    plan = searched_plan()
    paths = write_report(plan, tmp_path, run=run_for(plan))
    return plan, paths, (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()


def test_writes_markdown_html_and_plots(report, tmp_path):
    _, paths, md, page = report
    assert paths[:2] == [tmp_path / "report.md", tmp_path / "report.html"]
    names = {p.name for p in paths[2:]}
    assert names == {"layout.svg", "timeline.svg", "memory.svg", "breakdown.svg", "alternatives.svg", "loss.svg"}
    for name in names:
        assert f"](plots/{name})" in md
        assert (tmp_path / "plots" / name).read_text().startswith("<svg")
    assert page.count("<svg") == len(names)
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_markdown_and_html_show_the_same_numbers(report):
    _, _, md, page = report
    md_numbers, html_numbers = numbers(md_text(md)), numbers(html_text(page))
    assert md_numbers == html_numbers
    assert len(md_numbers) > 80


def test_summary_numbers_come_from_the_plan(report):
    plan, _, md, _ = report
    pred = plan.prediction
    assert "| parallelism.pipeline_parallel_degree | 4 |" in md
    assert "| parallelism.tensor_parallel_degree | 2 |" in md
    assert "| training.global_batch_size | 32 | = 2 x 8 x dp 2 |" in md
    assert f"{pred.step_time_s:.3f} s" in md
    assert f"{pred.mfu * 100:.1f}% / {pred.hfu * 100:.1f}%" in md
    cap = min(m.capacity_bytes for m in pred.stage_memory)
    assert f"{pred.peak_memory_bytes / 2**30:.2f} GiB of {cap / 2**30:.2f} GiB" in md
    assert f"**Binding constraint: {pred.binding_constraint}.**" in md


def test_alternatives_rejected_and_measured_sections(report):
    plan, _, md, page = report
    for rej in plan.search.rejected:
        assert f"| {rej.family} | {rej.reason} | {rej.count:,} |" in md
    assert md.count("| #") == 2 * len(plan.search.alternatives)  # the alternatives and their breakdowns
    assert '<tr class="chosen">' in page
    # measured step time is 1.18x the prediction: error (pred - meas) / meas = -15.3%
    assert re.search(r"\| step time \(median\) \| 2\.500 s \| 2\.950 s \| -15\.3% \|", md)
    assert "Loss went from 5.6000 to" in md


def test_run_of_another_plan_is_flagged(tmp_path):
    plan = searched_plan()
    write_report(plan, tmp_path / "same", run=run_for(plan))
    assert "measured on plan" not in (tmp_path / "same" / "report.md").read_text()
    other = dataclasses.replace(run_for(plan), plan_hash="0000000000000000")
    write_report(plan, tmp_path / "other", run=other)
    assert "Warning: this run was measured on plan 0000000000000000" in (tmp_path / "other" / "report.md").read_text()


def test_deterministic_bytes(tmp_path):
    plan = searched_plan()
    write_report(plan, tmp_path / "a", run=run_for(plan))
    write_report(plan, tmp_path / "b", run=run_for(plan))
    for name in ("report.md", "report.html", "plots/timeline.svg"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_self_contained_html(report):
    _, _, _, page = report
    assert "<script" not in page
    assert not re.search(r"""(?:src|href)=["'](?!#|data:)""", page)  # only in-page anchors
    assert "@import" not in page and "url(" not in page
    assert re.sub(r'xmlns="http://www\.w3\.org/2000/svg"', "", page).count("http") == 0


def test_plans_without_search_or_run_or_prediction(tmp_path):
    write_report(flat_plan(), tmp_path / "flat")
    md = (tmp_path / "flat" / "report.md").read_text()
    assert "estimated, not searched" in md and "## Alternatives" not in md
    assert "## Predicted vs measured" not in md
    bare = dataclasses.replace(gpt_plan(), prediction=None)
    paths = write_report(bare, tmp_path / "bare", title="bare plan")
    assert [p.name for p in paths] == ["report.md", "report.html", "layout.svg"]  # the mesh needs no prediction
    assert "# bare plan" in (tmp_path / "bare" / "report.md").read_text()


def test_uneven_interleaved_plan_report(tmp_path):
    plan = uneven_plan()
    write_report(plan, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "Interleaved1F1B, 2 virtual stages per rank" in md
    assert "| layers per stage | 5 / 3 x3 |" in md
    assert "full on 2 of 14 layers, selective on 1 of 14 layers" in md


def test_binding_constraint_is_derived_when_missing():
    plan = searched_plan()
    plan.prediction.binding_constraint = ""
    assert binding_constraint(plan).startswith("compute:")  # fixture: 43% headroom, compute-bound
    tight = plan.prediction.stage_memory[0]
    tight.total_bytes = 0.95 * tight.capacity_bytes
    assert binding_constraint(plan).startswith("memory on stage 0")
    tight.total_bytes = 0.5 * tight.capacity_bytes
    plan.prediction.breakdown["bubble"] = 0.4 * plan.prediction.step_time_s
    assert binding_constraint(plan) == "pipeline bubble: 40.0% of the step time"


def test_long_rejected_lists_are_capped_with_a_total(tmp_path):
    plan = searched_plan()
    plan.search.rejected = [Rejection(family=f"tp={i}", reason=f"reason {i}", count=100 - i) for i in range(40)]
    write_report(plan, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| tp=29 |" in md and "| tp=30 |" not in md
    assert (
        f"| 10 more families | smaller families, same kinds of reasons (see plan.json) | {sum(range(61, 71))} |" in md
    )


def test_images_report_samples_not_tokens(tmp_path):
    plan = dataclasses.replace(flat_plan(), seq_len=1)
    write_report(plan, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "samples/s per GPU" in md and "tokens" not in md.split("## Recommended plan")[0]


def test_rejected_sorted_and_escaped_in_html(tmp_path):
    plan = searched_plan()
    plan.search.rejected.append(Rejection(family="tp=3 <odd>", reason="heads 16 | not divisible", count=99))
    write_report(plan, tmp_path)
    md, page = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    assert "<td>tp=3 &lt;odd&gt;</td>" in page
    assert "heads 16 \\| not divisible" in md
    rows = [
        line
        for line in md.splitlines()
        if line.startswith("| tp=") or line.startswith("| pp=") or line.startswith("| microbatch=")
    ]
    assert rows[0].startswith("| tp=3 <odd>")  # most candidates first


def test_offload_trade_shows_memory_saved_against_time_paid(tmp_path):
    """With offload in play (pinned here) the planner prices none / cpu / nvme on the chosen split
    and the report tabulates each one's peak memory and step time, what it saves and costs against
    offload=none, its host<->device and disk bytes, and whether it fits."""
    from planner_profiles import small_gpt

    from meshplan.planner import PlanRequest, estimate
    from meshplan.presets import cluster_preset
    from meshplan.report import fmt
    from meshplan.report.offload_section import offload_options, offload_rows

    req = PlanRequest(
        num_gpus=2,
        global_batch=8,
        precision="bf16",
        tp=1,
        pp=1,
        dp=2,
        microbatch=1,
        zero=0,
        methods={"offload": ("cpu", {})},
    )
    plan = estimate(small_gpt(2), cluster_preset("a100-80g", 2), req)
    none, cpu, nvme = offload_options(plan)
    assert [o.name for o in (none, cpu, nvme)] == ["none", "cpu", "nvme"] and cpu.chosen
    assert nvme.peak_memory_bytes < none.peak_memory_bytes and cpu.peak_memory_bytes < none.peak_memory_bytes
    assert none.step_time_s < cpu.step_time_s < nvme.step_time_s  # the host step, PCIe, then the disk
    assert cpu.comm_bytes_per_step["host_device"] > 0 and nvme.comm_bytes_per_step["nvme"] > 0
    md = write_report(plan, tmp_path) and (tmp_path / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| **chosen** | **cpu**"))
    saved = none.peak_memory_bytes - cpu.peak_memory_bytes
    assert fmt.gib(saved) in row and fmt.seconds(cpu.step_time_s - none.step_time_s) in row
    assert fmt.nbytes(cpu.comm_bytes_per_step["host_device"]) in row and row.endswith("**fits** |")
    none.feasible = False  # had offload=none not fitted, its row says by how much
    assert offload_rows(plan, 1.0)[0][-1] == f"does not fit: {fmt.gib(none.peak_memory_bytes)} > {fmt.gib(1.0)}"


def test_no_offload_trade_where_the_planner_did_not_consider_offload(report):
    _, _, md, _ = report
    assert "Offload trade" not in md
