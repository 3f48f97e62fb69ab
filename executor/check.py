"""`check_plan`: every mismatch between a plan, its model and the launch, found before any
process starts, as one MeshplanError line naming the value and the fix.

Which layouts run is decided in one torch-free place, meshplan/feasibility.py (the search and
`Plan.validate` ask the same rules): check_plan refuses its first reason, invalid or not
runnable here, with the model's tensor-parallel divisors. What only the model and the launch
can tell (the layer list, the context length, GPUs per node) is checked here."""

from __future__ import annotations

import os

import torch
from torch import nn

from meshplan import feasibility
from meshplan.errors import MeshplanError
from meshplan.executor.model import build_model_for_plan, built_on_meta, check_real_layers, is_zoo_name, tp_rules_for
from meshplan.executor.pipeline import SCHEDULE_CLASSES
from meshplan.models.identity import num_params, structure_hash
from meshplan.plan import Plan


def check_model_file(plan: Plan, plan_path: str) -> None:
    """A plan of `--model path/to/file.py:factory` (or `hf:config.json`) keeps the path as it was
    given; run from another directory, a relative one is not found. Said in one line, with the
    directory to run from, before the model is imported."""
    name = plan.model_name
    target = name[3:] if name.startswith("hf:") else name.rpartition(":")[0]
    is_file = target.endswith((".py", ".json")) or "/" in target
    if not is_file or os.path.isabs(target) or os.path.exists(target):
        return
    beside = os.path.join(os.path.dirname(os.path.abspath(plan_path)), target)
    fix = (
        f"run it from {os.path.dirname(os.path.abspath(plan_path))}, where {target!r} is"
        if os.path.exists(beside)
        else "run it from the directory it was planned in, or re-plan with an absolute --model path"
    )
    raise MeshplanError(
        f"plan.model_name = {name!r}: {target!r} is not found from {os.getcwd()}; a plan keeps the model "
        f"file's path as --model gave it (relative to where `meshplan plan` ran): {fix}",
        field="plan.model_name",
    )


def local_device_count() -> int:
    """GPUs on this node, or 0 on a CPU-only node (where any number of processes may run)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_run_options(plan: Plan, optimizer: str, checkpoint_every: int = 0) -> None:
    """What the plan's methods refuse of the run's options, one line each: top-k with DGC's
    momentum correction runs under momentum-free SGD only (executor/methods/topk.py);
    offload=nvme params=true needs ZeRO-3 and no checkpoints (executor/methods/offload_nvme.py)."""
    from meshplan.executor import methods

    compression, params = methods.compression_of(plan)
    compression.check_optimizer(params, optimizer)
    offload, params = methods.offload_of(plan)
    offload.check(params, plan.zero_stage, checkpoint_every)


def check_plan(plan: Plan, *, nnodes: int = 1) -> None:
    """Raise MeshplanError if `plan` cannot run on its model or on `nnodes` nodes of this kind."""
    _check_runnable_here(plan)
    model = build_model_for_plan(plan, "meta")
    _check_identity(plan, model)
    _check_layout(plan, model)
    plan.validate("plan")
    _check_launch(plan, nnodes)
    names = model.layer_names()
    if plan.layers != names:
        bad = next((a for a, b in zip(plan.layers, names) if a != b), None) or (
            plan.layers[len(names)] if len(plan.layers) > len(names) else names[len(plan.layers)]
        )
        raise MeshplanError(
            f"plan.layers: {bad!r} does not match the layers of {plan.model_name} "
            f"({names[0]} .. {names[-1]}, {len(names)} layers); re-plan for this model"
        )
    if _factory_on_meta(plan, model):  # what the ranks build: the same layers, or refused here (not at step 0)
        check_real_layers(plan, build_model_for_plan(plan, "cpu"))
    seq = getattr(model, "seq_len", 1)
    if seq > 1 and plan.seq_len > seq:
        raise MeshplanError(
            f"plan.seq_len = {plan.seq_len}: {plan.model_name} handles at most {seq} tokens; "
            "re-plan with a shorter sequence or a model with a longer context"
        )


def _factory_on_meta(plan: Plan, model: nn.Module) -> bool:
    """A user factory with a `device` parameter, built on meta here and on the CPU by every rank
    (hf: models check their split on a CPU twin when profiled: models/hf_layers.py)."""
    return not is_zoo_name(plan.model_name) and not plan.model_name.startswith("hf:") and built_on_meta(model)


def _check_runnable_here(plan: Plan) -> None:
    """What a plan may be priced for but this executor cannot run: fp8 GEMMs (no fp8 path:
    runtimes.py, meshplan's fp8 behaviour), a hand-written crossbow plan whose learner count was
    left to the planner (learners=0) and a closed-form profile (`analytic:`), which names no
    module to build."""
    if plan.precision == "fp8":
        raise MeshplanError(
            f"plan.precision = 'fp8': this executor has no fp8 path (the plan was priced for runtime "
            f"{plan.runtime}); re-plan with --precision bf16 to run it here, or export it "
            "(meshplan export --to torchtitan|megatron)"
        )
    sync = plan.dp_methods.sync
    if sync.name == "crossbow" and sync.params.get("learners", 1) < 1:
        raise MeshplanError(
            "plan.dp_methods.sync = crossbow with learners=0 (auto) is unresolved: plan it with "
            "`meshplan plan --sync crossbow` (which picks k) or pin --sync crossbow:learners=K"
        )
    if plan.model_name.startswith("analytic:"):
        raise MeshplanError(
            f"plan.model_name = {plan.model_name!r}: a closed-form profile has no module to build or run; "
            "plan a buildable model (a zoo name, path/to/file.py:factory or an HF config) to run it, "
            "or export this plan"
        )


def _fsdp_warnings(plan: Plan) -> list[str]:
    """A ZeRO-2/3 plan priced with FSDP behaviours this executor does not have: it runs FSDP2 with
    no MixedPrecisionPolicy (fp32 gathers and reduce-scatters, FSDP2's unit buffers; the meshplan
    runtime's values, meshplan/runtimes.py), so its bytes and memory differ from the prediction."""
    from meshplan.runtimes import runtime

    own = runtime("meshplan")
    names = ("fsdp_gather_bytes", "fsdp_reduce_bytes", "fsdp_unit_buffers")
    differ = [n for n in names if plan.runtime_behaviours.get(n, own.value(n)) != own.value(n)]
    if not differ:
        return []
    said = ", ".join(f"{n} = {plan.runtime_behaviours[n]!r}" for n in differ)
    return [
        f"plan.runtime_behaviours {said}: this executor runs FSDP2 with fp32 gathers and reduce-scatters and "
        "FSDP2's unit buffers, so its bytes on the wire and peak memory differ from the prediction (re-plan "
        "without --fsdp-gather-dtype/--fsdp-reduce-dtype/--fsdp-unit-buffers)"
    ]


def run_warnings(plan: Plan) -> list[str]:
    """What this executor runs differently from what the plan was priced for: the run is valid, but
    its measured times and memory are not the prediction's."""
    out = []
    runtime = plan.runtime
    if runtime != "meshplan":
        out.append(
            f"plan.runtime = {runtime!r}: the prediction is for {runtime}'s behaviours; this executor runs the "
            "plan with meshplan's (re-plan with --runtime meshplan to predict this run, or export it)"
        )
    level = plan.runtime_behaviours.get("elementwise", "eager")
    if runtime == "meshplan" and level != "eager":
        out.append(
            f"plan.runtime_behaviours.elementwise = {level!r}: this executor runs its norms, rotary and SwiGLU "
            "as eager torch ops, so its step is slower than the prediction (re-plan without --elementwise/--compile)"
        )
    if runtime == "meshplan" and plan.zero_stage >= 2:
        out += _fsdp_warnings(plan)
    if runtime == "meshplan" and plan.runtime_behaviours.get("loss", "cross_entropy") != "cross_entropy":
        out.append(
            "plan.runtime_behaviours.loss = 'fused': this executor runs torch's cross-entropy over fp32 logits, "
            "so its peak memory is above the prediction (re-plan without --loss fused)"
        )
    out += _model_warnings(plan)
    if plan.recompute_num_layers > 1:
        out.append(
            f"plan.recompute_num_layers = {plan.recompute_num_layers}: this executor checkpoints each block on "
            "its own (Megatron's uniform groups are an export), so its peak is below the prediction"
        )
    return out


def _model_warnings(plan: Plan) -> list[str]:
    """What the model makes this run compute differently from one process, or waste."""
    needs_bn = plan.microbatch_size < plan.global_batch_size
    if not (needs_bn or plan.tensor_parallel_degree > 1) or plan.model_name.startswith("analytic:"):
        return []
    try:
        model = build_model_for_plan(plan, "meta")
    except MeshplanError:
        return []  # check_plan reports it
    return (_batch_norm_warnings(plan, model) if needs_bn else []) + _tp_uncovered_warnings(plan, model)


def _batch_norm_warnings(plan: Plan, model: nn.Module) -> list[str]:
    """BatchNorm normalises over the batch a module sees: under microbatching each microbatch,
    under data parallelism each replica's share (plain BatchNorm, not SyncBatchNorm), so its
    statistics and the losses differ from one process on the whole batch."""
    found = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)})
    if not found:
        return []
    return [
        f"{plan.model_name} has {', '.join(found)}: its batch statistics are taken over each forward's "
        f"{plan.microbatch_size} sample(s) (microbatch {plan.microbatch_size} x {plan.num_microbatches}, data "
        f"parallel {plan.data_parallel_degree}), not the global batch of {plan.global_batch_size}, so the losses "
        "differ from one process on the whole batch (use GroupNorm/LayerNorm, or SyncBatchNorm for the replicas)"
    ]


def _tp_uncovered_warnings(plan: Plan, model) -> list[str]:
    """Blocks without a tensor-parallel rule run whole on every TP rank (duplicated compute)."""
    if plan.tensor_parallel_degree < 2:
        return []
    whole = [fqn for fqn, rule in tp_rules_for(model).items() if rule.kind == "none" and fqn.startswith("layers.")]
    if not whole:
        return []
    return [
        f"plan.tensor_parallel_degree = {plan.tensor_parallel_degree}: {len(whole)} of {len(model.layers)} blocks "
        f"({whole[0]} .. {whole[-1]}) have no tensor-parallel rule for their modules and run whole on every TP "
        "rank (their compute is duplicated, their weights replicated); only the layers with rules are split"
    ]


def _check_identity(plan: Plan, model) -> None:
    """The rebuilt model is the profiled one: same unique parameter count and structure hash."""
    count, digest = num_params(model), structure_hash(model)
    if plan.model_num_params and count != plan.model_num_params:
        raise MeshplanError(
            f"plan.model_config rebuilds {plan.model_name} with {count:,} parameters, but the plan "
            f"was made for {plan.model_num_params:,}; re-plan, or give the factory the same --set keys"
        )
    if plan.model_structure_hash and digest != plan.model_structure_hash:
        raise MeshplanError(
            f"plan.model_structure_hash = {plan.model_structure_hash}: {plan.model_name} rebuilt "
            f"from plan.model_config has structure {digest} (other modules, shapes or ties); "
            "re-plan for this model"
        )


def _check_layout(plan: Plan, model) -> None:
    """The first feasibility reason (invalid or not runnable by this executor), as one line."""
    rules = tp_rules_for(model) if plan.tensor_parallel_degree > 1 else {}
    divisors = feasibility.merge_divisors(r.divisors for r in rules.values()) if rules else None
    found = feasibility.reasons(
        plan.layout(),
        num_layers=len(plan.layers),
        tp_divisors=divisors,
        tp_kinds=[r.kind for r in rules.values()] if rules else None,
    )
    if found:
        raise MeshplanError(f"plan: {found[0].text}")
    if plan.pipeline_schedule not in SCHEDULE_CLASSES:
        raise MeshplanError(
            f"plan.pipeline_schedule = {plan.pipeline_schedule!r}: not runnable; use one of "
            + ", ".join(SCHEDULE_CLASSES)
        )


def _check_launch(plan: Plan, nnodes: int) -> None:
    if nnodes < 1 or plan.world_size % nnodes:
        raise MeshplanError(
            f"--nnodes {nnodes}: does not divide plan.world_size = {plan.world_size}; "
            "launch on a divisor of the world size"
        )
    per_node, gpus = plan.world_size // nnodes, local_device_count()
    if gpus and per_node > gpus:
        raise MeshplanError(
            f"plan.world_size = {plan.world_size}: needs {per_node} GPUs per node on {nnodes} "
            f"node(s) but this node has {gpus}; use --nnodes {-(-plan.world_size // gpus)}"
        )
