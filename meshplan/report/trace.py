"""The plan's predicted step as a Chrome/Perfetto trace (the JSON Trace Event Format): what
`meshplan report --trace trace.json` writes, for chrome://tracing or ui.perfetto.dev.

The step is the pipeline replay of meshplan/report/timeline.py with the predicted stage times.
Each pipeline rank is one process (one track group, "pipeline rank r"); its "compute" thread holds
one complete ("X") slice per forward and per backward of a microbatch through a chunk, then the
exposed data-parallel communication and the optimizer step; its "p2p" thread holds one slice per
boundary transfer it receives (activation or gradient), tied to its producer by a flow arrow. A
pipeline rank stands for every GPU of its stage (dp x cp x tp of them run the same schedule).
Times are microseconds from the start of the step, rounded to 1 ns, so the file is a pure
function of the plan.
"""

from __future__ import annotations

import json
from typing import Any

from meshplan.plan import Plan
from meshplan.report.timeline import Block, simulate

KIND = {"F": ("forward", "forward"), "B": ("backward", "backward"), "DP": ("dp_comm", "communication")}
KIND["OPT"] = ("optimizer", "optimizer")
COMPUTE_TID, P2P_TID = 0, 1


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _slice(b: Block, v: int) -> dict[str, Any]:
    name, cat = KIND[b.kind]
    args: dict[str, Any] = {}
    if b.kind in ("F", "B"):
        name = f"{b.kind} mb{b.microbatch}" + (f" chunk{b.chunk}" if v > 1 else "")
        args = {"microbatch": b.microbatch, "chunk": b.chunk}
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": _us(b.start_s),
        "dur": round(_us(b.end_s) - _us(b.start_s), 3),  # so that ts + dur is the rounded end
        "pid": b.rank,
        "tid": COMPUTE_TID,
        "args": args,
    }


def chrome_trace(plan: Plan) -> dict[str, Any]:
    """The trace as a JSON-able dict: {"traceEvents": [...], "displayTimeUnit": "ms", ...}."""
    tl = simulate(plan)
    pp, v = tl.num_ranks, tl.virtual_stages
    per_stage = plan.world_size // max(pp, 1)
    events: list[dict[str, Any]] = []
    for r in range(pp):
        meta = {"ph": "M", "pid": r, "ts": 0}
        label = f"pipeline rank {r} (stage {r}" + (f" and {pp * (v - 1)} more chunks" if v > 1 else "")
        events.append({**meta, "name": "process_name", "args": {"name": label + f"; {per_stage} GPUs)"}})
        events.append({**meta, "name": "process_sort_index", "args": {"sort_index": r}})
        events.append({**meta, "tid": COMPUTE_TID, "name": "thread_name", "args": {"name": "compute"}})
    blocks = sorted(tl.blocks, key=lambda b: (b.rank, b.start_s, b.end_s))
    events += [_slice(b, v) for b in blocks]
    lanes: dict[int, list[float]] = {r: [] for r in range(pp)}  # per rank: end of each p2p lane
    for i, (src, dst) in enumerate(sorted(tl.sends, key=lambda s: (s[1].rank, s[0].end_s, s[1].start_s))):
        what = "activation" if dst.kind == "F" else "gradient"
        start, dur = _us(src.end_s), _us(tl.hop_s)
        ends = lanes[dst.rank]
        lane = next((k for k, end in enumerate(ends) if end <= start), len(ends))
        if lane == len(ends):
            ends.append(0.0)
            name = "p2p" if lane == 0 else f"p2p {lane + 1}"
            events.append(
                {
                    "ph": "M",
                    "pid": dst.rank,
                    "ts": 0,
                    "tid": P2P_TID + lane,
                    "name": "thread_name",
                    "args": {"name": name},
                }
            )
        ends[lane] = start + dur
        events.append(
            {
                "name": f"recv {what} mb{dst.microbatch}",
                "cat": "communication",
                "ph": "X",
                "ts": start,
                "dur": dur,
                "pid": dst.rank,
                "tid": P2P_TID + lane,
                "args": {"from_rank": src.rank, "microbatch": dst.microbatch, "kind": what},
            }
        )
        # the arrow leaves inside the producing slice and lands on the transfer
        leave = max(_us(src.start_s), round(start - 0.001, 3))
        events.append(
            {
                "name": "p2p",
                "cat": "communication",
                "ph": "s",
                "id": i,
                "ts": leave,
                "pid": src.rank,
                "tid": COMPUTE_TID,
            }
        )
        events.append(
            {
                "name": "p2p",
                "cat": "communication",
                "ph": "f",
                "bp": "e",
                "id": i,
                "ts": start,
                "pid": dst.rank,
                "tid": P2P_TID + lane,
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "model": plan.model_name,
            "cluster": f"{plan.world_size} x {plan.cluster_name}",
            "schedule": tl.schedule,
            "pipeline_ranks": pp,
            "microbatches": tl.num_microbatches,
            "virtual_stages": v,
            "predicted_step_time_s": plan.prediction.step_time_s if plan.prediction else None,
            "what": "the predicted step replayed with the plan's stage times (meshplan report --trace)",
        },
    }


def trace_json(plan: Plan) -> str:
    return json.dumps(chrome_trace(plan), separators=(",", ":"), allow_nan=False) + "\n"
