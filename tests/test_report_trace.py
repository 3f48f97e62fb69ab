"""`meshplan report --trace`: the predicted step as a Chrome/Perfetto trace, checked against the
Trace Event Format strictly (the fields each phase needs, slices that nest on every thread, flow
arrows that start and end on slices), and against the plan (one track per pipeline rank, one
slice per forward and backward of each microbatch through each chunk)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest
from report_fixtures import gpt_plan

from meshplan.cli import main
from meshplan.report.timeline import simulate
from meshplan.report.trace import chrome_trace, trace_json
from meshplan.schema import save

PHASES = {"X": {"name", "ts", "dur", "pid", "tid"}, "M": {"name", "pid", "args"}, "s": {"id", "ts", "pid", "tid"}}
PHASES["f"] = PHASES["s"]
METADATA = {"process_name", "process_sort_index", "thread_name"}


def check_trace_events(trace: dict) -> list[dict]:
    """The JSON Object Format of the Trace Event Format, strictly: returns the complete events."""
    assert set(trace) >= {"traceEvents"} and trace.get("displayTimeUnit") in ("ms", "ns")
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    flows: dict[int, list[dict]] = defaultdict(list)
    for e in trace["traceEvents"]:
        assert e["ph"] in PHASES, e
        assert PHASES[e["ph"]] <= set(e), e
        assert all(isinstance(e[k], int) for k in ("pid", "tid") if k in e), e
        if e["ph"] == "M":
            assert e["name"] in METADATA, e
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0 and e["dur"] >= 0, e
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        if e["ph"] in "sf":
            flows[e["id"]].append(e)
    for track, spans in slices.items():  # complete events on one thread must nest, never straddle
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start + 1e-6:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, (
                f"slices straddle on {track}: ends {stack[-1]} vs {start}-{end}"
            )
            stack.append(end)
    for fid, pair in flows.items():  # each arrow: one start and one finish, each inside a slice of its thread
        assert sorted(e["ph"] for e in pair) == ["f", "s"], fid
        for e in pair:
            assert any(a - 1e-6 <= e["ts"] <= b + 1e-6 for a, b in slices[(e["pid"], e["tid"])]), e
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


@pytest.mark.parametrize("pp, v, m", [(1, 1, 4), (4, 1, 8), (4, 2, 8)])
def test_the_trace_is_valid_and_has_a_slice_per_forward_and_backward(pp, v, m):
    plan = gpt_plan(pp=pp, num_microbatches=m, virtual=v, schedule="Interleaved1F1B" if v > 1 else "1F1B")
    trace = json.loads(trace_json(plan))
    assert trace == chrome_trace(plan)  # plain JSON, no NaN
    slices = check_trace_events(trace)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert sorted(names) == list(range(pp))  # one track (process) per pipeline rank
    per_rank = Counter((e["pid"], e["cat"]) for e in slices)
    for r in range(pp):
        assert per_rank[(r, "forward")] == per_rank[(r, "backward")] == m * v
    transfers = [e for e in slices if e["cat"] == "communication" and e["name"].startswith("recv")]
    assert len(transfers) == (2 * (pp * v - 1) * m if pp > 1 else 0)  # every stage boundary, both ways
    end = max(e["ts"] + e["dur"] for e in slices) / 1e6
    assert end == pytest.approx(simulate(plan).makespan_s, rel=1e-6)


def test_report_trace_writes_the_file(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    save(gpt_plan(pp=2, num_microbatches=4), plan)
    assert main(["report", str(plan), "-o", str(tmp_path / "r"), "--trace", str(tmp_path / "t.json")]) == 0
    check_trace_events(json.loads((tmp_path / "t.json").read_text()))
    assert main(["report", str(plan), "-o", str(tmp_path / "r"), "--trace", str(plan)]) == 2  # never over an input
