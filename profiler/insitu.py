"""Parallel wrappers measured in place: on N real CPU ranks, all running at once.

On a CPU host the cost of a tensor-parallel or ZeRO-3 layer is not its arithmetic over t plus the
collectives' alpha-beta time: every DTensor op pays dispatch and sharding propagation, every
FSDP2 unit its hooks and copies, and every blocking collective waits until the partner ranks,
which share the cores with the other ranks, are scheduled. A one-rank mesh (wrapper_timing.py)
sees the dispatch but not the waiting, and link fits (links.py) see the waiting of idle ranks
only. So each representative layer is run here the way a training step runs it: N ranks
(`profile --concurrent N`), the layer wrapped as the executor wraps it (apply_tp at degree t on a
(N/t, t) mesh, with and without sequence parallelism; fully_shard at degree d on a (N/d, d) mesh
with gradient sync off, as during accumulation), every rank timing forward and backward at the
same time, and the same layer unwrapped right after. Mean wall seconds (a step is a sum, so the
mean, not the median, is what it pays): the slowest rank's wrapped pass (it decides when a
collective is done) against the mean rank's plain pass (combine_ranks). The overhead of a wrapper is

    tp:    wrapped - plain / t     (the cost model charges compute / t for the arithmetic)
    zero3: wrapped - plain, gradient sync off (an accumulation microbatch: the gathers)
    zero3_sync: the same with gradient sync on (the step's last microbatch: the gathers and the
           gradient reduce-scatter, between ranks that are busy computing)
    ddp:   the whole model under DDP - the plain model (once per step: DDP wraps the model, not a
           layer), in ModelProfile.step_overhead_s["ddp@D:bB"]
    recompute_<mode>: the checkpointed layer - the plain one (degree 1, "recompute_full@1:bB")
    zero1: ZeRO-1's optimizer step (ZeroRedundancyOptimizer: 1/D of the update, then the
           parameter broadcast) - the plain optimizer step / D, in step_overhead_s["zero1@D"]
    pp:    a P-stage 1F1B schedule (torch.distributed.pipelining, as the executor drives it) of
           the representative block on every stage, N/P pipelines at once: the slowest rank's
           step / (m + P - 1) - the plain block's pass, per microbatch and chunk: the boundary
           sends between busy ranks, the runtime's work around each action and the waits
           (PipelineCase below), in step_overhead_s["pp@P:bB"]; the cost model charges
           it in place of the link fit's two sends (planner/cost/pipeline.in_place_p2p_s)
    model: the plain whole model's forward + loss + backward, absolute (step_overhead_s
           "model@1:bB"); the cost model scales the per-layer timings to it
           (planner/context.timing_scale_points)
    optimizer: the once-per-step work on the whole model (clip + AdamW + zero_grad), absolute,
           in step_overhead_s["optimizer@1"] (nothing is wrapped; the cost model scales the
           one-rank per-layer optimizer timings to it: planner/context.optimizer_scale)
    tp_optimizer / fsdp_optimizer: that step over a layer's TP DTensors / FSDP2 shards - the
           plain layer's step / degree, in framework_overhead_s["tp_optimizer@T"] /
           ["fsdp_optimizer@D"]

stored per representative layer in LayerProfile.framework_overhead_s under "tp@T:bB",
"tp_sp@T:bB", "zero3@D:bB" and "zero3_sync@D:bB" (forward + backward) and the same keys + ":fwd" (forward only),
at every profiled microbatch size B: the overhead is not one line in B (which waits a rank
meets shifts with the size), so a plan at B = 4 is priced from its own measurement rather than
from a line through B = 1 and 8. The cost model (planner/rank/layer_cost.py) interpolates
between the measured sizes (planner/cost/in_place.linear_in_b) and uses these instead of the
modelled collectives and one-rank overheads.
CPU only: on GPUs the collectives run on their own engines and link fits describe them.
"""

from __future__ import annotations

import copy
import os
import socket
import statistics
import time

from meshplan.errors import MeshplanError
from meshplan.model_profile import ModelProfile

STEP = ""
"""Key of the whole-model (once-per-step) measurements in a rank's table."""
MODEL_PASS = "model@1"
"""step_overhead_s["model@1:bB"]: the plain whole model's forward + loss + backward at microbatch
B, mean wall seconds over the ranks running it at once (absolute, not an overhead: the DDP cases'
plain passes). The cost model scales the per-layer timings to it (planner/context.timing_scale_points)."""
WARMUP = 2
ITERS = 18
PASSES = 3
RECOMPUTE = ("full", "selective")
TIMEOUT_S = 600


def configs(ranks: int) -> list[tuple[str, int]]:
    """(wrapper, degree) measured with `ranks` ranks: every degree > 1 that divides it."""
    degrees = [d for d in range(2, ranks + 1) if ranks % d == 0]
    return [(kind, d) for d in degrees for kind in ("tp", "tp_sp", "zero3", "zero3_sync")]


def tp_degree_valid(rules, degree: int) -> bool:
    """The planner's and executor's rule (planner/enumerate.tp_reason): every head, KV-head and
    FFN count of the model divisible by the degree; otherwise no plan runs it, and timing it
    would fail inside a collective on some ranks only."""
    return all(size % degree == 0 for rule in rules for size in rule.divisors.values())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_in_place(
    profile: ModelProfile,
    spec: str,
    overrides: dict | None,
    rep_of: dict[str, str],
    inputs: dict,
    ranks: int,
    microbatch_sizes: list[int],
) -> dict[str, dict[str, float]]:
    """Fill framework_overhead_s[...] of every layer from its representative's in-place timings,
    and step_overhead_s, clamped at zero; return the unclamped table they were made from
    ({representative or STEP: {key: wrapped - plain, slowest rank}})."""
    from meshplan.profiler.concurrency import worker_context
    from meshplan.profiler.wrapper_timing import clamped

    reps = list(dict.fromkeys(rep_of.values()))
    rules = {lp.name: lp.tp for lp in profile.layers}
    batches = sorted(set(microbatch_sizes))
    ctx = worker_context("cpu")  # never fork the caller (profiler/concurrency.py)
    results = ctx.Queue()
    port = _free_port()
    args = (ranks, port, spec, overrides, reps, rules, inputs, batches, results)
    procs = [ctx.Process(target=_rank, args=(r, *args), daemon=True) for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        per_rank = [_get(results, procs) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    raw = combine_ranks(per_rank)
    stored = clamped(raw)
    for lp in profile.layers:
        lp.framework_overhead_s.update(stored.get(rep_of[lp.name], {}))
    profile.step_overhead_s.update(stored.get(STEP, {}))
    profile.notes.append(
        f"parallel wrappers measured in place on {ranks} gloo ranks at microbatch "
        f"{', '.join(map(str, batches))}: {', '.join(f'{k}@{d}' for k, d in configs(ranks))} "
        f"(mean wall of {ITERS} passes in {PASSES} round-robin rounds after {WARMUP}, slowest rank)"
    )
    return raw


def combine_ranks(per_rank: list[dict[str, dict[str, tuple[float, float]]]]) -> dict[str, dict[str, float]]:
    """{owner: {key: overhead}} from each rank's {owner: {key: (wrapped_s, plain_s)}}: the slowest
    rank's wrapped time (it decides when a collective is done) minus the mean rank's plain time
    (what the cost model charges for the arithmetic: the ranks' average share of the cores). The
    slowest rank's own wrapped - plain would pair it with its own plain pass, which runs alone
    and unsynchronised: the rank whose plain pass happened to run fastest sets the overhead, and
    the noise in N plain timings becomes a bias of the maximum. MODEL_PASS entries are absolute
    plain times (no wrapper): their mean over the ranks."""
    wrapped: dict[tuple[str, str], list[float]] = {}
    plain: dict[tuple[str, str], list[float]] = {}
    for table in per_rank:
        for owner, row in table.items():
            for key, (w, p) in row.items():
                wrapped.setdefault((owner, key), []).append(w)
                plain.setdefault((owner, key), []).append(p)
    raw: dict[str, dict[str, float]] = {}
    for (owner, key), ws in wrapped.items():
        slowest = statistics.fmean(ws) if key.startswith(MODEL_PASS) else max(ws)
        raw.setdefault(owner, {})[key] = slowest - statistics.fmean(plain[owner, key])
    return raw


def _get(results, procs) -> dict:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            rank, table, error = results.get(timeout=1.0)
        except Exception:  # queue.Empty: check the ranks are alive
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise MeshplanError(
                    f"in-place wrapper timing: rank process exited with code {dead[0].exitcode}; "
                    "rerun `meshplan profile` (or use --concurrent 1)"
                ) from None
            continue
        if error:
            raise MeshplanError(f"in-place wrapper timing failed on rank {rank}: {error}")
        return table
    raise MeshplanError(f"in-place wrapper timing did not finish in {TIMEOUT_S} s; use --concurrent 1")


def _rank(rank: int, world: int, port: int, spec: str, overrides, reps, rules, inputs, batches, results) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        table = _measure_all(world, spec, overrides, reps, rules, inputs, batches)
        results.put((rank, table, ""))
    except Exception as exc:  # reported to the parent as one line
        results.put((rank, {}, f"{type(exc).__name__}: {exc}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _measure_all(
    world: int, spec: str, overrides, reps, rules, inputs, batches
) -> dict[str, dict[str, tuple[float, float]]]:
    """Every case timed in PASSES round-robin passes (so that the host's drift over the
    measurement spreads over all cases, as profile-links does), ITERS passes each in all."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshplan.models.loader import load_model

    model = load_model(spec, overrides, "meta")
    meshes = {
        d: init_device_mesh("cpu", (world // d, d), mesh_dim_names=("rest", "inner"))["inner"]
        for d in sorted({d for _, d in configs(world)})
    }
    cases: list[Case] = []
    for rep in reps:
        rule = rules[rep]
        for kind, degree in configs(world):
            if kind.startswith("tp") and (
                rule.kind not in ("block", "embedding", "head") or not tp_degree_valid(rules.values(), degree)
            ):
                continue
            for b in batches:
                case = _layer_case(model, rep, rule, inputs[rep], b, kind, degree, meshes[degree])
                if case is not None:
                    cases.append(case)
            if kind in ("tp", "zero3"):  # their parameters step as DTensors / shards
                case = _layer_step_case(model, rep, rule, inputs[rep], batches[0], kind, degree, meshes[degree])
                if case is not None:
                    cases.append(case)
        cases += [_recompute_case(model, rep, inputs[rep], b, mode) for mode in RECOMPUTE for b in batches]
    block = pipeline_block(reps, rules, inputs)
    for degree, mesh in meshes.items():
        cases += _ddp_cases(load_model(spec, overrides, "cpu"), batches, degree, mesh)
        if block is not None:
            cases += pipeline_cases(model, block, inputs[block], batches, degree, mesh)
        cases.append(_zero1_case(load_model(spec, overrides, "cpu"), batches[0], degree, mesh))
    cases.append(_step_case(load_model(spec, overrides, "cpu"), batches[0]))
    for case in cases:  # warm-up: first calls set up buffers, hooks and connections
        case.run(WARMUP, keep=False)
    for _ in range(PASSES):
        for case in cases:
            case.run(ITERS // PASSES)
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for case in cases:
        table.setdefault(case.owner, {}).update(case.raw_overheads())
    model_pass: dict[str, list[float]] = {}  # the plain model, one sample per DDP degree
    for case in cases:
        if case.owner == STEP and case.key.startswith("ddp@"):
            b = case.key.rsplit(":", 1)[1]
            model_pass.setdefault(f"{MODEL_PASS}:{b}", []).append(case.plain_s())
    for key, samples in model_pass.items():
        table[STEP][key] = (statistics.fmean(samples), 0.0)
    return table


class Case:
    """One wrapper on one layer (or DDP on the whole model) at one microbatch size: the wrapped
    and the plain module, timed alternately; forward and backward wall times accumulate."""

    def __init__(self, owner: str, key: str, wrapped, plain, x, loss=None, split: int = 1):
        self.owner, self.key, self.wrapped, self.plain, self.x, self.loss, self.split = (
            owner,
            key,
            wrapped,
            plain,
            x,
            loss,
            split,
        )
        self.times: dict[str, list[tuple[float, ...]]] = {"wrapped": [], "plain": []}
        """Per pass: (forward_s, backward_s), or (step_s,) for an optimizer case."""

    def run(self, iters: int, keep: bool = True) -> None:
        import torch.distributed as dist

        for name, module in (("wrapped", self.wrapped), ("plain", self.plain)):
            dist.barrier()
            out = [self.timed(module) for _ in range(iters)]
            if keep:
                self.times[name] += out

    def timed(self, module) -> tuple[float, ...]:
        return _pass(module, self.x, self.loss)

    def _means(self, name: str) -> tuple[float, float]:
        runs = self.times[name]
        return statistics.fmean(t[0] for t in runs), statistics.fmean(t[1] for t in runs)

    def plain_s(self) -> float:
        """Mean wall seconds of the plain module's forward+backward on this rank."""
        return sum(self._means("plain"))

    def raw_overheads(self) -> dict[str, tuple[float, float]]:
        """{key: (wrapped_s, plain_s / split)} on this rank (combine_ranks subtracts them over
        the ranks, unclamped: below zero where the host's noise won)."""
        (w_f, w_b), (p_f, p_b) = self._means("wrapped"), self._means("plain")
        out = {self.key: (w_f + w_b, (p_f + p_b) / self.split)}
        if self.loss is None:
            out[self.key + ":fwd"] = (w_f, p_f / self.split)
        return out


def _layer_case(model, rep: str, rule, spec, b: int, kind: str, degree: int, mesh) -> Case | None:
    """A wrapper on one representative layer, or None if it cannot wrap it (on any rank)."""
    import torch
    import torch.distributed as dist

    from meshplan.profiler.runner import make_input, materialise_layer

    x = make_input(model, spec, b, "cpu", seed=1)
    plain = materialise_layer(model, rep, "cpu")
    wrapped = materialise_layer(model, rep, "cpu")
    agreed = torch.tensor([1.0 if _wrap(wrapped, rule, mesh, kind) else 0.0])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)  # every rank wraps, or none times it
    if agreed.item() < 1:
        return None
    split = degree if kind.startswith("tp") else 1
    return Case(rep, f"{kind}@{degree}:b{b}", wrapped, plain, x, split=split)


def _recompute_case(model, rep: str, spec, b: int, mode: str) -> Case:
    """Activation recompute on one representative layer (executor/activation_checkpoint.apply_ac),
    every rank at once with no collective: the recomputed forward and the checkpoint machinery
    (saved-tensor hooks, SAC dispatch, the extra allocations) as the ranks pay them sharing the
    cores. Key "recompute_<mode>@1:bB" (degree 1: nothing is split)."""
    from meshplan.executor.wrappers import apply_ac
    from meshplan.profiler.runner import make_input, materialise_layer

    plain = materialise_layer(model, rep, "cpu")
    wrapped = materialise_layer(model, rep, "cpu")
    apply_ac(wrapped, {"": mode})
    return Case(rep, f"recompute_{mode}@1:b{b}", wrapped, plain, make_input(model, spec, b, "cpu", seed=1))


def _ddp_cases(model, batches: list[int], degree: int, mesh) -> list[Case]:
    """DDP on the whole model (as executor/data_parallel wraps it: one process group per replica
    set, the default comm_schedule's buckets), forward with the loss + backward, all groups at once; one case per
    microbatch size, sharing the wrapped model and its plain copy."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from meshplan.executor.wrappers import DEFAULT_BUCKET_CAP_MB

    plain = copy.deepcopy(model)  # DDP's gradient hooks live on the wrapped model's parameters
    wrapped = DDP(model, process_group=mesh.get_group(), bucket_cap_mb=DEFAULT_BUCKET_CAP_MB)
    cases = []
    for b in batches:
        x, y = model.example_batch(b, torch.Generator().manual_seed(1))
        cases.append(Case(STEP, f"ddp@{degree}:b{b}", wrapped, plain, x, loss=lambda out, y=y: plain.loss(out, y)))
    return cases


class OptimizerCase(Case):
    """An optimizer step on all ranks at once: `wrapped` and `plain` are two optimizers, timed
    one step() each pass; overhead = wrapped - plain / split, or, when both are the same
    optimizer (nothing wrapped), its mean wall seconds, absolute. As ZeRO-1's case ("zero1@D"):
    torch's ZeroRedundancyOptimizer on the whole model (as executor/data_parallel.build_optimizer
    makes it: AdamW over a 1/D partition, then every rank's updated parameters broadcast from
    their owner) against the plain AdamW step on a copy, both on the gradients of one real
    backward — what the broadcast and the waiting for busy partners add to the 1/D of the update
    the cost model charges (planner/pipeline.tail_s)."""

    def __init__(self, owner: str, key: str, wrapped, plain, split: int = 1):
        super().__init__(owner, key, wrapped, plain, x=None, split=split)

    def timed(self, optimizer) -> tuple[float, ...]:
        t0 = time.perf_counter()
        optimizer.step()
        return (time.perf_counter() - t0,)

    def raw_overheads(self) -> dict[str, tuple[float, float]]:
        if self.wrapped is self.plain:
            return {self.key: (statistics.fmean(t[0] for runs in self.times.values() for t in runs), 0.0)}
        wrapped, plain = (statistics.fmean(t[0] for t in self.times[n]) for n in ("wrapped", "plain"))
        return {self.key: (wrapped, plain / self.split)}


def _zero1_case(model, b: int, degree: int, mesh) -> OptimizerCase:
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from meshplan.executor.wrappers import optimizer_spec

    plain = copy.deepcopy(model)
    x, y = model.example_batch(b, torch.Generator().manual_seed(1))
    for module in (model, plain):
        module.loss(module(x), y).backward()
    cls, kwargs = optimizer_spec("adamw", 1e-4, 0.1)
    sharded = ZeroRedundancyOptimizer(
        list(model.parameters()),
        optimizer_class=cls,
        process_group=mesh.get_group(),
        parameters_as_bucket_view=True,
        **kwargs,
    )
    return OptimizerCase(
        STEP, f"zero1@{degree}", sharded, cls(list(plain.parameters()), **kwargs), split=sharded.world_size
    )


class StepCase(OptimizerCase):
    """The executor's once-per-step work instead of a bare step(): its global-norm clip, the
    optimizer step and zero_grad (executor/train.py), on the gradients of one real backward
    restored before each pass. A layer's case leaves the clip out: its norm is reduced once per
    step over all layers (planner/pipeline.grad_norm_sync_s), not once per layer. One-rank
    timings of an optimizer step last a few milliseconds and swing 2x with a burst of other load
    on a shared host; these are spread over the in-place rounds like every other case."""

    def __init__(self, owner: str, key: str, wrapped, plain, split: int = 1, clip: bool = True):
        super().__init__(owner, key, wrapped, plain, split=split)
        self.state = {id(opt): _grads_of(opt) for opt in (wrapped, plain)}
        self.clip = clip

    def timed(self, optimizer) -> tuple[float, ...]:
        from meshplan.profiler.step_timing import clip_step_zero

        params, grads = self.state[id(optimizer)]
        return (clip_step_zero(params, grads, optimizer, clock=time.perf_counter, clip=self.clip),)


def _grads_of(optimizer) -> tuple[list, list]:
    """An optimizer's parameters and a copy of their current gradients (zeros where none)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return params, [p.grad.detach().clone() if p.grad is not None else p.detach() * 0 for p in params]


def _adamw(module):
    from meshplan.executor.wrappers import optimizer_spec

    cls, kwargs = optimizer_spec("adamw", 1e-4, 0.1)
    return cls([p for p in module.parameters() if p.requires_grad], **kwargs)


def _step_case(model, b: int) -> StepCase:
    """Key "optimizer@1": the whole model's step, absolute (planner/context.optimizer_scale)."""
    import torch

    x, y = model.example_batch(b, torch.Generator().manual_seed(1))
    model.loss(model(x), y).backward()
    optimizer = _adamw(model)
    return StepCase(STEP, "optimizer@1", optimizer, optimizer)


def _layer_step_case(model, rep: str, rule, spec, b: int, kind: str, degree: int, mesh) -> StepCase | None:
    """The optimizer update over one representative's parameters as TP DTensors ("tp_optimizer@T")
    or FSDP2 shards ("fsdp_optimizer@D", gradients reduce-scattered as in the step's last
    microbatch) against the plain layer's step / degree (the cost model charges the plain step
    over the rank's 1/degree share); None if the wrapper cannot take the layer (on any rank)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from meshplan.profiler.runner import make_input, materialise_layer

    plain = materialise_layer(model, rep, "cpu")
    wrapped = materialise_layer(model, rep, "cpu")
    agreed = torch.tensor([1.0 if _wrap(wrapped, rule, mesh, kind) else 0.0])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    if agreed.item() < 1:
        return None
    if kind == "zero3":
        assert isinstance(wrapped, FSDPModule)  # fully_shard made it one (_wrap)
        wrapped.set_requires_gradient_sync(True)
    x = make_input(model, spec, b, "cpu", seed=1)
    for module in (wrapped, plain):
        _pass(module, x)
    name = "tp_optimizer" if kind == "tp" else "fsdp_optimizer"
    return StepCase(rep, f"{name}@{degree}", _adamw(wrapped), _adamw(plain), split=degree, clip=False)


def _pass(module, x, loss=None) -> tuple[float, float]:
    """Wall (forward, backward) seconds of one pass; `loss` reduces the output (else ones)."""
    from meshplan.profiler.runner import backward_ones, call, clear_grad

    for p in module.parameters():
        p.grad = None
    clear_grad(x)
    t0 = time.perf_counter()
    y = call(module, x)
    t1 = time.perf_counter()
    if loss is not None:
        loss(y).backward()
    else:
        backward_ones(y)
    return t1 - t0, time.perf_counter() - t1


def _wrap(layer, rule, mesh, kind: str) -> bool:
    try:
        if kind.startswith("tp"):
            from meshplan.executor.wrappers import apply_tp

            apply_tp(layer, {"": rule}, mesh, kind == "tp_sp")
        else:
            from torch.distributed.fsdp import fully_shard

            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
            # accumulation microbatches gather only; the step's last one also reduce-scatters
            layer.set_requires_gradient_sync(kind == "zero3_sync")
        return True
    except Exception:  # a layer this wrapper cannot take: the cost model falls back to its model
        return False


# The pipeline schedule in place (step_overhead_s["pp@P:bB"]).
#
# A pipeline schedule measured in place: its per-microbatch cost beyond the stages' arithmetic.
#
# A pipeline rank pays, per microbatch and chunk, more than its layers' forward and backward: the
# boundary tensor sent forward and its gradient sent back (gloo isend/irecv, waited for before the
# next action in 1F1B's steady state), torch.distributed.pipelining's own work around each action
# (flattening and detaching the stage's inputs, the forward cache, stage_backward), the last
# stage's loss, and the wait for a neighbour that shares the cores with every other rank. A link
# fit (links.py) times a send between idle ranks only. So the executor's schedule is run here as a
# training step runs it: on N ranks at once, a (N/P, P) mesh of N/P pipelines of P stages, every
# stage one copy of the model's representative block (executor/pipeline.contiguous_boundaries,
# torch's Schedule1F1B, a scalar loss on the last stage), NUM_MICROBATCHES = 2P microbatches of B
# samples per step; and right after it the same block's plain forward + backward on every rank.
#
#     pp@P:bB = slowest rank's schedule step / (m + P - 1) - mean rank's plain block pass
#
# (ModelProfile.step_overhead_s, seconds per microbatch and chunk): what a pipeline rank's time
# per microbatch t_r = compute + p2p must hold for the cost model's `(m + P - 1) t_r`
# (planner/cost/pipeline.py, Narayanan et al. 2021 Sec 2.2) to be the measured step. The cost
# model charges it in place of the link fit's two sends, for CPU profiles only.

NUM_MICROBATCHES_PER_STAGE = 2
"""m = 2P microbatches per measured step: 1F1B needs m >= P; 2P has a steady state as long as
its warm-up and cool-down."""


def pipeline_block(reps: list[str], rules: dict, inputs: dict) -> str | None:
    """The first representative transformer block taking and returning one tensor (a pipeline
    stage of such blocks sends one tensor each way); None if the model has none."""
    for rep in reps:
        if rules[rep].kind == "block" and not inputs[rep].parts and not inputs[rep].first:
            return rep
    return None


class PipelineCase(Case):
    """One (N/P, P) mesh's pipelines at microbatch B: `wrapped` is the rank's schedule (its
    stage index on the mesh's inner axis), `plain` the same block unwrapped; a pass of the
    schedule is one step over m microbatches, a pass of the plain block one microbatch."""

    def __init__(self, key: str, schedule, stage, plain, x, batch, degree: int, microbatches: int):
        super().__init__(STEP, key, schedule, plain, x)
        self.stage, self.batch, self.degree, self.microbatches = stage, batch, degree, microbatches

    def timed(self, module) -> tuple[float, ...]:
        if module is self.plain:
            return _pass(module, self.x)
        import torch

        for p in self.stage.submod.parameters():
            p.grad = None
        args = (self.batch,) if self.stage.is_first else ()
        kwargs = {"target": torch.zeros(len(self.batch)), "losses": []} if self.stage.is_last else {}
        t0 = time.perf_counter()
        module.step(*args, **kwargs)
        return time.perf_counter() - t0, 0.0

    def raw_overheads(self) -> dict[str, tuple[float, float]]:
        """{key: (schedule step / (m + P - 1), plain block pass)} on this rank."""
        step = statistics.fmean(t[0] for t in self.times["wrapped"])
        plain = statistics.fmean(sum(t) for t in self.times["plain"])
        return {self.key: (step / (self.microbatches + self.degree - 1), plain)}


def pipeline_cases(model, rep: str, spec, batches: list[int], degree: int, mesh) -> list[PipelineCase]:
    """A PipelineCase per microbatch size, each with its own stage and schedule on `mesh`'s
    group (the pipeline axis of the (N/P, P) mesh)."""
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import Schedule1F1B

    from meshplan.executor.wrappers import contiguous_boundaries
    from meshplan.profiler.runner import make_input, materialise_layer

    m = NUM_MICROBATCHES_PER_STAGE * degree
    cases = []
    for b in batches:
        block = materialise_layer(model, rep, "cpu")
        contiguous_boundaries(block)
        stage = PipelineStage(block, mesh.get_local_rank(), degree, torch.device("cpu"), group=mesh.get_group())
        schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=_loss)
        whole = make_input(model, spec, m * b, "cpu", seed=1).detach()
        x = make_input(model, spec, b, "cpu", seed=1)
        cases.append(
            PipelineCase(
                f"pp@{degree}:b{b}", schedule, stage, materialise_layer(model, rep, "cpu"), x, whole, degree, m
            )
        )
    return cases


def _loss(out, target):
    """A scalar from the last stage's output (what matters is that backward starts there)."""
    return out.float().mean() + 0.0 * target.sum()
