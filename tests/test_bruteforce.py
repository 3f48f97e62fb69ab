"""meshplan.planner.bruteforce: its exact space size is the number of plans it visits, and its
CPU-time cap stops it and says so. (Its optimum equals search()'s: test_planner_search.py.)"""

from __future__ import annotations

import math

from planner_profiles import cluster, cnn_chain, small_gpt, small_llama

from meshplan.planner import PlanRequest
from meshplan.planner.search.bruteforce import brute_force, compositions, space_size

PINNED = dict(pp=2, tp=1, dp=2, microbatch=2, schedule="1F1B", zero=1, sequence_parallel=False)


def test_count_by_hand_on_one_candidate():
    """gpt with 2 blocks: embed, 2 blocks, head. One candidate (pp=2): C(3, 1) = 3 splits; embed
    and head have 1 recompute mode, a GPT block 3 (none, selective, full): 3 x 9 = 27 plans."""
    request = PlanRequest(num_gpus=4, global_batch=8, **PINNED)
    assert space_size(small_gpt(2), cluster(4, 80.0), request) == 27
    result = brute_force(small_gpt(2), cluster(4, 80.0), request)
    assert result.finished and result.num_evaluated == 27 and len(result.per_candidate) == 1


def test_count_equals_plans_visited():
    """Over whole spaces (every candidate: interleaved, GPipe, pp up to the layer count; a chain
    with 1- and 2-mode layers) the closed-form count equals what the enumeration visits."""
    cases = [
        (small_gpt(3), 4, dict(global_batch=8, zero=1, tp=1)),
        (small_llama(2), 8, dict(global_batch=8, zero=0, microbatch=1)),
        (cnn_chain(), 4, dict(global_batch=8, zero=0)),
    ]
    for profile, n, pins in cases:
        request = PlanRequest(num_gpus=n, **pins)
        result = brute_force(profile, cluster(n, 80.0), request)
        assert result.finished
        assert result.num_evaluated == result.num_plans == space_size(profile, cluster(n, 80.0), request)
        assert result.num_plans > 100 and result.best_step_s < math.inf


def test_compositions_are_every_contiguous_split():
    splits = [[list(r) for r in s] for s in compositions(5, 3)]
    assert len(splits) == math.comb(4, 2) and splits[0] == [[0], [1], [2, 3, 4]]
    assert all(sum(s, []) == list(range(5)) and all(s) for s in splits)


def test_cap_stops_and_reports_not_finished():
    request = PlanRequest(num_gpus=8, global_batch=8, zero=0)  # about 1e6 plans: seconds uncapped
    result = brute_force(small_gpt(6), cluster(8, 10.0), request, cap_s=0.0)
    assert not result.finished
    assert 0 < result.num_evaluated < result.num_plans == space_size(small_gpt(6), cluster(8, 10.0), request)
    assert result.seconds_per_plan > 0 and result.estimate_s() > result.time_s * 10


def test_space_size_is_exact_beyond_floats():
    """Llama-3 405B's shape at 16384 GPUs: an integer far beyond 1e53, exact, never enumerated."""
    from meshplan.models.analytic import LLAMA3_405B, llama_profile
    from meshplan.presets import cluster_preset

    size = space_size(
        llama_profile(**LLAMA3_405B), cluster_preset("h100-80g", 16384), PlanRequest(num_gpus=16384, global_batch=2048)
    )
    # 126 blocks with 2 recompute modes each (at seq 8192 selective saves what none saves: dropped)
    assert isinstance(size, int) and size > 2**126 * 1000 and size % 2**126 == 0
