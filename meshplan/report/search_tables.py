""" "Why this plan" and "what else": the search's alternatives and rejected families."""

from __future__ import annotations

from meshplan.plan import Plan
from meshplan.report import fmt, svg
from meshplan.report.document import Figure, Section, Table
from meshplan.report.summary import (
    TERM_LABELS,
    TERMS,
    binding_constraint,
    device_word,
    recompute_summary,
    schedule_summary,
    short_label,
    throughput_unit,
)

GIB = 1024**3
MAX_REJECTED_ROWS = 30


def _differences(best: Plan, other: Plan) -> str:
    """What the other plan changes, in a few words."""
    diffs = []
    if short_label(best) != short_label(other):
        diffs.append(short_label(other))
    if (best.microbatch_size, best.num_microbatches) != (other.microbatch_size, other.num_microbatches):
        diffs.append(f"microbatch {other.microbatch_size} x {other.num_microbatches}")
    if schedule_summary(best) != schedule_summary(other):
        diffs.append(schedule_summary(other))
    if best.zero_stage != other.zero_stage:
        diffs.append(f"ZeRO-{other.zero_stage}")
    if recompute_summary(best) != recompute_summary(other):
        diffs.append(f"recompute {recompute_summary(other)}")
    return ", ".join(diffs) or "same knobs, different stage boundaries"


def _knobs(p: Plan) -> list[tuple[str, object]]:
    """The candidate's knobs in the order the search breaks exact ties by (planner/search/
    branch_bound.py sorts (step time, Candidate); Candidate orders its fields so), smaller first."""
    return [
        ("pp", p.pipeline_parallel_degree),
        ("dp_replicate", p.data_parallel_replicate_degree),
        ("dp_shard", p.data_parallel_shard_degree),
        ("cp", p.context_parallel_degree),
        ("tp", p.tensor_parallel_degree),
        ("microbatch", p.microbatch_size),
        ("microbatch count", p.num_microbatches),
        ("schedule", p.pipeline_schedule),
        ("chunks", p.virtual_stages),
        ("ZeRO stage", p.zero_stage),
        ("sequence parallel", p.sequence_parallel),
    ]


def tie_break(plan: Plan, runner_up: Plan) -> str:
    """Why the chosen plan beat the runner-up: the rule, and the runner-up's margin."""
    a, b = plan.predicted, runner_up.predicted
    margin_s = b.step_time_s - a.step_time_s
    lean = a.peak_memory_bytes - b.peak_memory_bytes
    rel = margin_s / a.step_time_s if a.step_time_s > 0 else 0.0
    memory = (
        f"; the runner-up needs {fmt.gib(lean)} less peak memory, which the ranking does not reward" if lean > 0 else ""
    )
    if margin_s == 0:
        differ = [(name, x, y) for (name, x), (_, y) in zip(_knobs(plan), _knobs(runner_up)) if x != y]
        decided = (
            f"the first knob that differs decides, smaller first: {differ[0][0]} {differ[0][1]} before {differ[0][2]}"
            if differ
            else "they differ only in stage boundaries or methods"
        )
        return (
            f"Tie-break: the two have exactly the same predicted step time. The search ranks by predicted "
            f"step time, then by the candidate's knobs (pp, dp, tp, microbatching, schedule, ZeRO); here {decided}{memory}."
        )
    if abs(rel) < 5e-4:
        return (
            f"Tie-break: the runner-up is {fmt.seconds(margin_s)} ({rel * 100:+.3f}%) slower, within the cost "
            f"model's error: treat them as equal{memory}. The search ranks by predicted step time alone."
        )
    return (
        f"Tie-break rule: the lowest predicted step time wins; the runner-up is {fmt.seconds(margin_s)} "
        f"({rel * 100:+.2f}%) slower{memory}."
    )


def why_paragraphs(plan: Plan) -> list[str]:
    out = [f"Binding constraint: {binding_constraint(plan)}."]
    search = plan.search
    if search is None:
        out.append("This plan was estimated, not searched: no alternatives were compared.")
        return out
    out.append(
        f"The search enumerated {search.num_candidates:,} configurations, solved stage boundaries "
        f"and recompute for {search.num_evaluated:,} and rejected {search.num_rejected:,}; this plan "
        "has the lowest predicted step time among those that fit."
    )
    alts = [a for a in search.alternatives if a.prediction is not None]
    if alts and plan.prediction is not None:
        step_s = plan.prediction.step_time_s
        nxt = min(alts, key=lambda a: a.predicted.step_time_s)
        slower = (nxt.predicted.step_time_s - step_s) / step_s if step_s > 0 else 0.0
        out.append(
            f"The runner-up ({_differences(plan, nxt)}) is predicted {fmt.signed_pct(slower)} in step "
            f"time at {fmt.gib(nxt.predicted.peak_memory_bytes)} peak memory per {device_word(plan)}."
        )
        out.append(tie_break(plan, nxt))
    if search.rejected:
        top = max(search.rejected, key=lambda r: r.count)
        out.append(f"The largest rejected family is {top.family} ({top.count:,} candidates): {top.reason}.")
    return out


def _alt_row(rank: str, p: Plan) -> list[str]:
    pred = p.predicted
    return [
        rank,
        short_label(p),
        schedule_summary(p),
        f"{p.microbatch_size} x {p.num_microbatches}",
        str(p.zero_stage),
        recompute_summary(p),
        fmt.seconds(pred.step_time_s),
        fmt.rate(pred.tokens_per_s_per_gpu),
        fmt.pct(pred.mfu),
        fmt.gib(pred.peak_memory_bytes),
    ]


def _terms_row(rank: str, p: Plan) -> list[str]:
    return [rank, *(fmt.seconds(p.predicted.breakdown.get(t, 0.0)) for t in TERMS)]


def alternatives_section(plan: Plan) -> Section:
    ranked = [("chosen", plan)] + [
        (f"#{i + 2}", a) for i, a in enumerate(plan.searched.alternatives) if a.prediction is not None
    ]
    if plan.prediction is None:
        ranked = ranked[1:]
    peak = max((p.predicted.peak_memory_bytes for _, p in ranked), default=0.0)
    scale, unit = (GIB, "GiB") if peak >= 0.5 * GIB else (2**20, "MiB")
    points = [
        (
            p.predicted.peak_memory_bytes / scale,
            p.predicted.tokens_per_s_per_gpu,
            name,
            name == "chosen",
            f"{name}: {short_label(p)}, {fmt.seconds(p.predicted.step_time_s)}",
        )
        for name, p in ranked
    ]
    figure = Figure(
        name="alternatives",
        caption="Top-K alternatives: throughput vs peak memory (chosen in red)",
        svg=svg.scatter(
            points,
            x_unit=f"peak memory per {device_word(plan)} ({unit})",
            y_unit=f"{throughput_unit(plan)}/s/{device_word(plan)}",
            title="alternatives",
        ),
    )
    headers = [
        "rank",
        "degrees",
        "schedule",
        "micro x count",
        "ZeRO",
        "recompute",
        "step time",
        f"{throughput_unit(plan)}/s/{device_word(plan)}",
        "MFU",
        "peak memory",
    ]
    table = Table(
        headers=headers,
        rows=[_alt_row(name, p) for name, p in ranked],
        caption="The chosen plan and the next best",
        highlight_row=0 if ranked and ranked[0][0] == "chosen" else -1,
    )
    terms = Table(  # a second table, so that no column hides behind a horizontal scroll
        headers=["rank", *(TERM_LABELS.get(t, t) for t in TERMS)],
        rows=[_terms_row(name, p) for name, p in ranked],
        caption="Their step-time breakdowns (seconds per term)",
        highlight_row=table.highlight_row,
    )
    items: list[str | Table | Figure] = [figure, table, terms] if ranked else ["The search kept no alternatives."]
    return Section(title="Alternatives", anchor="alternatives", items=items)


def rejected_section(plan: Plan) -> Section:
    rejected = sorted(plan.searched.rejected, key=lambda r: (-r.count, r.family, r.reason))
    if not rejected:
        return Section(title="Rejected families", anchor="rejected", items=["No candidate family was rejected."])
    rows = [[r.family, r.reason, f"{r.count:,}"] for r in rejected[:MAX_REJECTED_ROWS]]
    rest = rejected[MAX_REJECTED_ROWS:]
    if rest:
        rows.append(
            [
                f"{len(rest):,} more families",
                "smaller families, same kinds of reasons (see plan.json)",
                f"{sum(r.count for r in rest):,}",
            ]
        )
    return Section(
        title="Rejected families",
        anchor="rejected",
        items=[
            Table(
                headers=["family", "reason", "candidates"],
                rows=rows,
                caption=f"{plan.searched.num_rejected:,} candidates rejected in all",
            )
        ],
    )
