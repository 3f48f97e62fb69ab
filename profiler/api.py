"""`profile_model`: the ModelProfile of any model spec (the `meshplan profile` verb).

Analysis (FLOPs, parameters, activation bytes, boundary bytes, GEMM shapes, TP rules) always runs
on fake tensors, so a 175B model costs seconds and no memory. One representative layer per
distinct signature (layer class, parameter shapes, input shape) is captured; identical layers
reuse it. With device="cpu"/"cuda" the representatives are also timed (see timing.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from meshplan.errors import MeshplanError
from meshplan.model_profile import LayerProfile, ModelProfile
from meshplan.models.identity import structure_hash
from meshplan.models.loader import check_device, load_model
from meshplan.models.tp_rules import tp_rules
from meshplan.models.zoo.base import LayeredModel, Output
from meshplan.profiler.capture import LayerCapture, capture_layer, fake_copy
from meshplan.profiler.moe_flops import expert_flops
from meshplan.profiler.runner import InputSpec

ACTIVATION_DTYPE = torch.bfloat16
"""Activations are captured in bf16, the training precision the planner assumes."""


def profile_model(
    model: str,
    overrides: dict | None = None,
    *,
    device: str = "meta",
    microbatch_sizes: list[int] | None = None,
    concurrent: int = 1,
    in_place: bool = True,
    progress: bool | Callable[[int, int, str], None] = False,
) -> ModelProfile:
    """Profile `model` (zoo name, family, file.py:factory, module:factory or hf:NAME).

    `overrides` are config keys (`--set`), e.g. {"layers": 4, "seq": 2048}. On "meta" nothing is
    timed; on "cpu"/"cuda" each representative layer is timed per microbatch size (default [1]),
    with `concurrent - 1` other processes running the same layer. On "cpu" with concurrent > 1 and
    `in_place`, the TP and ZeRO-3 wrappers are also timed on `concurrent` real gloo ranks
    (profiler/insitu.py).
    """
    check_device(device)
    _check_timing_args(microbatch_sizes, concurrent)
    layered = load_model(model, overrides, _build_device(model))
    analysis = analyse_model(layered, model, progress=progress)
    if not _buildable_on_meta(model):  # user factory: its --set keys rebuild it (executor)
        analysis.profile.model_config = dict(overrides or {})
    elif model.startswith("hf:"):  # every --set key (kv_heads, rope_theta, ...) rebuilds it, not only the shape
        analysis.profile.model_config = {**analysis.profile.model_config, **(overrides or {})}
    if device != "meta":
        from meshplan.profiler.timing import time_layers

        time_layers(
            analysis.profile,
            layered,
            analysis.rep_of,
            analysis.inputs,
            analysis.captures,
            spec=model,
            overrides=overrides,
            device=device,
            microbatch_sizes=microbatch_sizes or [1],
            concurrent=concurrent,
            progress=lambda items, label: _progress(items, progress, label),
        )
        from meshplan.profiler.codecs import codec_neighbours, time_codecs
        from meshplan.profiler.timing import rank_threads

        # the compressors' codecs, as every rank runs them: beside the other ranks, kept busy
        with codec_neighbours(analysis, model, overrides, device, concurrent, microbatch_sizes or [1]) as busy:
            with rank_threads(device):
                time_codecs(analysis.profile, device, neighbours=busy)
    if device == "cpu" and concurrent > 1 and in_place:  # wrappers on real ranks: see profiler/insitu.py
        from meshplan.profiler.insitu import measure_in_place

        measure_in_place(
            analysis.profile, model, overrides, analysis.rep_of, analysis.inputs, concurrent, microbatch_sizes or [1]
        )
    analysis.profile.validate()
    return analysis.profile


@dataclasses.dataclass
class Analysis:
    profile: ModelProfile
    rep_of: dict[str, str]
    """Layer FQN -> FQN of the representative layer whose capture it reuses (itself if none)."""
    inputs: dict[str, InputSpec]
    """Representative FQN -> its per-sample input (for timing real copies)."""
    captures: dict[str, LayerCapture]


def analyse_model(
    model: LayeredModel, model_name: str, progress: bool | Callable[[int, int, str], None] = False
) -> Analysis:
    """The device-independent part of the profile, captured on fake tensors."""
    rules = tp_rules(model)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)  # plain tensor attributes of user modules
    inputs, _ = model.example_batch(1, torch.Generator().manual_seed(0))
    x: Output = _to_fake(inputs, fake_mode)
    seen: dict[tuple, str] = {}
    rep_of: dict[str, str] = {}
    specs: dict[str, InputSpec] = {}
    captures: dict[str, LayerCapture] = {}
    layers: list[LayerProfile] = []
    counted: set[int] = set()  # parameters already counted by an earlier layer (tied weights)
    for i, fqn in enumerate(_progress(model.layer_names(), progress, "analysing layers")):
        module = model.get_submodule(fqn)
        key = _signature(module, x)
        if key not in seen:
            seen[key] = fqn
            specs[fqn] = _input_spec(x, first=i == 0)
            captures[fqn] = _capture(fqn, module, x, fake_mode, rules[fqn])
        rep = rep_of[fqn] = seen[key]
        layers.append(_layer_profile(fqn, module, captures[rep], rules[fqn], counted))
        x = captures[rep].output
    notes = [
        *getattr(model, "notes", []),
        *(f"warning: {w}" for w in getattr(model, "warnings", [])),
        *_reuse_notes(model, seen.values()),
    ]
    profile = _model_profile(model, model_name, layers, notes)
    analysis = Analysis(profile=profile, rep_of=rep_of, inputs=specs, captures=captures)
    _graph_edges(profile, model, analysis)
    return analysis


def _graph_edges(profile: ModelProfile, model: LayeredModel, analysis: Analysis) -> None:
    """The profile's edges where layers were cut from the fx graph with several tensors crossing
    a cut (models/fx_layers.py): one edge per (producer, consumer) pair of layers, carrying each
    tensor's bytes per sample as the producer's fake output holds it (a skip from layer i to
    layer j is the edge i -> j, whatever layers pass it on). A chain keeps no edges."""
    found = model.graph_edges()
    names = model.layer_names()
    merged: dict[tuple[str, str], dict[str, float]] = {}
    for src, dst, value, pos in found:
        out = analysis.captures[analysis.rep_of[names[src]]].output
        tensor = out[pos] if isinstance(out, tuple) else out
        merged.setdefault((names[src], names[dst]), {})[value] = float(tensor.numel() * tensor.element_size())
    profile.edges = [[a, b] for a, b in merged]
    profile.edge_tensors = list(merged.values())


def _input_spec(x: torch.Tensor | tuple, first: bool) -> InputSpec:
    """A layer's per-sample input; every tensor's (shape, dtype) where it takes several (the
    tensors crossing its cut, models/fx_layers.py), so timing builds the same tuple."""
    parts = tuple((tuple(t.shape), str(t.dtype)) for t in x) if isinstance(x, tuple) else ()
    x = _first(x)
    return InputSpec(tuple(x.shape), str(x.dtype), first=first, parts=parts)


def _first(x: torch.Tensor | tuple) -> torch.Tensor:
    return x[0] if isinstance(x, tuple) else x


def _capture(fqn: str, module: torch.nn.Module, x: Output, fake_mode: FakeTensorMode, rule) -> LayerCapture:
    try:
        cap = capture_layer(fake_copy(module, fake_mode, ACTIVATION_DTYPE), x, fake_mode, rule)
    except Exception as exc:  # unsupported op in the user's forward: name the layer and the op
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        if "DataDependent" not in type(exc).__name__:  # a shape or type error, as on real tensors
            raise MeshplanError(
                f"layer {fqn} ({type(module).__name__}) fails on its input of shape "
                f"{list(_first(x).shape)}: {type(exc).__name__}: {first}; check the model's "
                "shapes (--set) or the layer's forward"
            ) from None
        raise MeshplanError(
            f"layer {fqn} ({type(module).__name__}) cannot run on fake tensors: "
            f"{type(exc).__name__}: {first}; avoid data-dependent ops (.item(), nonzero, "
            "boolean-mask indexing, branching on values) in its forward"
        ) from None
    extra, shapes = expert_flops(module, int(x.shape[1]) if not isinstance(x, tuple) and x.dim() >= 3 else 1)
    cap.forward_flops += extra
    cap.backward_flops += 2 * extra
    cap.gemm_shapes += shapes
    return cap


def _build_device(spec: str) -> str:
    """Zoo and HF models, and user factories taking `device`, are analysed on meta."""
    if _buildable_on_meta(spec):
        return "meta"
    from meshplan.models.user_models import factory_device

    return factory_device(spec)


def _buildable_on_meta(spec: str) -> bool:
    """Zoo and HF models build on meta; user factories return real modules (built on cpu)."""
    return spec.startswith("hf:") or ":" not in spec


def _check_timing_args(microbatch_sizes: list[int] | None, concurrent: int) -> None:
    bad = [b for b in microbatch_sizes or [] if int(b) < 1]
    if bad:
        raise MeshplanError(f"--microbatch {bad[0]}: microbatch sizes must be >= 1")
    if concurrent < 1:
        raise MeshplanError(f"--concurrent {concurrent}: must be >= 1 (1 = time alone)")


def _to_fake(x: torch.Tensor, fake_mode: FakeTensorMode) -> torch.Tensor:
    fake = fake_mode.from_tensor(x.to("cpu"))
    with fake_mode:
        return fake.to(ACTIVATION_DTYPE).requires_grad_() if fake.is_floating_point() else fake


def _signature(module: torch.nn.Module, x: Output) -> tuple:
    """Layers with equal signatures cost the same: class, structure (repr: strides, eps, ...),
    parameter shapes/dtypes and input shape."""
    params = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters())
    if isinstance(x, tuple):  # several crossing tensors (models/fx_layers.py)
        return type(module).__qualname__, repr(module), params, tuple((tuple(t.shape), str(t.dtype)) for t in x)
    return type(module).__qualname__, repr(module), params, tuple(x.shape), str(x.dtype)


def _layer_profile(fqn: str, module: torch.nn.Module, cap: LayerCapture, rule, counted: set[int]) -> LayerProfile:
    """A tied weight (LM head = embedding) counts in the first layer holding it only; later ones
    list it in num_tied_params. Frozen parameters count in num_params and num_frozen_params."""
    own = [p for p in module.parameters() if id(p) not in counted]
    tied = [p for p in module.parameters() if id(p) in counted]
    names = [n for n, p in module.named_parameters() if id(p) not in counted and p.requires_grad]
    counted.update(id(p) for p in own)
    param_bytes: dict[str, int] = {}
    for p in own:
        dtype = str(p.dtype).removeprefix("torch.")
        param_bytes[dtype] = param_bytes.get(dtype, 0) + p.numel() * p.element_size()
    return LayerProfile(
        name=fqn,
        kind=type(module).__name__.lower(),
        num_params=sum(p.numel() for p in own),
        param_bytes=param_bytes,
        num_tied_params=sum(p.numel() for p in tied),
        num_frozen_params=sum(p.numel() for p in own if not p.requires_grad),
        param_shapes=[list(p.shape) for p in own if p.requires_grad],
        param_names=names,
        forward_flops=cap.forward_flops,
        backward_flops=cap.backward_flops,
        activation_bytes=float(cap.activation_bytes),
        selective_activation_bytes=float(cap.selective_activation_bytes),
        recompute_flops_selective=cap.recompute_flops_selective,
        tp_replicated_activation_bytes=float(cap.tp_replicated_bytes),
        input_bytes=float(cap.input_bytes),
        output_bytes=float(cap.output_bytes),
        tp=rule,
        gemm_shapes=[list(s) for s in cap.gemm_shapes],
    )


def _reuse_notes(model: LayeredModel, representatives) -> list[str]:
    names = model.layer_names()
    reps = set(representatives)
    notes = [
        f"analysed {len(reps)} representative layer(s) on fake tensors ({', '.join(sorted(reps, key=names.index))}); "
        f"the other {len(names) - len(reps)} layer(s) have identical class, structure, parameter "
        "shapes and input shape and reuse their numbers"
    ]
    notes.append(
        "activation_bytes = storages saved for backward (bf16 activations, fused SDPA: no s^2 "
        "attention matrix), measured with saved_tensors_hooks; FLOPs count backward as 2x the "
        "attention forward (model FLOPs)"
    )
    return notes


def _model_profile(model: LayeredModel, name: str, layers: list[LayerProfile], notes: list[str]) -> ModelProfile:
    config = getattr(model, "config", None)
    # the config as `--set` keys: load_model(name, model_config) rebuilds the same model
    config_dict: dict[str, Any] = (
        dataclasses.asdict(config) if dataclasses.is_dataclass(config) and not isinstance(config, type) else {}
    )
    dtypes = {d for layer in layers for d in layer.param_bytes}
    return ModelProfile(
        model_name=name,
        model_config=config_dict,
        family=getattr(model, "family", "user"),
        structure_hash=structure_hash(model),
        seq_len=model.seq_len,
        param_dtype=sorted(dtypes)[0] if len(dtypes) == 1 else "mixed",
        activation_dtype_bytes=torch.finfo(ACTIVATION_DTYPE).bits // 8,
        num_params=sum(layer.num_params for layer in layers),
        forward_flops_per_sample=sum(layer.forward_flops for layer in layers),
        num_layers=len(model.layers),
        hidden=int(config_dict.get("hidden", 0)),
        heads=int(config_dict.get("heads", 0)),
        vocab=int(config_dict.get("vocab", 0)),
        device="meta",
        layers=layers,
        notes=notes,
        architecture=model.architecture(),
    )


def _progress(items: list[str], enabled: bool | Callable[[int, int, str], None], label: str):
    """`items` as they are, under a rich bar (progress=True), or telling a callable
    progress(done, total, label) the count after each (the CLI's own bar)."""
    if callable(enabled):
        return _counted(items, enabled, label)
    if not enabled:
        return items
    from rich.progress import track

    return track(items, description=label, transient=True)


def _counted(items: list[str], tick: Callable[[int, int, str], None], label: str) -> Iterator[str]:
    items = list(items)
    tick(0, len(items), label)
    for i, item in enumerate(items):
        yield item
        tick(i + 1, len(items), label)
