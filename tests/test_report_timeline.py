"""The pipeline timeline replay: schedule orders, dependencies, bubbles (Narayanan et al. 2021)."""

from __future__ import annotations

import dataclasses

import pytest
from report_fixtures import gpt_plan

from meshplan.report.timeline import Timeline, _replay, rank_order, simulate
from meshplan.report.timeline_svg import MAX_EXACT_BLOCKS, timeline_svg


def replay(schedule: str, pp: int, m: int, v: int = 1, hop_s: float = 0.0) -> Timeline:
    tl = Timeline(
        num_ranks=pp,
        num_microbatches=m,
        virtual_stages=v,
        schedule=schedule,
        forward_s=[1.0 / v] * pp,
        backward_s=[2.0 / v] * pp,
        hop_s=hop_s,
    )
    _replay(tl, [rank_order(schedule, r, pp, m, v) for r in range(pp)])
    return tl


CASES = [
    ("GPipe", 4, 8, 1),
    ("1F1B", 4, 8, 1),
    ("1F1B", 8, 16, 1),
    ("Interleaved1F1B", 4, 8, 2),
    ("Interleaved1F1B", 4, 12, 3),
    ("Interleaved1F1B", 4, 6, 2),
    ("LoopedBFS", 4, 8, 2),
    ("Interleaved1F1B", 2, 5, 2),
]


@pytest.mark.parametrize("schedule,pp,m,v", CASES)
def test_bubble_matches_closed_form(schedule, pp, m, v):
    # equal stages, free p2p: bubble time (p-1)/(v m) of the ideal (Narayanan et al. 2021, Sec. 2.2)
    tl = replay(schedule, pp, m, v)
    ideal_s = 3.0 * m
    assert tl.compute_end_s() == pytest.approx(ideal_s * (1 + (pp - 1) / (v * m)))
    assert tl.bubble_fraction() == pytest.approx((pp - 1) / (v * m + pp - 1))


@pytest.mark.parametrize("schedule,pp,m,v", CASES)
def test_every_action_once_no_overlap_dependencies_hold(schedule, pp, m, v):
    tl = replay(schedule, pp, m, v, hop_s=0.1)
    compute = [b for b in tl.blocks if b.kind in ("F", "B")]
    assert len(compute) == 2 * pp * v * m
    assert len({(b.kind, b.chunk * pp + b.rank, b.microbatch) for b in compute}) == len(compute)
    by_key = {(b.kind, b.chunk * pp + b.rank, b.microbatch): b for b in compute}
    last = pp * v - 1
    for (kind, stage, mb), b in by_key.items():
        if kind == "F" and stage > 0:
            assert b.start_s >= by_key[("F", stage - 1, mb)].end_s + 0.1 - 1e-9
        if kind == "B":
            dep = by_key[("F", stage, mb)] if stage == last else by_key[("B", stage + 1, mb)]
            assert b.start_s >= dep.end_s + (0.1 if dep.rank != b.rank else 0.0) - 1e-9
    for r in range(pp):
        mine = sorted((b for b in compute if b.rank == r), key=lambda b: b.start_s)
        assert all(a.end_s <= b.start_s + 1e-9 for a, b in zip(mine, mine[1:]))


def in_flight_max(tl: Timeline, rank: int) -> int:
    """Most microbatches whose forward finished but backward has not started, on one rank."""
    events = sorted(
        ((b.end_s if b.kind == "F" else b.start_s), b.kind != "F")  # F ends first on ties
        for b in tl.blocks
        if b.rank == rank and b.kind in ("F", "B")
    )
    live = peak = 0
    for _, is_bwd in events:
        is_fwd = not is_bwd
        live += 1 if is_fwd else -1
        peak = max(peak, live)
    return peak


def test_1f1b_limits_in_flight_microbatches_and_gpipe_does_not():
    # 1F1B: stage r holds at most p - r microbatches (Narayanan et al. 2021 Sec. 2.2.1); GPipe holds all m
    pp, m = 4, 8
    f1b, gpipe = replay("1F1B", pp, m), replay("GPipe", pp, m)
    assert [in_flight_max(f1b, r) for r in range(pp)] == [pp - r for r in range(pp)]
    assert [in_flight_max(gpipe, r) for r in range(pp)] == [m] * pp


def test_hops_lengthen_the_step():
    assert replay("1F1B", 4, 8, hop_s=0.5).makespan_s > replay("1F1B", 4, 8).makespan_s + 2 * 3 * 0.5 - 1e-9


def test_simulate_plan_adds_dp_and_optimizer_after_the_last_backward():
    plan = gpt_plan(pp=4, num_microbatches=8)
    tl = simulate(plan)
    br = plan.prediction.breakdown
    for r in range(4):
        last_b = max(b.end_s for b in tl.blocks if b.rank == r and b.kind == "B")
        dp = [b for b in tl.blocks if b.rank == r and b.kind == "DP"]
        opt = [b for b in tl.blocks if b.rank == r and b.kind == "OPT"]
        assert dp[0].start_s == pytest.approx(last_b) and dp[0].end_s - dp[0].start_s == pytest.approx(br["dp_comm"])
        assert opt[0].start_s == pytest.approx(dp[0].end_s)
    # the slower later stages (fixture: +5% per stage) set the pace: rank 3's forward is the longest
    assert tl.forward_s[3] > tl.forward_s[0]
    # forward:backward = 1:2 plus the recompute share on the backward
    share = br["recompute"] / (br["compute"] + br["recompute"])
    assert tl.backward_s[0] / tl.forward_s[0] == pytest.approx((3 - (1 - share)) / (1 - share))


def test_no_pipeline_is_a_sequence_of_microbatches():
    plan = gpt_plan(pp=1, dp_replicate=8, tp=2, num_microbatches=3)
    tl = simulate(plan)
    assert tl.bubble_fraction() == pytest.approx(0.0)
    assert [b.kind for b in tl.blocks if b.kind in "FB"] == ["F", "B"] * 3


def test_large_schedules_are_drawn_at_screen_resolution_and_stay_small():
    plan = gpt_plan(
        pp=16, dp_replicate=1, tp=1, num_microbatches=192, micro=1, blocks=96, schedule="Interleaved1F1B", virtual=2
    )
    tl = simulate(plan)
    assert len(tl.blocks) > MAX_EXACT_BLOCKS
    svg = timeline_svg(tl)
    assert "screen resolution" in svg and len(svg) < 120_000
    small = timeline_svg(simulate(dataclasses.replace(plan, pipeline_parallel_degree=16)))
    assert small == svg  # deterministic
