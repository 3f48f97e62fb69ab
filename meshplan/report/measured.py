"""Predicted vs measured: the RunResult of `meshplan run` beside the plan's prediction."""

from __future__ import annotations

from meshplan.plan import Plan
from meshplan.report import fmt, svg
from meshplan.report.document import Figure, Section, Table
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
    if run.losses:
        pts = [(run.first_loss_step + i + 1, v) for i, v in enumerate(run.losses) if v is not None]
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
