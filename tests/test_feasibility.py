"""One set of validity rules (meshplan/feasibility.py) for the search, estimate, Plan.validate and
the executor's check_plan: a plan `meshplan plan` writes is always one `meshplan run` accepts, and
a layout the search refuses is refused by check_plan with the same words."""

from __future__ import annotations

import random

import pytest

from meshplan import dp_methods
from meshplan.errors import InfeasibleError, MeshplanError
from meshplan.executor.check import check_plan
from meshplan.plan import Plan
from meshplan.planner import PlanRequest
from meshplan.planner.context import Context
from meshplan.planner.search import search
from meshplan.planner.search.enumerate import Rejects, candidates
from meshplan.planner.search.partition import balanced_stages
from meshplan.planner.search.predict import plan_of
from meshplan.presets import local_cpu
from meshplan.profiler import profile_model

MODELS = ("gpt-tiny", "llama-tiny")


@pytest.fixture(scope="module")
def profiles():
    return {name: profile_model(name, {}, device="meta") for name in MODELS}


def _request(rng: random.Random) -> PlanRequest:
    n = rng.choice((1, 2, 3, 4, 6, 8))
    pick = lambda options: rng.choice(options + [None] * len(options))  # noqa: E731  (None: searched)
    methods, allow = {}, {}
    if rng.random() < 0.3:
        name = rng.choice(dp_methods.names("compression"))
        methods["compression"] = (name, dp_methods.method("compression", name).resolve({}, "c"))
    elif rng.random() < 0.5:
        allow["compression"] = tuple(rng.sample(dp_methods.approximate("compression"), rng.randint(1, 2)))
    if rng.random() < 0.1:
        name = rng.choice(["cpu", "nvme"])
        methods["offload"] = (name, dp_methods.method("offload", name).resolve({}, "offload"))
    return PlanRequest(
        num_gpus=n,
        global_batch=rng.randint(1, 24),
        top_k=3,
        precision="fp32",
        tp=pick([1, 2, 4]),
        pp=pick([1, 2, 3, 4]),
        microbatch=pick([1, 2, 3, 4]),
        schedule=pick(["gpipe", "1f1b", "interleaved", "zerobubble"]),
        zero=pick([0, 1, 2, 3]),
        dp_shard=pick([1, 2]),
        sequence_parallel=pick([True, False]),
        methods=methods,
        allow=allow,
    )


def _plan_of(ctx: Context, cand) -> Plan:
    """The Plan a candidate would be, built without validation (check_plan validates)."""
    try:
        stages = balanced_stages(ctx, cand.pp * cand.virtual_stages)
    except MeshplanError:
        stages = [list(range(len(ctx.layers)))]  # too many stages: the layout rule fires before the stage check
    return plan_of(ctx, cand, stages, {})


def test_search_plans_run_and_search_rejections_match_check_plan(profiles):
    rng = random.Random(14)
    plans_checked = rejections_checked = 0
    for _ in range(450):  # a pinned dp_shard refuses the ZeRO-0/1 candidates: more requests for the floor
        req = _request(rng)
        prof = profiles[rng.choice(MODELS)]
        cluster = local_cpu(req.num_gpus)
        try:
            best = search(prof, cluster, req)
        except (InfeasibleError, MeshplanError):
            best = None
        for plan in ([best] + best.search.alternatives) if best else []:
            check_plan(plan)  # raises if the executor would refuse what the search wrote
            allowed = set(req.allow.get("compression", ())) | {req.methods.get("compression", ("none",))[0]}
            assert plan.dp_methods.compression.name in allowed | set(dp_methods.exact("compression"))
            plans_checked += 1
        rej = Rejects()
        candidates(Context.build(prof, cluster, req), rej)
        for cand, reason in rng.sample(rej.infeasible, min(3, len(rej.infeasible))):
            with pytest.raises(MeshplanError) as err:
                check_plan(_plan_of(Context.build(prof, cluster, req), cand))
            assert reason in str(err.value), (cand.label(), reason, str(err.value))
            rejections_checked += 1
    assert plans_checked > 200 and rejections_checked > 200


def test_the_1f1b_plan_with_three_microbatches_on_two_stages_is_never_written(profiles):
    """The reported case: pp=2, global batch 3, 1F1B; the search used to return m=3."""
    req = PlanRequest(num_gpus=2, global_batch=3, pp=2, schedule="1F1B", precision="fp32")
    with pytest.raises(InfeasibleError):
        search(profiles["gpt-tiny"], local_cpu(2), req)
    rej = Rejects()
    candidates(Context.build(profiles["gpt-tiny"], local_cpu(2), req), rej)
    assert any("multiple of pp = 2" in why for _, why in rej.infeasible)


def test_an_approximate_method_that_was_not_allowed_is_never_chosen(profiles):
    """PowerSGD would win on a slow link; without --allow-compression the search never uses it."""
    import dataclasses

    cluster = local_cpu(4)
    slow = dataclasses.replace(
        cluster, collectives=[], intra_node=dataclasses.replace(cluster.intra_node, bandwidth_gbps=0.01)
    )
    req = PlanRequest(num_gpus=4, global_batch=16, dp=4, precision="fp32", top_k=5)
    plain = search(profiles["gpt-tiny"], slow, req)
    assert all(p.dp_methods.compression.name == "none" for p in [plain] + plain.search.alternatives)
    allowed = search(profiles["gpt-tiny"], slow, dataclasses.replace(req, allow={"compression": ("powersgd",)}))
    assert allowed.dp_methods.compression.name == "powersgd"
    assert allowed.prediction.step_time_s < plain.prediction.step_time_s
    options = {o.name: o for o in allowed.prediction.dp_method_options if o.axis == "compression"}
    assert set(options) == {"none", "powersgd"} and options["powersgd"].chosen and not options["powersgd"].exact


def test_parameter_offload_to_nvme_is_planned_at_zero_3_only(profiles):
    """ZeRO-Infinity pages fully sharded parameters: offload=nvme params=true below ZeRO-3 is
    refused by the search (every candidate's reason names it), by Plan.validate and by check_plan;
    unpinned, the search writes ZeRO-3 plans only, and params=false keeps every stage."""
    import dataclasses

    from meshplan.plan import MethodChoice

    nvme = ("nvme", {"params": True})
    req = PlanRequest(num_gpus=2, global_batch=8, precision="fp32", top_k=5, methods={"offload": nvme})
    best = search(profiles["gpt-tiny"], local_cpu(2), req)
    assert {p.zero_stage for p in [best] + best.search.alternatives} == {3}
    rej = Rejects()
    candidates(Context.build(profiles["gpt-tiny"], local_cpu(2), dataclasses.replace(req, zero=2)), rej)
    why = "offload=nvme params=true with zero_stage 2: runs with zero_stage 3 only"
    assert any(why in reason for _, reason in rej.infeasible)
    with pytest.raises(InfeasibleError):
        search(profiles["gpt-tiny"], local_cpu(2), dataclasses.replace(req, zero=2))
    plain = dataclasses.replace(req, methods={"offload": ("nvme", {"params": False})}, zero=2)
    assert search(profiles["gpt-tiny"], local_cpu(2), plain).zero_stage == 2
    zero2 = dataclasses.replace(best, zero_stage=2)
    zero2.dp_methods.offload = MethodChoice(name="nvme", params={"params": True})
    with pytest.raises(MeshplanError, match=why):
        zero2.validate()
    with pytest.raises(MeshplanError, match=why):
        check_plan(zero2)


@pytest.mark.parametrize(
    "name, params, why",
    [
        ("local-sgd", {"group_size": 3}, "sync=local-sgd group_size=3 with data-parallel degree 4"),
        ("local-sgd", {"group_size": 2, "group_period": 4}, "group_period=4 with period=4"),
        ("crossbow", {"learners": 3}, "sync=crossbow learners=3 with a local batch of 4 samples"),
        ("dabmd", {"entropy": True, "gradient_allreduce": True}, "entropy=true with gradient_allreduce=true"),
    ],
)
def test_method_parameters_the_layout_rules_out_are_never_planned(profiles, name, params, why):
    """The executor refuses these (executor/methods/sync_*.py); the search refuses every such
    candidate with that reason, check_plan says the same, and a fitting value is planned."""
    import dataclasses

    sync = ("sync", (name, dp_methods.method("sync", name).resolve(params, "--sync")))
    req = PlanRequest(num_gpus=4, global_batch=16, dp=4, zero=0, precision="fp32", methods=dict([sync]))
    with pytest.raises(InfeasibleError, match=why):
        search(profiles["gpt-tiny"], local_cpu(4), req)
    rej = Rejects()
    assert not candidates(Context.build(profiles["gpt-tiny"], local_cpu(4), req), rej)
    assert rej.infeasible and all(why in reason for _, reason in rej.infeasible)
    with pytest.raises(MeshplanError, match=why):
        check_plan(_plan_of(Context.build(profiles["gpt-tiny"], local_cpu(4), req), rej.infeasible[0][0]))
    fitting = {"local-sgd": {"group_size": 2}, "crossbow": {"learners": 2}, "dabmd": {"entropy": False}}[name]
    ok = dataclasses.replace(req, methods={"sync": (name, dp_methods.method("sync", name).resolve(fitting, "s"))})
    assert search(profiles["gpt-tiny"], local_cpu(4), ok).dp_methods.sync.name == name
