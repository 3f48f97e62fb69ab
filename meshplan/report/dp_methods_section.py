"""The "Data-parallel methods" section: the chosen plan re-priced with its default, pinned and
allowed methods (Prediction.dp_method_options), which of them change the training mathematics,
and the data-parallel bytes on the wire per step and rank, predicted and (with a run) measured."""

from __future__ import annotations

from typing import Any

from meshplan import dp_methods
from meshplan.plan import MethodOption, Plan
from meshplan.report import fmt
from meshplan.report.document import Section, Table
from meshplan.report.offload_section import offload_items
from meshplan.report.summary import capacity_bytes
from meshplan.run_result import RunResult

MESH_AXES = ("dp_replicate", "dp_shard")
"""The data-parallel mesh axes in mesh order; any other key a contract carries follows, sorted."""
PLAIN_DP = "plain synchronous data parallelism (DDP all-reduce)"
BYTES_NOTE = (
    "Bytes are data-parallel bytes on the wire per step and rank (ring volumes, "
    "meshplan/comm_bytes.py), by mesh axis, max over the ranks."
)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def method_text(name: str, params: dict[str, Any]) -> str:
    """ "powersgd(rank=2, start_iter=2, ...)"; the bare name when the method has no parameters."""
    if not params:
        return name
    return f"{name}({', '.join(f'{k}={_value(v)}' for k, v in params.items())})"


def _axes(*by_axis: dict[str, int]) -> list[str]:
    keys = {k for d in by_axis for k in d}
    return [a for a in MESH_AXES if a in keys] + sorted(keys - set(MESH_AXES))


def bytes_text(by_axis: dict[str, int]) -> str:
    """ "dp_replicate 12.6 MiB, dp_shard 3.50 MiB"; "0 B" when no data-parallel axis moves bytes."""
    return ", ".join(f"{a} {fmt.nbytes(by_axis[a])}" for a in _axes(by_axis)) or "0 B"


def status_text(option: MethodOption, capacity: float) -> str:
    """fits / does not fit (with the numbers) / does not compose (with the registry's reason)."""
    if option.feasible:  # a valid method this executor does not run says so; DABMD its straggler trade
        note = option.note if option.exact else option.note.partition("; ")[2]
        return f"fits; {note}" if note else "fits"
    if option.step_time_s > 0:  # priced, so it composes: memory is what rejected it
        cap = f" > {fmt.gib(capacity)} capacity" if capacity > 0 else ""
        return f"does not fit: {fmt.gib(option.peak_memory_bytes)} peak{cap}"
    return f"does not compose: {option.note or 'refused by meshplan/feasibility.py'}"


def option_rows(plan: Plan) -> list[list[str]]:
    pred = plan.predicted
    step_s = pred.step_time_s
    rows = []
    for o in pred.dp_method_options:
        priced = o.step_time_s > 0
        rows.append(
            [
                "chosen" if o.chosen else "",
                o.axis,
                method_text(o.name, o.params),
                "exact" if o.exact else "approximate",
                fmt.seconds(o.step_time_s) if priced else "-",
                fmt.ratio(o.step_time_s / step_s) if priced and step_s > 0 else "-",
                bytes_text(o.comm_bytes_per_step) if priced else "-",
                fmt.gib(o.peak_memory_bytes) if priced else "-",
                status_text(o, capacity_bytes(pred)),
            ]
        )
    return rows


def options_table(plan: Plan) -> Table:
    rows = option_rows(plan)
    chosen = [i for i, o in enumerate(plan.predicted.dp_method_options) if o.chosen]
    return Table(
        headers=[
            "",
            "axis",
            "method",
            "mathematics",
            "predicted step time",
            "vs chosen",
            "bytes per step per rank",
            "peak memory",
            "status",
        ],
        rows=rows,
        highlight_row=chosen[0] if len(chosen) == 1 else -1,
        caption="The chosen plan (same stages and recompute) re-priced with each method",
    )


def caveats(plan: Plan) -> list[str]:
    """One plain sentence per approximate method, chosen or priced, in table order."""
    seen: dict[tuple[str, str], bool] = {}
    options = plan.prediction.dp_method_options if plan.prediction is not None else []
    for axis, name, chosen in [(o.axis, o.name, o.chosen) for o in options] + [
        (a, c.name, True) for a, c in plan.dp_methods.items()
    ]:
        if not dp_methods.method(axis, name).exact:
            seen[(axis, name)] = seen.get((axis, name), False) or chosen
    out = []
    for (axis, name), chosen in seen.items():
        row = dp_methods.method(axis, name)
        out.append(
            f"{row.label} ({'chosen' if chosen else 'allowed'}) is approximate: it changes the training "
            "mathematics, so check convergence (the loss curve against the exact method) before relying "
            f"on it. What it does: {row.summary}."
        )
    return out


def methods_paragraph(plan: Plan) -> str:
    chosen = "; ".join(f"{a}={method_text(c.name, c.params)}" for a, c in plan.dp_methods.non_default())
    text = f"This plan's data-parallel methods: {chosen or PLAIN_DP}."
    if plan.prediction is not None:
        text += f" Predicted bytes per step per rank: {bytes_text(plan.prediction.comm_bytes_per_step)}."
        text += band_text(plan)
    return text


def band_text(plan: Plan) -> str:
    """Accordion's band (Prediction.comm_bytes_band) and where the expected value sits in it."""
    band = plan.prediction.comm_bytes_band if plan.prediction is not None else {}
    if not band:
        return ""
    spans = ", ".join(f"{axis} {fmt.nbytes(lo)} .. {fmt.nbytes(hi)}" for axis, (lo, hi) in band.items())
    f = plan.dp_methods.compression.params.get("critical_fraction")
    where = (
        f"at the set share {f:g} of steps at the low-compression setting"
        if f is not None
        else "at the band's top (no share set: every step at the low-compression setting, as a run "
        "shorter than its first windows is; set critical_fraction to the share a run's notes report)"
    )
    return (
        f" The bytes vary between steps: from every step at the high-compression setting to every "
        f"step at the low-compression one they span {spans} per step per rank; the expected value is {where}."
    )


def measured_items(plan: Plan, run: RunResult) -> list:
    predicted = plan.prediction.comm_bytes_per_step if plan.prediction is not None else {}
    measured = getattr(run, "comm_bytes_per_step", None) or {}
    if not measured:
        return [
            "The run recorded no data-parallel bytes per step (comm_bytes_per_step) to compare with."
            if predicted
            else "Neither the prediction nor the run has data-parallel traffic."
        ]
    band = plan.prediction.comm_bytes_band if plan.prediction is not None else {}
    rows = []
    for axis in _axes(predicted, measured):
        p, m = predicted.get(axis), measured.get(axis)
        row = [
            axis,
            fmt.nbytes(p) if p is not None else "-",
            fmt.nbytes(m) if m is not None else "-",
            fmt.ratio(m / p) if p and m is not None else "-",
        ]
        if band:
            span = band.get(axis)
            if span is None:
                row.append("-")
            else:
                lo, hi = span
                inside = m is not None and lo <= m <= hi
                row.append(f"{fmt.nbytes(lo)} .. {fmt.nbytes(hi)}: {'inside' if inside else 'outside'}")
        rows.append(row)
    headers = ["mesh axis", "predicted", "measured", "measured / predicted"] + (["band"] if band else [])
    return [Table(headers=headers, rows=rows, caption="Data-parallel bytes per step and rank, predicted vs measured")]


def dp_methods_section(plan: Plan, run: RunResult | None = None) -> Section:
    items: list = [methods_paragraph(plan)]
    if plan.prediction is not None and plan.prediction.dp_method_options:
        items += [options_table(plan), BYTES_NOTE + ' "vs chosen" is the step time over the chosen plan\'s.']
        items += offload_items(plan, capacity_bytes(plan.prediction))  # the offload trade, if priced
    elif plan.prediction is not None:
        items.append(
            "No other method was priced: pin one (--compression, --sync, --comm-schedule, --offload, "
            "--waves) or allow approximate ones (--allow-compression, --allow-sync). " + BYTES_NOTE
        )
    items += caveats(plan)
    if run is not None:
        items += measured_items(plan, run)
    return Section(title="Data-parallel methods", anchor="dp-methods", items=items)
