"""search() is exact under the cost model: it agrees with brute force over every plan (every
stage boundary and every per-layer recompute choice) on small spaces, for several models."""

from __future__ import annotations

import math

import pytest
from planner_profiles import brute_force_best, cluster, cnn_chain, small_gpt, small_llama

from meshplan.errors import InfeasibleError
from meshplan.planner import PlanRequest
from meshplan.planner.context import Context
from meshplan.planner.rank.layer_cost import CostTable
from meshplan.planner.search import search
from meshplan.planner.search.partition import solve
from meshplan.schema import to_dict

CASES = [
    ("gpt 8 GPUs, tight memory", small_gpt(6), 8, 10.0, dict(global_batch=8, zero=0)),
    ("gpt 4 GPUs, interleaved + GPipe", small_gpt(6), 4, 10.0, dict(global_batch=8, tp=1, zero=1)),
    ("llama 16 GPUs", small_llama(4), 16, 10.0, dict(global_batch=32, sequence_parallel=True, zero=2)),
    (
        "gpt 12 layers 8 GPUs, pinned selective",
        small_gpt(10),
        8,
        14.0,
        dict(global_batch=16, recompute="selective", zero=1, sequence_parallel=False),
    ),
    (
        "gpt 8 GPUs, tight memory, one recompute mode on every block",
        small_gpt(6),
        8,
        10.0,
        dict(global_batch=8, zero=0, recompute_assignments="uniform"),
    ),
    (
        "llama 16 GPUs, one recompute mode on every block",
        small_llama(4),
        16,
        10.0,
        dict(global_batch=32, sequence_parallel=True, zero=2, recompute_assignments="uniform"),
    ),
    ("cnn chain 4 GPUs", cnn_chain(), 4, 6.0, dict(global_batch=32, zero=3)),
    ("cnn chain 8 GPUs, any zero", cnn_chain(), 8, 4.0, dict(global_batch=16)),
]


@pytest.mark.parametrize("name,profile,n,mem_gib,pins", CASES, ids=[c[0] for c in CASES])
def test_search_equals_brute_force(name, profile, n, mem_gib, pins):
    spec = cluster(n, mem_gib)
    request = PlanRequest(num_gpus=n, top_k=3, **pins)
    ctx = Context.build(profile, spec, request)
    table = CostTable(ctx)
    brute, per_candidate = brute_force_best(profile, spec, request)
    assert brute < math.inf, "the case must have a feasible plan"
    assert any(v == math.inf for v in per_candidate.values()), "memory should bind for some candidates"
    for cand, expected in per_candidate.items():  # every candidate's exact optimum
        sols, _, _ = solve(ctx, cand, table.for_candidate(cand))
        got = max(s.cost_s for s in sols) if sols else math.inf
        assert got == pytest.approx(expected, rel=1e-9), cand.label()
    plan = search(profile, spec, request)
    plan.validate()
    assert plan.prediction.step_time_s == pytest.approx(brute, rel=1e-9)


def test_brute_force_takes_the_offload_fallback_as_the_search_does():
    """4 blocks on 4 x 3.5 GiB: no plan of the space fits on the device, so the search falls back to offload=cpu
    (search/offload_search.py); the brute force visits the space again under it and finds the same
    optimum. With 1 GiB of host memory the fallback's best plan overflows the host: neither plans."""
    import dataclasses

    from meshplan.planner.search.bruteforce import brute_force

    spec, profile = cluster(4, 3.5), small_gpt(4)
    request = PlanRequest(num_gpus=4, global_batch=8, tp=1)
    assert brute_force(profile, spec, request).best_step_s == math.inf  # nothing fits without offload
    plan = search(profile, spec, request)
    assert plan.dp_methods.offload.name == "cpu"
    brute, per_candidate = brute_force_best(profile, spec, request)
    assert plan.prediction.step_time_s == pytest.approx(brute, rel=1e-9)
    assert any(v == math.inf for v in per_candidate.values())
    small_host = dataclasses.replace(spec, host_memory_bytes=2**30)
    with pytest.raises(InfeasibleError, match="host memory"):
        search(profile, small_host, request)
    assert brute_force_best(profile, small_host, request)[0] == math.inf


def test_recompute_choice_matters_in_gpt_case():
    """In the tight GPT case the optimum mixes recompute modes (so the solver was exercised)."""
    plan = search(
        small_gpt(6),
        cluster(8, 30.0),
        PlanRequest(num_gpus=8, global_batch=32, zero=0, microbatch=4, tp=1, pp=2, schedule="1F1B"),
    )
    assert set(plan.recompute.values()) - {"none"}, plan.recompute


def test_plan_contents_and_pins():
    profile = small_gpt(6)
    plan = search(profile, cluster(8, 30.0), PlanRequest(num_gpus=8, global_batch=16, tp=2, microbatch=2, top_k=4))
    assert plan.tensor_parallel_degree == 2 and plan.microbatch_size == 2
    assert plan.layers == profile.layer_names and [f for s in plan.stages for f in s] == plan.layers
    assert set(plan.recompute) == set(plan.layers)
    assert plan.global_batch_size == plan.microbatch_size * plan.num_microbatches * plan.data_parallel_degree
    assert plan.provenance.profile_hash and plan.provenance.meshplan_version
    s = plan.search
    assert s.num_candidates >= s.num_evaluated >= 1 and s.search_time_s > 0
    steps = [plan.prediction.step_time_s] + [a.prediction.step_time_s for a in s.alternatives]
    assert steps == sorted(steps) and len(steps) == 4
    assert all(a.search is None and a.prediction for a in s.alternatives)
    reasons = " | ".join(r.reason for r in s.rejected)
    assert "tp=" not in reasons or "not divisible" in reasons or "GPUs per node" in reasons or "dp" in reasons


def test_rejections_name_numbers():
    plan = search(small_gpt(6), cluster(8, 10.0), PlanRequest(num_gpus=8, global_batch=4, top_k=1))
    reasons = [r.reason for r in plan.search.rejected]
    assert any("OOM by" in r and "GiB" in r for r in reasons)
    assert any("not divisible by dp=8" in r for r in reasons)


def test_deterministic():
    args = (small_gpt(6), cluster(8, 30.0), PlanRequest(num_gpus=8, global_batch=16))
    a, b = search(*args), search(*args)
    a.search.search_time_s = b.search.search_time_s = 0.0
    assert to_dict(a) == to_dict(b)


def test_infeasible_says_what_fits():
    with pytest.raises(InfeasibleError) as err:
        search(small_gpt(6), cluster(2, 2.0), PlanRequest(num_gpus=2, global_batch=8))
    msg = str(err.value)
    assert "\n" not in msg and "OOM by" in msg and "--num-gpus" in msg


def test_infeasible_pin_suggests_unpinning():
    with pytest.raises(InfeasibleError, match="unpinning --microbatch, --recompute fits"):
        search(small_gpt(6), cluster(8, 10.0), PlanRequest(num_gpus=8, global_batch=64, microbatch=8, recompute="none"))


def test_breakdown_sums_to_step_time_and_round_trips():
    from meshplan.plan import Plan
    from meshplan.schema import from_dict

    plan = search(small_llama(4), cluster(16, 20.0), PlanRequest(num_gpus=16, global_batch=32, top_k=3))
    for p in [plan] + plan.search.alternatives:
        assert sum(p.prediction.breakdown.values()) == pytest.approx(p.prediction.step_time_s, rel=1e-9)
        assert from_dict(Plan, to_dict(p)).prediction.step_time_s == p.prediction.step_time_s


def test_interleaved_stages_follow_loop_placement():
    plan = search(
        small_gpt(6),
        cluster(4, 40.0),
        PlanRequest(num_gpus=4, global_batch=8, tp=1, pp=2, dp=2, schedule="Interleaved1F1B", virtual_stages=2),
    )
    assert len(plan.stages) == 4 and plan.stages[0][0] == "embed" and plan.stages[-1][-1] == "head"
    assert plan.stage_ranks() == [0, 1, 0, 1]


def test_uniform_stages_split_evenly():
    plan = search(
        gpt_profile_24(),
        cluster(8, 40.0),
        PlanRequest(num_gpus=8, global_batch=32, pp=4, tp=2, uniform_stages=True, schedule="1F1B"),
    )
    assert [sum(f.startswith("layers.") for f in s) for s in plan.stages] == [6, 6, 6, 6]


def test_seq_override_is_planned_and_recorded():
    plan = search(small_gpt(6), cluster(8, 40.0), PlanRequest(num_gpus=8, global_batch=8, seq=4096))
    assert plan.seq_len == 4096 and plan.model_config["seq"] == 4096
    pins = dict(num_gpus=8, global_batch=8, tp=1, pp=1, dp=8, microbatch=1)
    long = search(small_gpt(6), cluster(8, 40.0), PlanRequest(seq=4096, **pins))
    base = search(small_gpt(6), cluster(8, 40.0), PlanRequest(**pins))
    # twice the tokens per sample, and attention's s^2 makes each token dearer: compute more than doubles
    # (tokens/s is not compared: the once-per-step gradient sync is spread over twice the tokens)
    assert long.prediction.breakdown["compute"] > 2 * base.prediction.breakdown["compute"]


def gpt_profile_24():
    from meshplan.models.analytic import gpt_profile

    return gpt_profile(layers=24, hidden=2048, heads=16)


def test_plan_json_has_the_cli_keys():
    import json

    from meshplan.views import plan_view

    out = plan_view(search(small_gpt(6), cluster(8, 40.0), PlanRequest(num_gpus=8, global_batch=16, top_k=3)))
    for key in (
        "step_time_s",
        "model_tflops_per_gpu",
        "hardware_tflops_per_gpu",
        "mfu",
        "hfu",
        "tokens_per_s_per_gpu",
        "peak_memory_bytes",
        "breakdown",
        "degrees",
        "microbatch",
        "schedule",
        "stages",
        "recompute",
        "alternatives",
        "search_time_s",
        "num_evaluated",
        "num_rejected",
    ):
        assert key in out, key
    assert len(out["alternatives"]) == 2 and "alternatives" not in out["alternatives"][0]
    json.dumps(out)


def test_planner_never_imports_torch():
    import subprocess
    import sys

    code = (
        "import sys, meshplan.planner, meshplan.validation.published, meshplan.validation.orderings; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B", "Interleaved1F1B"])
def test_chosen_plans_fit_memory(schedule):
    plan = search(small_gpt(6), cluster(8, 12.0), PlanRequest(num_gpus=8, global_batch=32, schedule=schedule, top_k=4))
    for p in [plan] + plan.search.alternatives:
        assert p.prediction.peak_memory_bytes <= p.prediction.stage_memory[0].capacity_bytes * (1 + 1e-9)
        assert not p.prediction.binding_constraint.startswith("OOM")


def test_lost_families_say_by_how_much():
    plan = search(small_gpt(6), cluster(8, 40.0), PlanRequest(num_gpus=8, global_batch=16, top_k=2))
    lost = [r for r in plan.search.rejected if r.reason.startswith("slower")]

    def family(p):
        r, s = p.data_parallel_replicate_degree, p.data_parallel_shard_degree
        dp = f"dp={r}x{s}" if r > 1 and s > 1 else f"dp={r * s}"
        return f"pp={p.pipeline_parallel_degree} {dp} cp=1 tp={p.tensor_parallel_degree}"

    chosen = {family(p) for p in [plan] + plan.search.alternatives}
    assert lost and all(r.family not in chosen and "%" in r.reason for r in lost)
    assert plan.search.num_rejected == sum(r.count for r in plan.search.rejected if not r.reason.startswith("slower"))


@pytest.mark.parametrize("axis,name", [("compression", "qsgd"), ("compression", "topk"), ("compression", "alq")])
def test_every_alternative_is_priced_as_its_own_pinned_search(axis, name):
    """The layer-cost memo (Candidate.cost_key) shares costs only between candidates that would
    compute them alike: an all-gather compressor's codec work and state grow with the replica
    group, so pp=2 (8 replicas) must not reuse pp=1's (16) layer costs. Each alternative of one
    search equals a search pinned to its pipeline degree (it did not: qsgd's pp=4 was 26% off)."""
    from meshplan.dp_methods import parse_spec
    from meshplan.models.analytic import gpt_profile

    prof = gpt_profile(layers=8, hidden=1024, heads=16, vocab=32000, seq=1024)
    pins = dict(num_gpus=16, global_batch=64, tp=1, cp=1, zero=0, microbatch=1, recompute="none")
    pins |= dict(schedule="1F1B", sequence_parallel=False, methods={axis: parse_spec(axis, name, f"--{axis}")})
    plan = search(prof, cluster(16, 80.0), PlanRequest(top_k=10, **pins))
    plans = [plan, *plan.search.alternatives]
    assert len({p.pipeline_parallel_degree for p in plans}) >= 3
    for alt in plans:
        alone = search(prof, cluster(16, 80.0), PlanRequest(top_k=1, pp=alt.pipeline_parallel_degree, **pins))
        assert alt.prediction.step_time_s == pytest.approx(alone.prediction.step_time_s, rel=1e-9)
        assert alt.prediction.peak_memory_bytes == pytest.approx(alone.prediction.peak_memory_bytes, rel=1e-9)


METHOD_CASES = [CASES[0], ("cnn chain 4 GPUs, ZeRO-0", cnn_chain(), 4, 6.0, dict(global_batch=32, zero=0))]


@pytest.mark.parametrize("name,profile,n,mem_gib,pins", METHOD_CASES, ids=[c[0] for c in METHOD_CASES])
def test_allowed_methods_stay_exact_against_brute_force(name, profile, n, mem_gib, pins):
    """With approximate methods allowed (--allow-compression, --allow-sync) the search re-prices its
    default-method split per method (planner/search/method_choice.py); brute force re-solves every split and
    recompute assignment for every candidate x method. On these spaces (one of them memory-bound)
    both find the same optimum."""
    from meshplan.planner.search import tuning
    from meshplan.planner.search.bruteforce import brute_force_candidate
    from meshplan.planner.search.enumerate import Rejects, candidates
    from meshplan.planner.search.method_choice import alternatives

    allow = {"compression": ("qsgd", "topk", "powersgd", "fp16"), "sync": ("local-sgd", "gossip", "dabmd")}
    req = PlanRequest(num_gpus=n, top_k=1, allow=allow, **pins)
    got = search(profile, cluster(n, mem_gib), req).prediction.step_time_s
    ctx = Context.build(profile, cluster(n, mem_gib), req)
    table = CostTable(ctx)
    best = min(
        brute_force_candidate(ctx, c, table)
        for cand in candidates(ctx, Rejects())
        for c in (cand, *tuning.searched(ctx, table, cand), *alternatives(ctx, cand))
    )
    assert got == pytest.approx(best, rel=1e-9)


def test_one_recompute_mode_on_every_block_when_the_runtime_runs_only_that():
    """torchtitan runs one activation-checkpointing mode on every block: under recompute_assignments "uniform" the
    plan's blocks share one mode (none elsewhere), and it is never faster than the per-layer search, which
    meshplan's own executor keeps."""
    spec, profile = cluster(8, 30.0), small_gpt(6)
    pins = dict(num_gpus=8, global_batch=32, zero=0, microbatch=4, tp=1, pp=2, schedule="1F1B")
    per_layer = search(profile, spec, PlanRequest(**pins))
    uniform = search(profile, spec, PlanRequest(**pins, recompute_assignments="uniform"))
    blocks = {mode for fqn, mode in uniform.recompute.items() if fqn.startswith("layers.")}
    assert len(blocks) == 1 and all(m == "none" for f, m in uniform.recompute.items() if not f.startswith("layers."))
    assert len({m for f, m in per_layer.recompute.items() if f.startswith("layers.")}) > 1  # the case is mixed
    assert uniform.prediction.step_time_s > per_layer.prediction.step_time_s
