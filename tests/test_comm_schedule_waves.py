"""ByteScheduler's and Wavelet's cost models (planner/methods/comm_schedule.py, planner/rank/waves.py) on
hand-built problems whose answer is known: the fluid schedule's landing times worked out by hand,
the closed forms of stop-and-wait and a full window, DDP's rule where ByteScheduler must equal or
beat it, the two-wave memory peak of a two-layer wave, and the search choosing ByteScheduler
exactly where it is predicted faster (with chunk and credit the least-exposure pair of the set)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from planner_profiles import candidate

from meshplan import feasibility
from meshplan.model_profile import LayerProfile, ModelProfile, TPRule
from meshplan.models.analytic import gpt_profile
from meshplan.planner import PlanRequest
from meshplan.planner.context import Candidate, Context
from meshplan.planner.methods.comm_schedule import CHUNK_MB, CREDIT_CHUNKS, GLOO_THREADS, MIB, _simulate
from meshplan.planner.methods.waves import two_wave_peak
from meshplan.planner.rank.dp_cost import DataParallelCost
from meshplan.planner.rank.tail import last_bucket_params
from meshplan.planner.search import search
from meshplan.planner.search.estimate import estimate
from meshplan.presets import cluster_preset


def chain(params: list[int], flops: float = 1e12, act: float = 1e8) -> ModelProfile:
    """Layers of one fp32 tensor each (`params` elements), equal FLOPs and saved bytes."""
    layers = [
        LayerProfile(
            name=f"layers.{i}",
            kind=f"k{i}",
            num_params=n,
            param_bytes={"float32": 4 * n},
            param_shapes=[[n]],
            forward_flops=flops,
            backward_flops=2 * flops,
            activation_bytes=act,
            input_bytes=1e3,
            output_bytes=1e3,
            tp=TPRule(kind="none"),
        )
        for i, n in enumerate(params)
    ]
    return ModelProfile(
        model_name="chain",
        family="mlp",
        seq_len=1,
        num_params=sum(params),
        forward_flops_per_sample=len(params) * flops,
        num_layers=len(layers),
        layers=layers,
    )


def ddp_candidate(dp: int = 4, **methods) -> Candidate:
    cand = candidate(dp_replicate=dp)
    for axis, (name, params) in methods.items():
        cand = cand.with_method(axis, name, params)
    return cand


def context(profile: ModelProfile, overlap: bool = True, num_gpus: int = 4) -> Context:
    return Context.build(
        profile,
        cluster_preset("a100-80g", num_gpus),
        PlanRequest(num_gpus=num_gpus, global_batch=num_gpus, overlap_dp_comm=overlap),
    )


def syncs(ctx: Context, window_s: float, chunk_mb: float, credit_mb: float) -> tuple[float, float]:
    """(DDP's exposed sync, ByteScheduler's) of the whole model on one rank."""
    local = float(ctx.profile.num_params)
    last = last_bucket_params(ctx.layers[0].tp.kind, local)
    ddp = DataParallelCost(ctx, ddp_candidate()).sync_s(local, 4 * local, 0.0, window_s, last)
    bs = DataParallelCost(
        ctx, ddp_candidate(comm_schedule=("bytescheduler", {"chunk_mb": chunk_mb, "credit_mb": credit_mb}))
    )
    return ddp, bs.sync_s(local, 4 * local, 0.0, window_s, last)


# --- the fluid schedule ---------------------------------------------------------------------
def test_a_rounding_sliver_of_a_finished_layer_does_not_break_the_schedule():
    """Found through the CLI (a 24-layer GPT, cp 4 x tp 2 on 64 B200): chunk sizes that do not
    divide the layer bytes left a finished layer's sliver committed; the next step looked it up
    among the unfinished layers (KeyError). Every layer lands, after it is ready."""
    layers = [(436207616.0, 1664)] + [(201433088.0, 769)] * 24 + [(419446784.0, 1601)]
    ready = [
        0.026060086167990187,
        0.026060086167990187,
        0.025049445707181702,
        0.024038805246373217,
        0.02302816478556473,
        0.022017524324756246,
        0.02100688386394776,
        0.019996243403139276,
        0.01898560294233079,
        0.017974962481522305,
        0.01696432202071382,
        0.015953681559905335,
        0.014943041099096851,
        0.013932400638288368,
        0.012921760177479884,
        0.0119111197166714,
        0.010900479255862917,
        0.009889838795054434,
        0.00887919833424595,
        0.007868557873437466,
        0.006857917412628983,
        0.005847276951820499,
        0.004836636491012016,
        0.0038259960302035323,
        0.0028153555693950488,
        0.001804715108586565,
    ]
    landed = _simulate(layers, ready, 262144.0, 0.00252, 5.468749999999997e-12)
    assert all(math.isfinite(t) and t >= r for t, r in zip(landed, ready))


def test_credit_of_one_chunk_preempts_and_a_full_window_does_not():
    """Layer 1 (2 chunks of 1 B) ready at 0, layer 0 (2 chunks) at 1, 1 s per byte, no latency.
    Credit 1 B: layer 1's first chunk, then layer 0's two (lands at 3), then layer 1's last (4).
    Credit 4 B: everything committed as it is ready, first in first out: layer 1 at 2, layer 0 at 4."""
    layers, ready = [(2.0, 2), (2.0, 2)], [1.0, 0.0]
    assert _simulate(layers, ready, 1.0, 0.0, 1.0) == pytest.approx([3.0, 4.0])
    assert _simulate(layers, ready, 4.0, 0.0, 1.0) == pytest.approx([4.0, 2.0])


def test_latency_per_chunk_stop_and_wait_and_window():
    """All ready at once: stop-and-wait pays a per chunk (n a + beta B); a window of every chunk
    pipelines the latencies (beta B + a, the last chunk's latency only)."""
    layers, ready, a, beta = [(8.0, 4), (8.0, 4)], [0.0, 0.0], 0.5, 0.25
    assert max(_simulate(layers, ready, 2.0, a, beta)) == pytest.approx(8 * a + beta * 16)
    assert max(_simulate(layers, ready, 16.0, a, beta)) == pytest.approx(a + beta * 16)
    assert _simulate(layers, ready, 2.0, a, beta)[0] < _simulate(layers, ready, 2.0, a, beta)[1]  # priority


def test_without_overlap_exposure_is_every_chunk():
    """overlap_dp_comm off: nothing hides, stop-and-wait costs n all-reduces of one chunk."""
    ctx = context(chain([2**20] * 4), overlap=False)  # 4 MiB per layer
    cost = DataParallelCost(ctx, ddp_candidate(comm_schedule=("bytescheduler", {"chunk_mb": 1.0, "credit_mb": 1.0})))
    one = cost.schedule.latency_s + cost.schedule.beta_s * MIB
    agree = cost.schedule.latency_s  # the negotiation that agrees on the last gradients
    assert cost.schedule.exposed_s(1.0, 1.0, 1.0) == pytest.approx(16 * one + agree, rel=1e-9)


# --- against DDP's bucket rule ----------------------------------------------------------------
def test_single_chunk_equals_ddp():
    """One layer sent as one chunk: ready when backward ends, the forward waits for all of it,
    DDP's last bucket is the whole model: both expose one all-reduce of the model, ByteScheduler
    one negotiation latency more (its overhead: the round that agrees on the gradient)."""
    ctx = context(chain([2**20]))  # 4 MiB, one tensor
    cost = DataParallelCost(ctx, ddp_candidate(comm_schedule=("bytescheduler", {"chunk_mb": 16.0, "credit_mb": 16.0})))
    for window in (1e-6, 1e-3, 1.0):
        ddp, bs = syncs(ctx, window, 16.0, 16.0)
        assert bs == pytest.approx(ddp + cost.schedule.latency_s, rel=1e-12) and ddp > 0


def test_credit_beyond_total_bytes_is_at_most_ddps_last_bucket():
    """Comm hidden behind a long backward (DDP exposes its last bucket, here the whole small
    model's last 25 MiB): with every chunk in flight at once ByteScheduler exposes at most that."""
    ctx = context(chain([2**20] * 12))  # 12 layers of 4 MiB: 48 MiB
    total_mb = 4.0 * 12
    for chunk in (1.0, 4.0, 16.0):
        ddp, bs = syncs(ctx, 1.0, chunk, 2 * total_mb)
        assert 0 < bs <= ddp * (1 + 1e-12)


def test_priority_lets_the_forward_overlap():
    """A tight backward: ByteScheduler's best exposure is below DDP's (the next forward overlaps
    the chunks of its later layers)."""
    ctx = context(chain([2**22] * 8))  # 8 layers of 16 MiB
    cost = DataParallelCost(ctx, ddp_candidate(comm_schedule=("bytescheduler", {"chunk_mb": 4.0, "credit_mb": 16.0})))
    window = 2 * cost.schedule.beta_s * 8 * 2**24  # backward ~ twice the transfer
    best = cost.schedule.tuned(window)
    ddp, bs = syncs(ctx, window, best["chunk_mb"], best["credit_mb"])
    assert bs < ddp


def test_executor_waits_for_the_last_chunk_before_the_next_forward():
    """meshplan's executor steps the optimizer once every chunk has landed, so the next forward
    starts after the last one: the exposure charged is the last landing past the end of backward
    (8 layers of 16 MiB, backward half the transfer, so chunks remain when it ends). ByteScheduler's
    own per-layer start would expose less; the planner charges what the executor does."""
    from meshplan.planner.methods import comm_schedule

    ctx = context(chain([2**22] * 8))
    cost = DataParallelCost(ctx, ddp_candidate(comm_schedule=("bytescheduler", {"chunk_mb": 4.0, "credit_mb": 16.0})))
    sched = cost.schedule
    window = 0.5 * sched.beta_s * 8 * 2**24
    end = sched.hidden * window
    ready, t = [], end
    for share in sched.back_share:
        ready.append(t)
        t -= end * share
    landed = _simulate(sched.chunks(4.0), ready, 16.0 * MIB, sched.latency_s, sched.beta_s)
    waited = sched.exposed_s(4.0, 16.0, window, early_forward=False)
    assert waited == pytest.approx(max(landed) - end + sched.latency_s, rel=1e-12) and waited > 0
    assert sched.exposed_s(4.0, 16.0, window, early_forward=True) < waited
    assert not comm_schedule.EXECUTOR_EARLY_FORWARD and sched.exposed_s(4.0, 16.0, window) == waited


# --- the search ------------------------------------------------------------------------------
def small_gpt_plan(**request):
    profile = gpt_profile(layers=4, hidden=256, heads=4, seq=128, vocab=1024)
    return search(profile, cluster_preset("a100-80g", 4), PlanRequest(num_gpus=4, global_batch=16, **request))


def options(plan, axis: str) -> dict:
    return {o.name: o for o in plan.prediction.dp_method_options if o.axis == axis}


def test_search_picks_bytescheduler_where_faster_with_the_tuned_chunk_and_credit():
    """32 layers of 4 MiB on 8 A100s: DDP exposes its last 25 MiB bucket, ByteScheduler only the
    input-side layer's chunks, a gain larger than its negotiation overhead: it is chosen, at the
    (chunk, credit) of least exposure."""
    profile = chain([2**20] * 32, flops=1e12, act=1e6)
    request = PlanRequest(num_gpus=8, global_batch=8, zero=0, dp=8)
    plan = search(profile, cluster_preset("a100-80g", 8), request)
    assert plan.dp_methods.comm_schedule.name == "bytescheduler" and plan.zero_stage == 0
    rows = options(plan, "comm_schedule")
    assert rows["bytescheduler"].chosen and rows["bytescheduler"].step_time_s < rows["buckets"].step_time_s
    assert rows["bytescheduler"].step_time_s == pytest.approx(plan.prediction.step_time_s, rel=1e-12)
    assert rows["bytescheduler"].comm_bytes_per_step == rows["buckets"].comm_bytes_per_step  # same bytes
    assert rows["bytescheduler"].peak_memory_bytes < rows["buckets"].peak_memory_bytes  # no DDP bucket copy
    params = plan.dp_methods.comm_schedule.params
    assert params["chunk_mb"] in CHUNK_MB and params["credit_mb"] / params["chunk_mb"] in CREDIT_CHUNKS
    ctx = Context.build(profile, cluster_preset("a100-80g", 8), request)
    cand = ddp_candidate(8, comm_schedule=("bytescheduler", params))
    cand = dataclasses.replace(cand, microbatch=plan.microbatch_size, num_microbatches=plan.num_microbatches)
    from meshplan.planner.rank.layer_cost import CostTable

    window = sum(lc.backward_s for lc in CostTable(ctx).for_candidate(cand))
    sched = DataParallelCost(ctx, cand).schedule
    least = min(sched.exposed_s(c, c * k, window) for c in CHUNK_MB for k in CREDIT_CHUNKS)
    assert sched.exposed_s(params["chunk_mb"], params["credit_mb"], window) == least


def test_search_keeps_ddp_where_bytescheduler_gains_less_than_its_overhead():
    """A 4-layer GPT on 4 A100s: chunking would gain less than one negotiation latency: DDP stays."""
    assert small_gpt_plan().dp_methods.comm_schedule.name == "buckets"


def test_search_keeps_ddp_where_bytescheduler_is_not_faster():
    """One layer: ByteScheduler's best equals DDP (one chunk) or is slower: DDP stays."""
    profile = chain([2**20], flops=1e9, act=1e6)
    plan = search(profile, cluster_preset("a100-80g", 4), PlanRequest(num_gpus=4, global_batch=4, zero=0, dp=4))
    assert plan.dp_methods.comm_schedule.name == "buckets" and not plan.prediction.dp_method_options


def test_pinned_schedule_or_other_runtime_is_not_searched():
    assert (
        small_gpt_plan(methods={"comm_schedule": ("buckets", {"bucket_mb": 25})}).dp_methods.comm_schedule.name
        == "buckets"
    )
    assert small_gpt_plan(runtime="torchtitan").dp_methods.comm_schedule.name == "buckets"
    assert small_gpt_plan(zero=1).dp_methods.comm_schedule.name == "buckets"  # ZeRO-0 only


# --- Wavelet -----------------------------------------------------------------------------------
def test_two_wave_peak_known_answers():
    """Two layers of 1 B, forward 1 s and backward 2 s each (period 6 s): layer 0 is held all
    period by both waves (2), layer 1 over [1, 4) by the tick and [4, 7) by the tock, never both:
    peak 3, against 2 x 2 for two waves in step. One layer: no gain. No activations: 0."""
    assert two_wave_peak([1.0, 1.0], [1.0, 1.0], [2.0, 2.0]) == pytest.approx(3.0)
    assert two_wave_peak([1.0], [1.0], [2.0]) == pytest.approx(2.0)
    assert two_wave_peak([0.0] * 3, [1.0] * 3, [2.0] * 3) == 0.0
    many = two_wave_peak([1.0] * 8, [1.0] * 8, [2.0] * 8)
    assert 8 < many < 16  # between one wave's peak and two in step


def no_activations(profile: ModelProfile) -> ModelProfile:
    layers = [
        dataclasses.replace(
            lp, activation_bytes=0.0, selective_activation_bytes=0.0, tp_replicated_activation_bytes=0.0
        )
        for lp in profile.layers
    ]
    return dataclasses.replace(profile, layers=layers)


def estimated(profile: ModelProfile, waves: str, microbatch: int = 4):
    return estimate(
        profile,
        cluster_preset("a100-80g", 4),
        PlanRequest(
            num_gpus=4, global_batch=16, dp=4, tp=1, pp=1, zero=0, microbatch=microbatch, methods={"waves": (waves, {})}
        ),
    )


def test_wavelet_without_activations_holds_two_replicas_and_the_cross_wave_copies():
    """Each wave is a process with its own replica (weights, gradients, optimizer states, DDP's
    buckets); each holds CROSS_WAVE_HELD fp32 model copies between steps and one wave at a time
    CROSS_WAVE_TRANSIENT more while it averages (executor/waves.py)."""
    from meshplan.planner.rank.waves import CROSS_WAVE_HELD, CROSS_WAVE_TRANSIENT

    profile = no_activations(gpt_profile(layers=4, hidden=256, heads=4, seq=128, vocab=1024))
    one, two = estimated(profile, "1", microbatch=2), estimated(profile, "2")  # a wave runs b/2
    copies = (2 * CROSS_WAVE_HELD + CROSS_WAVE_TRANSIENT) * 4 * profile.num_params
    assert two.prediction.peak_memory_bytes == pytest.approx(2 * one.prediction.peak_memory_bytes + copies, rel=1e-9)


def test_wavelet_pays_a_second_optimizer_step_and_both_waves_averaging():
    """Without activations or compute differences, two waves cost one wave's step plus its
    optimizer step again plus two cross-wave averagings (memory passes and the model sent)."""
    from meshplan.planner.cost.comm import p2p_s
    from meshplan.planner.rank.waves import CROSS_WAVE_TRAFFIC_BYTES

    profile = gpt_profile(layers=4, hidden=256, heads=4, seq=128, vocab=1024)
    one, two = estimated(profile, "1"), estimated(profile, "2")
    assert two.prediction.breakdown["optimizer"] == pytest.approx(2 * one.prediction.breakdown["optimizer"], rel=1e-9)
    cluster = cluster_preset("a100-80g", 4)
    local = profile.num_params
    bandwidth = (cluster.host_memory_gbps or cluster.device.hbm_gbps) * 1e9
    cross = local * CROSS_WAVE_TRAFFIC_BYTES / bandwidth + p2p_s(cluster, 4 * local, "intra_node")
    assert two.prediction.breakdown["dp_comm"] >= 2 * cross > one.prediction.breakdown["dp_comm"]


def test_wavelet_interleaves_activations_and_runs_on_data_parallel_layouts_only():
    profile = gpt_profile(layers=8, hidden=256, heads=4, seq=512, vocab=1024)
    one, two = estimated(profile, "1"), estimated(profile, "2")
    act = lambda plan: plan.prediction.stage_memory[0].activations_bytes  # noqa: E731
    assert act(one) / 2 < act(two) < act(one)  # two half waves interleaved: below one full wave
    assert two.prediction.step_time_s > 0 and two.prediction.comm_bytes_per_step == one.prediction.comm_bytes_per_step
    rows = options(two, "waves")
    assert rows["2"].chosen and rows["2"].feasible and "not run by this executor" not in rows["2"].note
    assert rows["2"].step_time_s == pytest.approx(two.prediction.step_time_s, rel=1e-12)
    assert rows["1"].step_time_s == pytest.approx(one.prediction.step_time_s, rel=1e-12)
    dp_only = dataclasses.replace(candidate(dp_replicate=4, microbatch=4), methods=(("waves", "2", ()),)).layout(128)
    assert feasibility.reasons(dp_only) == []  # executor/waves.py runs it
    with_tp = dataclasses.replace(candidate(dp_replicate=2, tp=2, microbatch=4), methods=(("waves", "2", ()),)).layout(
        128
    )
    assert [(r.text, r.runnable_only) for r in feasibility.reasons(with_tp)] == [(feasibility.WAVES_NOT_RUN, True)]
    plan = small_gpt_plan(methods={"waves": ("2", {})}, microbatch=2)  # the search keeps data-parallel layouts
    assert plan.dp_methods.waves.name == "2" and plan.tensor_parallel_degree == plan.pipeline_parallel_degree == 1


def test_wavelet_refuses_an_odd_microbatch():
    with pytest.raises(Exception, match="even microbatch"):
        estimated(gpt_profile(layers=2, hidden=128, heads=2, seq=64, vocab=512), "2", microbatch=1)


@pytest.mark.parametrize("layers,mem_gib", [(2, 16.0), (2, 17.0), (3, 20.0)])
def test_search_equals_brute_force_with_bytescheduler(layers, mem_gib):
    """Where ByteScheduler wins, even by fitting without DDP's bucket copy (16 GiB: only with it,
    and with recompute), the search equals brute force over every recompute choice, microbatch and
    schedule (planner/search/bruteforce.py prices the tuned ByteScheduler of each candidate too).
    Pure data parallelism (pp 1): ByteScheduler replaces DDP's buckets there, while a pipeline,
    which splits the replicas' foreach AdamW step over its stages, wins the 3-layer model."""
    from planner_profiles import brute_force_best, cluster, small_gpt

    request = PlanRequest(num_gpus=4, global_batch=8, top_k=3, zero=0, tp=1, pp=1)
    brute, per_candidate = brute_force_best(small_gpt(layers), cluster(4, mem_gib), request)
    plan = search(small_gpt(layers), cluster(4, mem_gib), request)
    assert plan.dp_methods.comm_schedule.name == "bytescheduler"
    assert plan.prediction.step_time_s == pytest.approx(brute, rel=1e-9)
    assert any(c.method("comm_schedule")[0] == "bytescheduler" for c in per_candidate)


def test_on_cpu_devices_every_chunk_pays_its_fixed_cost_in_series():
    """HOST_MESSAGE_COST: on a CPU device each chunk's latency is added to the exposed sync (the
    scheduler and gloo take backward's cores), shared by the chunks in flight, at most
    GLOO_THREADS of them; on GPUs it is not."""
    ctx = context(chain([2**20] * 4))  # 4 layers of 4 MiB: 16 chunks of 1 MiB
    sched = DataParallelCost(
        ctx, ddp_candidate(comm_schedule=("bytescheduler", {"chunk_mb": 1.0, "credit_mb": 4.0}))
    ).schedule
    assert not sched.host_messages  # an A100 cluster
    stop_and_wait = sched.exposed_s(1.0, 1.0, 1e-3)  # credit of one chunk: nothing overlaps
    sched.host_messages = True
    assert sched.exposed_s(1.0, 1.0, 1e-3) == pytest.approx(stop_and_wait + 16 * sched.latency_s, rel=1e-12)
    # credit of 4 chunks: gloo progresses two at once, so 16 chunks pay 8 latencies in series
    ready = [0.0] * 4
    landed = max(_simulate(sched.chunks(1.0), ready, 4.0 * MIB, sched.latency_s, sched.beta_s, GLOO_THREADS))
    assert sched.exposed_s(1.0, 4.0, 0.0) == pytest.approx(landed + 9 * sched.latency_s, rel=1e-12)


def test_gloo_overlaps_at_most_two_chunks_whatever_the_credit():
    """GLOO_THREADS: ProcessGroupGloo's two worker threads; a credit of 2 or of 8 chunks lands
    the same on gloo, while without the cap more credit overlaps more latency."""
    layers, ready, a, beta = [(16.0, 16)], [0.0], 1.0, 0.0
    # a chunk every a / k, the last one landing a after its service began
    assert max(_simulate(layers, ready, 2.0, a, beta, GLOO_THREADS)) == pytest.approx(16 * a / 2 + a / 2)
    assert max(_simulate(layers, ready, 8.0, a, beta, GLOO_THREADS)) == pytest.approx(16 * a / 2 + a / 2)
    assert max(_simulate(layers, ready, 8.0, a, beta)) == pytest.approx(16 * a / 8 + 7 * a / 8)
