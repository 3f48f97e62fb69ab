"""Step time per cost term, predicted vs measured: the executor's phase times (run.json's
phase_times_s, executor/phases.py) beside the cost model's terms as the timeline lays them out.

A measured phase holds several of the cost model's terms, and the table says which: the forward
holds the forward share of compute and its TP collectives; the backward holds the backward share,
recompute, TP collectives and, under DDP or FSDP, the wait for the gradient collectives at its end
(exposed dp_comm); the pipeline phase holds the bubble and the p2p transfers; the optimizer phase
holds gradient clipping and the optimizer step. Predicted per pipeline rank from the schedule's
replay (report/timeline.py): forward and backward are the rank's F and B blocks, the pipeline
phase is the rest of the compute span (the step's slowest rank sets it for all).
"""

from __future__ import annotations

from meshplan.plan import Plan
from meshplan.report import fmt
from meshplan.report.document import Table
from meshplan.run_result import RunResult

MAX_RANK_ROWS = 64

# (row, the cost model's terms it holds, measured phases it sums)
ROWS = [
    ("forward", "compute (forward share), tp_comm", ("forward",)),
    (
        "backward + gradient sync",
        "compute (backward share), recompute, tp_comm, dp_comm (exposed)",
        ("backward", "dp_comm"),
    ),
    ("pipeline waits", "bubble, pp_comm", ("pipeline",)),
    ("optimizer step", "optimizer (and gradient clipping)", ("grad_clip", "optimizer", "sync")),
    ("data loading", "- (not modelled)", ("data",)),
]


def predicted_phases(plan: Plan) -> list[dict[str, float]]:
    """Per pipeline rank: predicted seconds per step for each row of ROWS (by row name)."""
    from meshplan.report.timeline import simulate

    pred = plan.prediction
    br = pred.breakdown if pred else {}
    tl = simulate(plan)
    span_s = tl.compute_end_s()
    out = []
    for r in range(tl.num_ranks):
        fwd = sum(b.end_s - b.start_s for b in tl.blocks if b.rank == r and b.kind == "F")
        bwd = sum(b.end_s - b.start_s for b in tl.blocks if b.rank == r and b.kind == "B")
        out.append(
            {
                "forward": fwd,
                "backward + gradient sync": bwd + br.get("dp_comm", 0.0),
                "pipeline waits": max(0.0, span_s - fwd - bwd),
                "optimizer step": br.get("optimizer", 0.0),
            }
        )
    return out


def measured_row(phases: dict[str, float], names: tuple[str, ...]) -> float | None:
    found = [phases[n] for n in names if n in phases]
    return sum(found) if found else None


def _error(p: float | None, m: float | None) -> str:
    if p is None or m is None or m <= 0:
        return "-"
    return fmt.signed_pct((p - m) / m)


def _cell(value: float | None) -> str:
    return "-" if value is None else fmt.seconds(value)


def phase_items(plan: Plan, run: RunResult) -> list:
    """The per-term table (job: mean over ranks) and the per-rank table, when the run has phases."""
    if not run.phase_times_s or plan.prediction is None:
        return []
    per_stage = predicted_phases(plan)
    mean = {name: sum(s.get(name, 0.0) for s in per_stage) / len(per_stage) for name, _, _ in ROWS}
    rows = []
    for name, terms, phases in ROWS:
        p = mean[name] if name in per_stage[0] else None
        m = measured_row(run.phase_times_s, phases)
        if not p and m is None:  # e.g. pipeline waits without a pipeline: nothing to compare
            continue
        rows.append([name, terms, _cell(p), _cell(m), _error(p, m)])
    p_sum = sum(v for name, v in mean.items() if name in per_stage[0])
    m_sum = sum(run.phase_times_s.values())
    rows.append(["sum", "step time", _cell(p_sum), _cell(m_sum), _error(p_sum, m_sum)])
    items: list = [
        Table(
            headers=["phase", "cost-model terms", "predicted", "measured", "error"],
            rows=rows,
            caption="Step time per cost term: the executor's phase times (mean over ranks) vs the prediction",
        )
    ]
    items += _rank_table(plan, run, per_stage)
    return items


def _rank_table(plan: Plan, run: RunResult, per_stage: list[dict[str, float]]) -> list:
    from meshplan.report.mesh import layout

    lay = layout(plan)
    per_rank = run.phase_times_per_rank_s
    if not per_rank or lay.world != len(per_rank):
        return []
    shown = [
        name
        for name, _, names in ROWS
        if name in per_stage[0]
        and (any(s[name] for s in per_stage) or any(measured_row(r, names) is not None for r in per_rank))
    ]
    rows = []
    for r, phases in enumerate(per_rank[:MAX_RANK_ROWS]):
        stage = lay.coords(r)["pp"]
        pred = per_stage[stage] if stage < len(per_stage) else {}
        cells = [str(r), str(stage)]
        for name, _, names in ROWS:
            if name in shown:
                cells.append(f"{_cell(pred.get(name))} / {_cell(measured_row(phases, names))}")
        rows.append(cells)
    more = len(per_rank) - MAX_RANK_ROWS
    return [
        Table(
            headers=["rank", "pipeline stage", *(f"{name} (predicted / measured)" for name in shown)],
            rows=rows,
            caption="Step time per cost term and rank"
            + (f" (first {MAX_RANK_ROWS} ranks of {len(per_rank)})" if more > 0 else ""),
        )
    ]
