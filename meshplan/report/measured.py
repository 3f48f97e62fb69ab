"""Predicted vs measured: the RunResult of `meshplan run` beside the plan's prediction."""

from __future__ import annotations

from meshplan.plan import Plan
from meshplan.report import fmt, svg
from meshplan.report.document import Figure, Section, Table
from meshplan.report.measured_phases import phase_items
from meshplan.report.summary import throughput_unit
from meshplan.run_result import RunResult
from meshplan.schema import content_hash

MAX_LOSS_ROWS = 40


def _error(predicted: float, measured: float) -> str:
    """Relative error of the prediction, (predicted - measured) / measured."""
    if measured <= 0:
        return "-"
    return fmt.signed_pct((predicted - measured) / measured)


def comparison_rows(plan: Plan, run: RunResult) -> list[list[str]]:
    pred = plan.prediction
    rows = []
    if pred is not None:
        tokens_pred = pred.tokens_per_s_per_gpu * plan.world_size
        rows = [
            [
                "step time (median)",
                fmt.seconds(pred.step_time_s),
                fmt.seconds(run.step_time_s),
                _error(pred.step_time_s, run.step_time_s),
            ],
            [
                f"{throughput_unit(plan)}/s (all ranks)",
                fmt.rate(tokens_pred),
                fmt.rate(run.tokens_per_s),
                _error(tokens_pred, run.tokens_per_s),
            ],
            [
                "peak memory (max over ranks)",
                fmt.gib(pred.peak_memory_bytes),
                fmt.gib(run.peak_memory_bytes),
                _error(pred.peak_memory_bytes, run.peak_memory_bytes),
            ],
        ]
    return rows


def breakdown_items(plan: Plan, run: RunResult) -> list:
    """Predicted vs measured per rank (peak memory), per parallel axis (bytes per step) and per
    cost term and rank (the executor's phase times: report/measured_phases.py): what the run
    measured beyond the totals."""
    from meshplan.report.mesh import layout

    pred = plan.prediction
    if pred is None:
        return []
    out: list = []
    stages = {m.stage: m for m in pred.stage_memory}
    lay = layout(plan)
    per_rank = run.peak_memory_per_rank_bytes
    if per_rank and stages and lay.world == len(per_rank):
        rows = []
        for r, measured in enumerate(per_rank):
            st = stages.get(lay.coords(r)["pp"])
            if st is None:
                continue
            rows.append(
                [str(r), str(st.stage), fmt.gib(st.total_bytes), fmt.gib(measured), _error(st.total_bytes, measured)]
            )
        out.append(
            Table(
                headers=["rank", "pipeline stage", "predicted peak", "measured peak", "error"],
                rows=rows,
                caption="Peak memory per rank: the prediction of its pipeline stage vs the rank's measurement",
            )
        )
    axes = sorted(set(pred.comm_bytes_per_step) | set(run.comm_bytes_per_step))
    if axes:
        rows = []
        for axis in axes:
            p, m = pred.comm_bytes_per_step.get(axis), run.comm_bytes_per_step.get(axis)
            rows.append(
                [
                    axis,
                    fmt.nbytes(p) if p is not None else "-",
                    fmt.nbytes(m) if m is not None else "-",
                    _error(p, m) if p is not None and m else "-",
                ]
            )
        out.append(
            Table(
                headers=["axis", "predicted bytes per step", "measured (max over ranks)", "error"],
                rows=rows,
                caption="Collective traffic per parallel axis, per rank and step",
            )
        )
    phases = phase_items(plan, run)
    if phases:
        out += phases
    else:  # a run.json from before the executor timed its phases
        out.append(
            "This run.json has no phase times (an older meshplan run): the step-time terms (compute, "
            "bubble, communication, optimizer) are predicted only; their sum, the step time, is measured."
        )
    return out


def _loss_rows(run: RunResult) -> list[list[str]]:
    first = run.first_loss_step
    stride = max(1, -(-len(run.losses) // MAX_LOSS_ROWS))
    rows = []
    for i in range(0, len(run.losses), stride):
        step_time = fmt.seconds(run.step_times_s[i]) if i < len(run.step_times_s) else "-"
        rows.append([str(first + i + 1), fmt.loss(run.losses[i]), step_time])
    return rows


def measured_section(plan: Plan, run: RunResult) -> Section:
    items: list = [
        f"Measured on {run.world_size} {run.device} ranks ({run.backend}, torch "
        f"{run.torch_version or 'unknown'}), {run.steps} steps; error = (predicted - measured) / "
        "measured. Step time is the median after warm-up."
    ]
    if not run.complete:
        items.append(
            f"This run.json was written while the run went: the run is still going or was stopped "
            f"after step {run.steps}; what follows is of the steps done."
        )
    if run.plan_hash and run.plan_hash != content_hash(plan):
        items.append(
            f"Warning: this run was measured on plan {run.plan_hash}, not on this plan "
            f"({content_hash(plan)}); the comparison below is between different plans."
        )
    rows = comparison_rows(plan, run)
    if rows:
        items.append(Table(headers=["metric", "predicted", "measured", "error"], rows=rows))
    else:
        items.append("The plan has no prediction to compare with.")
    pred = plan.prediction
    if rows and pred is not None and run.step_time_s > 0 and pred.step_time_s > 0:
        ratio = run.step_time_s / pred.step_time_s
        items.append(
            f"Measured steps take {fmt.ratio(ratio)} the predicted time; step time and throughput errors "
            "have opposite signs because one is the inverse of the other (a step predicted too short is "
            "a throughput predicted too high)."
        )
    items += breakdown_items(plan, run)
    if run.losses:
        pts: list[tuple[float, float]] = [
            (run.first_loss_step + i + 1, v) for i, v in enumerate(run.losses) if v is not None
        ]
        items.append(
            Figure(
                name="loss",
                caption="Training loss per step (measured)",
                svg=svg.lines({"loss": pts}, x_unit="step", y_unit="loss", title="loss curve"),
            )
        )
        first, last = run.losses[0], run.losses[-1]
        items.append(f"Loss went from {fmt.loss(first)} to {fmt.loss(last)} over {len(run.losses)} steps.")
        items.append(Table(headers=["step", "loss", "step time"], rows=_loss_rows(run)))
    items += [f"Note: {note}" for note in run.notes]
    return Section(title="Predicted vs measured", anchor="measured", items=items)
