"""The offload trade: the chosen plan re-priced with each state placement (offload
none / cpu / nvme, from Prediction.dp_method_options), as memory saved against time paid, with
the bytes each moves per step over host <-> device and to disk, and which of them fit.

Shown inside the "Data-parallel methods" section when the planner considered offload (it was
pinned, or chosen because nothing else fit: planner/offload_search.py); a plan that fits without
offload and does not pin it has no such rows."""

from __future__ import annotations

from meshplan.plan import MethodOption, Plan
from meshplan.report import fmt
from meshplan.report.document import Table

ORDER = ("none", "cpu", "nvme")
"""Rows in this order: device, host memory, disk."""
OFFLOAD_NOTE = (
    "Offload moves optimizer states off the device and pays for it per step: the host optimizer "
    "step (CPU Adam at the cluster's host memory bandwidth), gradients down and parameters up over "
    "host<->device, and for offload=nvme the states read and written on disk, partly hidden behind "
    "backward (planner/offload.py). The planner offloads only when nothing fits on the device."
)


def offload_options(plan: Plan) -> list[MethodOption]:
    """The offload rows of the prediction, none / cpu / nvme (empty when fewer than two)."""
    if plan.prediction is None:
        return []
    rows = [o for o in plan.prediction.dp_method_options if o.axis == "offload"]
    rows.sort(key=lambda o: (ORDER.index(o.name) if o.name in ORDER else len(ORDER), o.name))
    return rows if len(rows) >= 2 else []


def _fit(option: MethodOption, capacity: float) -> str:
    if option.feasible:
        return "fits"
    if option.step_time_s <= 0:
        return f"does not compose: {option.note or 'refused by meshplan/feasibility.py'}"
    return f"does not fit: {fmt.gib(option.peak_memory_bytes)}" + (f" > {fmt.gib(capacity)}" if capacity > 0 else "")


def _versus(option: MethodOption, base: MethodOption | None) -> tuple[str, str]:
    """(memory saved, time paid) against offload=none; "-" where either side is not priced."""
    if base is None or base.step_time_s <= 0 or option.step_time_s <= 0:
        return "-", "-"
    saved = base.peak_memory_bytes - option.peak_memory_bytes
    paid = option.step_time_s - base.step_time_s
    sign = "+" if paid >= 0 else "-"
    return (
        f"{fmt.gib(saved)} ({fmt.pct(saved / base.peak_memory_bytes)})" if base.peak_memory_bytes else "-",
        f"{sign}{fmt.seconds(abs(paid))} ({fmt.signed_pct(paid / base.step_time_s)})",
    )


def offload_rows(plan: Plan, capacity: float) -> list[list[str]]:
    options = offload_options(plan)
    base = next((o for o in options if o.name == "none"), None)
    rows = []
    for o in options:
        priced = o.step_time_s > 0
        saved, paid = _versus(o, base) if o is not base else ("-", "-")
        rows.append(
            [
                "chosen" if o.chosen else "",
                o.name,
                fmt.gib(o.peak_memory_bytes) if priced else "-",
                saved,
                fmt.seconds(o.step_time_s) if priced else "-",
                paid,
                fmt.nbytes(o.comm_bytes_per_step.get("host_device", 0)) if priced else "-",
                fmt.nbytes(o.comm_bytes_per_step.get("nvme", 0)) if priced else "-",
                _fit(o, capacity),
            ]
        )
    return rows


def offload_table(plan: Plan, capacity: float) -> Table | None:
    """The trade as a table, or None when the planner did not price offload on this plan."""
    rows = offload_rows(plan, capacity)
    if not rows:
        return None
    chosen = [i for i, row in enumerate(rows) if row[0] == "chosen"]
    return Table(
        headers=[
            "",
            "offload",
            "peak memory",
            "memory saved",
            "step time",
            "time paid",
            "host<->device bytes/step",
            "disk bytes/step",
            "status",
        ],
        rows=rows,
        highlight_row=chosen[0] if len(chosen) == 1 else -1,
        caption="Offload trade: the chosen plan with its optimizer states on the device, in host memory "
        "(offload=cpu) or on disk (offload=nvme); saved and paid are against offload=none",
    )


POLICY_NOTE = (
    " On ZeRO-2/3, offload=cpu is FSDP2's CPUOffloadPolicy: its copies (each shard up before a "
    "gather, the gradient shard down) are in its step time but not in its bytes, which count only "
    "what meshplan's own host optimizer moves."
)


def offload_items(plan: Plan, capacity: float) -> list:
    """[table, note] for the data-parallel methods section; [] when offload was not priced."""
    table = offload_table(plan, capacity)
    if table is None:
        return []
    return [table, OFFLOAD_NOTE + (POLICY_NOTE if plan.zero_stage >= 2 else "")]
