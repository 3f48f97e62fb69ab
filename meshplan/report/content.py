"""Build the report Document from a Plan (and optionally a RunResult): the sections a user reads
before spending a cluster-day — will it fit, how fast, why this one, what else."""

from __future__ import annotations

from meshplan.plan import Plan
from meshplan.report import fmt, svg
from meshplan.report.document import Document, Figure, Section, Table
from meshplan.report.dp_methods_section import dp_methods_section
from meshplan.report.export_common import plan_hash
from meshplan.report.measured import measured_section
from meshplan.report.mesh import AXIS_HEADERS, axis_rows, layout, mesh_svg
from meshplan.report.search_tables import alternatives_section, rejected_section, why_paragraphs
from meshplan.report.summary import (
    TERM_LABELS,
    binding_constraint,
    breakdown_rows,
    device_word,
    key_figures,
    plan_settings,
    short_label,
)
from meshplan.report.timeline import simulate
from meshplan.report.timeline_svg import timeline_svg
from meshplan.run_result import RunResult

GIB = 1024**3


def build_document(plan: Plan, run: RunResult | None = None, title: str | None = None) -> Document:
    title = title or f"meshplan: {plan.model_name} on {plan.world_size} x {plan.cluster_name}"
    subtitle = (
        f"{short_label(plan)}, {plan.pipeline_schedule if plan.pipeline_parallel_degree > 1 else 'no pipeline'}, "
        f"global batch {plan.global_batch_size}" + (f" x seq {plan.seq_len}" if plan.seq_len > 1 else "")
    )
    doc = Document(
        title=title,
        subtitle=subtitle,
        key_figures=key_figures(plan),
        headline=f"Binding constraint: {binding_constraint(plan)}.",
    )
    doc.sections.append(
        Section(
            title="Recommended plan",
            anchor="plan",
            items=[Table(headers=["torchtitan setting", "value", "meaning"], rows=plan_settings(plan))],
        )
    )
    doc.sections.append(layout_section(plan))
    doc.sections.append(Section(title="Why this plan", anchor="why", items=[*why_paragraphs(plan)]))
    if plan.prediction is not None:
        doc.sections += [timeline_section(plan), memory_section(plan), breakdown_section(plan)]
    doc.sections.append(dp_methods_section(plan, run))
    if plan.search is not None:
        doc.sections += [alternatives_section(plan), rejected_section(plan)]
    if run is not None:
        doc.sections.append(measured_section(plan, run))
    doc.sections.append(provenance_section(plan))
    return doc


def layout_section(plan: Plan) -> Section:
    lay = layout(plan)
    rows = axis_rows(plan)
    where = (
        (f"{lay.num_nodes} nodes of {lay.devices_per_node} {lay.device}s" if lay.num_nodes > 1 else "one node")
        if lay.from_preset
        else f"one node of {lay.world} ranks (the cluster is not a preset; its node size is not in the plan)"
    )
    text = (
        f"{plan.world_size} {lay.device}s on {where}, ranks numbered {plan.rank_placement.replace(',', ' > ')} "
        "(the last axis innermost: its groups are consecutive ranks). Each axis's traffic runs on the link "
        "its groups span; bytes are the cost model's per rank and step."
    )
    items: list = [text, Figure(name="layout", svg=mesh_svg(plan), caption="Parallel layout: nodes, ranks and groups")]
    if rows:
        items.append(Table(headers=AXIS_HEADERS, rows=rows, caption="Each parallel axis: its groups and its link"))
    else:
        items.append("Every degree is 1: one rank, no collective traffic.")
    return Section(title="Parallel layout", anchor="layout", items=items)


def timeline_section(plan: Plan) -> Section:
    tl = simulate(plan)
    pred = plan.predicted
    pp, v, m = plan.pipeline_parallel_degree, plan.virtual_stages, plan.num_microbatches
    rows = []
    for r in range(pp):
        busy_s = tl.busy_s(r)
        rows.append(
            [
                str(r),
                fmt.seconds(tl.forward_s[r]),
                fmt.seconds(tl.backward_s[r]),
                fmt.seconds(busy_s),
                fmt.seconds(tl.compute_end_s() - busy_s),
            ]
        )
    analytic = (pp - 1) / (v * m + pp - 1)  # bubble (p-1)/(v m) of the ideal time, Narayanan et al. 2021 Sec. 2.2
    diff = (tl.makespan_s - pred.step_time_s) / pred.step_time_s if pred.step_time_s > 0 else 0.0
    if pp == 1:
        text = (
            f"No pipeline: every rank runs its {m} microbatch{'es' if m > 1 else ''} back to back, then the "
            f"exposed gradient communication and the optimizer step. Replayed step "
            f"{fmt.seconds(tl.makespan_s)} vs cost model {fmt.seconds(pred.step_time_s)} ({fmt.signed_pct(diff)})."
        )
    else:
        text = (
            f"One optimizer step replayed with the predicted stage times ({tl.schedule}, {pp} pipeline ranks, "
            f"{m} microbatches{f', {v} chunks per rank' if v > 1 else ''}); p2p hop {fmt.seconds(tl.hop_s)}. "
            f"Idle share of the compute phase (bubble): {fmt.pct(tl.bubble_fraction())}; "
            f"with equal stages and free p2p it would be (p-1)/(v*m+p-1) = {fmt.pct(analytic)}. "
            f"Replayed step {fmt.seconds(tl.makespan_s)} vs cost model {fmt.seconds(pred.step_time_s)} "
            f"({fmt.signed_pct(diff)}): the replay serialises communication the cost model may overlap."
        )
    if pp > 1 and v * m * pp > 256:
        text += (
            f" At {pp} ranks x {m} microbatches{f' x {v} chunks' if v > 1 else ''} the picture groups the "
            "microbatches; the exact per-rank view of every slice is `meshplan report --trace trace.json`, "
            "opened in ui.perfetto.dev or chrome://tracing."
        )
    table = Table(
        headers=["rank", "forward per chunk", "backward per chunk", "busy", "idle (bubble)"],
        rows=rows,
        caption="Per pipeline rank, one optimizer step",
    )
    return Section(
        title="Pipeline schedule",
        anchor="timeline",
        items=[text, Figure(name="timeline", svg=timeline_svg(tl), caption="Pipeline schedule timeline"), table],
    )


def memory_section(plan: Plan) -> Section:
    mem = plan.predicted.stage_memory
    parts = ("params", "grads", "optimizer", "activations", "buffers")
    # bars on their own range: MiB when the stages are far below a GiB; a capacity far above the
    # bars is said in the caption instead of squashing them to nothing
    top = max((m.total_bytes for m in mem), default=0.0)
    scale, unit = (GIB, "GiB") if top >= 0.5 * GIB else (2**20, "MiB")
    series = {p: [getattr(m, f"{p}_bytes") / scale for m in mem] for p in parts}
    capacity = [m.capacity_bytes / scale for m in mem]
    on_scale = bool(mem) and max(capacity) <= 3 * max(top / scale, 1e-12)
    caption = "Memory per pipeline rank vs capacity"
    if mem and not on_scale:
        caption = (
            f"Memory per pipeline rank; capacity {fmt.gib(max(m.capacity_bytes for m in mem))} per "
            f"{device_word(plan)} is off this scale ({fmt.pct(top / max(m.capacity_bytes for m in mem))} used)"
        )
    figure = Figure(
        name="memory",
        caption=caption,
        svg=svg.stacked_bars(
            [f"stage {m.stage}" for m in mem],
            series,
            unit=unit,
            capacity=capacity if on_scale else None,
            title="memory per stage",
        ),
    )
    rows = [
        [str(m.stage)]
        + [fmt.gib(getattr(m, f"{p}_bytes")) for p in parts]
        + [
            fmt.gib(m.total_bytes),
            fmt.gib(m.capacity_bytes),
            fmt.gib(m.capacity_bytes - m.total_bytes),
            "fits" if m.total_bytes <= m.capacity_bytes else "OOM",
        ]
        for m in mem
    ]
    table = Table(
        headers=["stage", *parts, "total", "capacity", "headroom", ""],
        rows=rows,
        caption=f"Predicted bytes per {device_word(plan)} of each pipeline rank",
    )
    return Section(
        title="Memory per stage",
        anchor="memory",
        items=[figure, table] if mem else ["The prediction has no per-stage memory."],
    )


def breakdown_section(plan: Plan) -> Section:
    pred = plan.predicted
    terms = breakdown_rows(pred)
    total_s = sum(v for _, v in terms)
    step_s = max(pred.step_time_s, 1e-12)
    figure = Figure(
        name="breakdown",
        caption="Step-time breakdown (seconds per term)",
        svg=svg.hbars(
            [TERM_LABELS.get(k, k) for k, _ in terms], [v for _, v in terms], unit="s", title="step-time breakdown"
        ),
    )
    rows = [[TERM_LABELS.get(k, k), fmt.seconds(v), fmt.pct(v / step_s)] for k, v in terms]
    rows.append(["sum of terms", fmt.seconds(total_s), fmt.pct(total_s / step_s)])
    rows.append(["predicted step time", fmt.seconds(pred.step_time_s), fmt.pct(1.0)])
    table = Table(headers=["term", "time", "share of step"], rows=rows)
    return Section(title="Step-time breakdown", anchor="breakdown", items=[figure, table])


def provenance_section(plan: Plan) -> Section:
    prov = plan.provenance
    rows = [
        ["plan decisions hash (no prediction, no search)", plan_hash(plan)],
        ["profile hash", prov.profile_hash or "-"],
        ["cluster hash", prov.cluster_hash or "-"],
        ["meshplan version", prov.meshplan_version or "-"],
    ]
    return Section(title="Provenance", anchor="provenance", items=[Table(headers=["item", "value"], rows=rows)])
