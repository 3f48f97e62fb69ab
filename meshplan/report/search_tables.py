""" "Why this plan" and "what else": the search's alternatives and rejected families."""

from __future__ import annotations

from meshplan.plan import Plan
from meshplan.report import fmt, svg
from meshplan.report.document import Figure, Section, Table
from meshplan.report.summary import (
    TERMS,
    binding_constraint,
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
        nxt = min(alts, key=lambda a: a.prediction.step_time_s)
        slower = (nxt.prediction.step_time_s - step_s) / step_s if step_s > 0 else 0.0
        out.append(
            f"The runner-up ({_differences(plan, nxt)}) is predicted {fmt.signed_pct(slower)} in step "
            f"time at {fmt.gib(nxt.prediction.peak_memory_bytes)} peak memory per GPU."
        )
    if search.rejected:
        top = max(search.rejected, key=lambda r: r.count)
        out.append(f"The largest rejected family is {top.family} ({top.count:,} candidates): {top.reason}.")
    return out


def _alt_row(rank: str, p: Plan) -> list[str]:
    pred = p.prediction
    terms = [fmt.seconds(pred.breakdown.get(t, 0.0)) for t in TERMS]
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
        *terms,
    ]


def alternatives_section(plan: Plan) -> Section:
    ranked = [("chosen", plan)] + [
        (f"#{i + 2}", a) for i, a in enumerate(plan.search.alternatives) if a.prediction is not None
    ]
    if plan.prediction is None:
        ranked = ranked[1:]
    points = [
        (
            p.prediction.peak_memory_bytes / GIB,
            p.prediction.tokens_per_s_per_gpu,
            name,
            name == "chosen",
            f"{name}: {short_label(p)}, {fmt.seconds(p.prediction.step_time_s)}",
        )
        for name, p in ranked
    ]
    figure = Figure(
        name="alternatives",
        caption="Top-K alternatives: throughput vs peak memory (chosen in red)",
        svg=svg.scatter(
            points, x_unit="peak memory per GPU (GiB)", y_unit=f"{throughput_unit(plan)}/s/GPU", title="alternatives"
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
        f"{throughput_unit(plan)}/s/GPU",
        "MFU",
        "peak memory",
        *TERMS,
    ]
    table = Table(
        headers=headers,
        rows=[_alt_row(name, p) for name, p in ranked],
        caption="The chosen plan and the next best, with their step-time breakdowns",
        highlight_row=0 if ranked and ranked[0][0] == "chosen" else -1,
    )
    items = [figure, table] if ranked else ["The search kept no alternatives."]
    return Section(title="Alternatives", anchor="alternatives", items=items)


def rejected_section(plan: Plan) -> Section:
    rejected = sorted(plan.search.rejected, key=lambda r: (-r.count, r.family, r.reason))
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
                caption=f"{plan.search.num_rejected:,} candidates rejected in all",
            )
        ],
    )
