"""The report's parallel layout (meshplan/report/mesh.py), tie-break sentence, memory chart at
many stages, and device words: what a reader of the 175B and the demo reports relies on."""

from __future__ import annotations

import dataclasses
import re

from report_fixtures import gpt_plan

from meshplan.report import svg
from meshplan.report.content import build_document
from meshplan.report.markdown import render_markdown
from meshplan.report.mesh import axis_rows, layout, mesh_svg
from meshplan.report.search_tables import tie_break


def test_each_axis_runs_on_the_link_its_groups_span():
    plan = gpt_plan(pp=16, dp_replicate=8, dp_shard=2, tp=4)  # the GPT-3 175B layout, 8 GPUs a node
    lay = layout(plan)
    assert (lay.world, lay.num_nodes, lay.devices_per_node) == (1024, 128, 8)
    assert {a: lay.stride(a) for a in lay.order} == {"pp": 64, "dp_replicate": 8, "dp_shard": 4, "cp": 4, "tp": 1}
    for r in (0, 5, 77, 1023):  # coordinates number the ranks back, innermost tp
        c = lay.coords(r)
        assert sum(c[a] * lay.stride(a) for a in lay.order) == r
    links = {row[0]: row[3] for row in axis_rows(plan)}
    assert links["tp"].startswith("NVLink") and links["dp_shard"].startswith("NVLink")
    assert links["pp"].startswith("inter-node") and links["dp_replicate"].startswith("inter-node")
    picture = mesh_svg(plan)
    assert picture.count("<title>node ") == 128 and "node 0 of 128: 8 GPUs" in picture


def test_a_cpu_plan_says_ranks_not_gpus():
    plan = dataclasses.replace(gpt_plan(pp=1, dp_replicate=4, tp=1), cluster_name="local-cpu")
    md = render_markdown(build_document(plan))
    assert "per GPU" not in md and "/GPU" not in md and "4 ranks on one node" in md
    assert layout(plan).device == "rank" and axis_rows(plan)[0][3] == "shared memory (gloo)"


def test_the_tie_break_names_the_rule_and_the_margin():
    plan = gpt_plan(zero=2)
    same = dataclasses.replace(plan, zero_stage=3)
    assert "ZeRO stage 2 before 3" in tie_break(plan, same)
    slower = dataclasses.replace(
        same, prediction=dataclasses.replace(plan.prediction, step_time_s=plan.prediction.step_time_s * 1.1)
    )
    text = tie_break(plan, slower)
    assert "lowest predicted step time wins" in text and "(+10.00%) slower" in text


def test_the_memory_chart_stays_readable_at_64_stages():
    cats = [f"stage {i}" for i in range(64)]
    chart = svg.stacked_bars(cats, {"params": [1.0] * 64}, unit="GiB", capacity=[2.0] * 64)
    labels = re.findall(r'text-anchor="middle">(\d+)</text>', chart)
    assert ">stage</text>" in chart and "stage 0<" not in chart  # the shared word moves under the axis
    xs = [float(x) for x in re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="middle">\d+</text>', chart)]
    assert len(labels) >= 8 and min(b - a for a, b in zip(xs, xs[1:])) >= 7.2 * 2 + 8
