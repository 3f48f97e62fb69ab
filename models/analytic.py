"""Closed-form ModelProfiles of decoder transformers (GPT as in Megatron-LM, Llama-3 style).

Pure Python (no torch): the validation against published runs needs the model *as it was run*
(Megatron-LM 2021-22: dropout on, attention scores materialised; Megatron-Core 2024: fused flash
attention), and the planner's speed benchmarks need 175B-405B shapes without building them.

Per-sample (one sequence of s tokens) quantities, h = hidden, a = heads, f = ffn width, V = vocab:
- params per GPT block `12h^2 + 13h` (Narayanan et al. 2021 Eq. 2, ffn = 4h); embedding `(V + s)h`.
- forward FLOPs per block `24sh^2 + 4s^2h` (Korthikanti et al. 2022 App. A); logits `2shV`;
  backward = 2 x forward.
- activations per block `sh(34 + 5as/h)` bytes (Korthikanti Eq. 1); selective recompute keeps
  `34sh` (Eq. 6 with t = 1); `10sh` of it is replicated across TP ranks without sequence
  parallelism (Eq. 2). Flash attention stores no s^2 term (selective then saves nothing).
"""

from __future__ import annotations

import dataclasses

from meshplan.model_profile import LayerProfile, ModelArchitecture, ModelProfile, TPRule


def _block(
    name: str, s: int, h: int, a: int, f: int, kv: int, *, dropout: bool, flash: bool, gated: bool, kind: str
) -> LayerProfile:
    """One transformer block; kv = key/value width (h for multi-head, h*kv_heads/a for GQA)."""
    n_mlp = 3 if gated else 2
    biases = 0 if gated else 2 * h + 2 * kv + f + h  # GPT linears carry biases, Llama's do not
    norms_params = 2 * h if gated else 4 * h  # RMSNorm weight vs LayerNorm weight + bias
    params = 2 * h * h + 2 * h * kv + n_mlp * h * f + biases + norms_params
    gemm_fwd = 2 * s * (2 * h * h + 2 * h * kv) + 2 * s * n_mlp * h * f
    attn_fwd = 4 * s * s * h  # QK^T and AV (Korthikanti App. A)
    mask = 1 if dropout else 0  # 1-byte dropout masks
    # Korthikanti Eq. 1 breakdown (bytes per sample): attention input 2sh, Q 2sh, K and V 4s*kv,
    # projection input 2sh, dropout mask sh; MLP input 2sh, 2sf per GEMM output kept (GeLU:
    # fc1 out + fc2 in; SwiGLU: gate, up, down in), mask sh; two norms 4sh. 34sh for GPT.
    attn_lin = 6 * s * h + 4 * s * kv + mask * s * h
    mlp = 2 * s * h + (6 if gated else 4) * s * f + mask * s * h
    norms = 4 * s * h
    # attention core: softmax output 2as^2 (+ dropout mask as^2 and output 2as^2); flash keeps
    # only the fp32 log-sum-exp (4as).
    core = 4 * a * s if flash else (2 + 3 * mask) * a * s * s
    selective = attn_lin + mlp + norms
    return LayerProfile(
        name=name,
        kind=kind,
        num_params=params,
        param_bytes={"float32": 4 * params},
        forward_flops=float(gemm_fwd + attn_fwd),
        backward_flops=float(2 * (gemm_fwd + attn_fwd)),
        activation_bytes=float(selective + core),
        selective_activation_bytes=float(selective + (core if flash else 0)),
        recompute_flops_selective=0.0 if flash else float(attn_fwd),
        tp_replicated_activation_bytes=float((8 + 2 * mask) * s * h),
        input_bytes=float(2 * s * h),
        output_bytes=float(2 * s * h),
        tp=TPRule(
            column=["attn.wq", "attn.wk", "attn.wv", "mlp.fc1"],
            row=["attn.wo", "mlp.fc2"],
            replicated=["ln1", "ln2"],
            divisors={"heads": a, "ffn": f},
            num_allreduce_fwd=2,
            kind="block",
        ),
        gemm_shapes=[[s, h + 2 * kv, h], [s, h, h], [s, (n_mlp - 1) * f, h], [s, h, f]],
    )


def _embed(s: int, h: int, vocab: int, learned_pos: bool, dropout: bool) -> LayerProfile:
    params = vocab * h + (s * h if learned_pos else 0)
    return LayerProfile(
        name="embed",
        kind="embedding",
        num_params=params,
        param_bytes={"float32": 4 * params},
        forward_flops=0.0,
        backward_flops=0.0,
        activation_bytes=float(s * h if dropout else 0),
        input_bytes=float(8 * s),
        output_bytes=float(2 * s * h),
        tp=TPRule(column=["tok"], divisors={}, num_allreduce_fwd=1, kind="embedding"),
    )


def _head(s: int, h: int, vocab: int, rms_norm: bool = False) -> LayerProfile:
    """The final norm (LayerNorm: weight and bias; RMSNorm: weight only) and the output projection."""
    params = vocab * h + (h if rms_norm else 2 * h)
    fwd = 2 * s * h * vocab
    return LayerProfile(
        name="head",
        kind="head",
        num_params=params,
        param_bytes={"float32": 4 * params},
        forward_flops=float(fwd),
        backward_flops=float(2 * fwd),
        # final-norm input 2sh, projection input 2sh, fp32 logits 4sV (Korthikanti Sec 4.2.3)
        activation_bytes=float(4 * s * h + 4 * s * vocab),
        tp_replicated_activation_bytes=float(4 * s * h),
        input_bytes=float(2 * s * h),
        output_bytes=float(4 * s * vocab),
        tp=TPRule(column=["proj"], replicated=["norm"], num_allreduce_fwd=1, kind="head"),
        gemm_shapes=[[s, vocab, h]],
    )


def gpt_profile(
    *,
    layers: int,
    hidden: int,
    heads: int,
    vocab: int = 51200,
    seq: int = 2048,
    ffn_hidden: int = 0,
    dropout: bool = True,
    flash: bool = False,
    name: str = "gpt",
) -> ModelProfile:
    """GPT as trained by Megatron-LM (learned positions, GeLU MLP, dropout by default)."""
    f = ffn_hidden or 4 * hidden
    blocks = [
        _block(
            f"layers.{i}", seq, hidden, heads, f, hidden, dropout=dropout, flash=flash, gated=False, kind="gpt_block"
        )
        for i in range(layers)
    ]
    return _assemble(
        name,
        "gpt",
        seq,
        hidden,
        heads,
        vocab,
        [_embed(seq, hidden, vocab, True, dropout)] + blocks + [_head(seq, hidden, vocab)],
        {"layers": layers, "hidden": hidden, "heads": heads, "vocab": vocab, "seq": seq, "ffn_hidden": f},
        gpt_architecture(heads, f),
    )


def gpt_architecture(heads: int, ffn_hidden: int) -> ModelArchitecture:
    """Megatron-LM's GPT (and meshplan's zoo GPT): pre-LN LayerNorm blocks, GELU MLP, learned absolute
    positions, biased linears, an output layer of its own."""
    return ModelArchitecture(
        model_type="gpt",
        kv_heads=heads,
        ffn_hidden=ffn_hidden,
        norm="LayerNorm",
        norm_eps=1e-5,
        activation="gelu",
        position="learned_absolute",
        bias=True,
        tied=False,
    )


def llama_architecture(
    kv_heads: int, ffn_hidden: int, rope_theta: float = 500000.0, norm_eps: float = 1e-5
) -> ModelArchitecture:
    """Llama 3 (Dubey et al. 2024; meshplan's zoo Llama): RMSNorm, SwiGLU, rotary positions, no biases,
    an untied output layer."""
    return ModelArchitecture(
        model_type="llama",
        kv_heads=kv_heads,
        ffn_hidden=ffn_hidden,
        norm="RMSNorm",
        norm_eps=norm_eps,
        activation="swiglu",
        position="rope",
        rope_theta=rope_theta,
        bias=False,
        tied=False,
    )


def llama_profile(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn_hidden: int,
    vocab: int = 128256,
    seq: int = 8192,
    name: str = "llama",
) -> ModelProfile:
    """Llama-3 style: RMSNorm, SwiGLU, grouped-query attention, rotary, flash attention, no dropout."""
    kv = hidden * kv_heads // heads
    blocks = [
        _block(
            f"layers.{i}", seq, hidden, heads, ffn_hidden, kv, dropout=False, flash=True, gated=True, kind="llama_block"
        )
        for i in range(layers)
    ]
    for b in blocks:
        b.tp.divisors["kv_heads"] = kv_heads
    return _assemble(
        name,
        "llama",
        seq,
        hidden,
        heads,
        vocab,
        [_embed(seq, hidden, vocab, False, False)] + blocks + [_head(seq, hidden, vocab, rms_norm=True)],
        {
            "layers": layers,
            "hidden": hidden,
            "heads": heads,
            "kv_heads": kv_heads,
            "vocab": vocab,
            "seq": seq,
            "ffn_hidden": ffn_hidden,
        },
        llama_architecture(kv_heads, ffn_hidden),
    )


def _assemble(name, family, seq, hidden, heads, vocab, layer_list, config, architecture) -> ModelProfile:
    return ModelProfile(
        model_name=name,
        model_config=config,
        family=family,
        seq_len=seq,
        num_params=sum(lp.num_params for lp in layer_list),
        forward_flops_per_sample=sum(lp.forward_flops for lp in layer_list),
        num_layers=len(layer_list) - 2,
        hidden=hidden,
        heads=heads,
        vocab=vocab,
        device="meta",
        layers=layer_list,
        architecture=architecture,
        notes=["closed-form profile (meshplan.models.analytic)"],
    )


def _widths(layer: LayerProfile) -> tuple[int, int, int, int, bool] | None:
    """(s, h, kv, f, gated) of a built transformer block, from its GEMMs in forward order: q, k, v,
    o, then fc1, fc2 (GPT) or w1, w3, w2 (gated, Llama-style), each its own linear; or fused, qkv,
    o, fc1 (or gate and up together), fc2 (HF GPT-2's Conv1D c_attn, c_fc). None for any other
    layer (and for a closed-form block, which is one already)."""
    g = [[int(x) for x in shape] for shape in layer.gemm_shapes]
    if layer.tp.kind not in ("block", "none") or layer.kind in ("gpt_block", "llama_block") or len(g) not in (4, 6, 7):
        return None
    s, h = g[0][0], g[0][2]
    if len(g) == 4:
        (_, qkv, _), (_, ho, _), (_, up, _), (_, hd, f) = g
        kv, gated = (qkv - h) // 2, up == 2 * f
        ok = up in (f, 2 * f) and qkv > h
    else:
        (_, hq, _), (_, kv, _), (_, kv2, _), (_, ho, _) = g[:4]
        gated, f, hd = len(g) == 7, g[4][1], g[-1][1]
        ok = hq == h and kv2 == kv and g[-1][2] == f and (not gated or g[5][1] == f)
    if not ok or ho != h or hd != h or any(shape[0] != s for shape in g):
        return None
    return s, h, kv, f, gated


def _runtime_block(layer: LayerProfile, heads: int, *, dropout: bool, flash: bool) -> LayerProfile:
    """The closed-form block of a built block's shape (its own parameters, TP rule and boundary
    bytes kept), or the layer itself when it is not a standard block (its FLOPs differ by more
    than 1% from the closed form's: biases aside, another architecture)."""
    widths = _widths(layer)
    if widths is None or not heads:
        return layer
    s, h, kv, f, gated = widths
    a = int(layer.tp.divisors.get("heads") or heads)
    kind = "llama_block" if gated else "gpt_block"
    new = _block(
        layer.name, s, h, a, f, kv, dropout=dropout and not gated, flash=flash or gated, gated=gated, kind=kind
    )
    if abs(new.forward_flops - layer.forward_flops) > 0.01 * layer.forward_flops:
        return layer
    own_rule = layer.tp.kind == "block"  # else the runtime's (a module meshplan cannot split, HF GPT-2's Conv1D)
    return dataclasses.replace(
        new,
        num_params=layer.num_params,
        param_bytes=layer.param_bytes,
        num_tied_params=layer.num_tied_params,
        num_frozen_params=layer.num_frozen_params,
        param_shapes=layer.param_shapes if own_rule else [],
        param_names=layer.param_names if own_rule else [],
        input_bytes=layer.input_bytes,
        output_bytes=layer.output_bytes,
        tp=layer.tp if own_rule else new.tp,
    )


def _runtime_end(layer: LayerProfile, s: int, h: int, vocab: int, *, dropout: bool) -> LayerProfile:
    """The runtime's embedding or LM head of a built one (its own parameters kept): the head with
    its loss (Megatron's vocab-parallel cross-entropy keeps the fp32 logits from the microbatch's
    forward to its backward, an activation like any other; one all-reduce of the input gradient
    backward), the embedding with its dropout mask. Other layers as they are."""
    if layer.tp.kind == "head" and layer.gemm_shapes == [[s, vocab, h]]:
        new = _head(s, h, vocab)
    elif layer.tp.kind == "embedding" and vocab and layer.num_params >= vocab * h:
        new = _embed(s, h, vocab, layer.num_params >= (vocab + s) * h, dropout)
    else:
        return layer
    return dataclasses.replace(
        new,
        name=layer.name,
        num_params=layer.num_params,
        param_bytes=layer.param_bytes,
        num_tied_params=layer.num_tied_params,
        num_frozen_params=layer.num_frozen_params,
        input_bytes=layer.input_bytes,
        output_bytes=new.output_bytes if layer.tp.kind == "head" else layer.output_bytes,
    )


def as_runtime_builds(profile: ModelProfile, *, dropout: bool, flash: bool) -> ModelProfile:
    """A built model's profile as a runtime that builds its own model runs it (runtime behaviour
    `model_source` = "runtime": Megatron-LM and Megatron-Core build their GPTModel, torchtitan its
    Transformer, from the shape alone). Each standard transformer block becomes the closed-form
    block of its shape: the runtime's kernels save what that block saves (its fused norms and
    activations, its dropout, its attention core; the planner adds the runtime's unfused traffic,
    planner/elementwise.py), not what the profiled module's eager ops save (an fp32 RMSNorm
    chain, repeated K and V, a composite GeLU), and its GEMMs are the runtime's (Megatron's fused
    QKV). The embedding and LM head become the runtime's (_runtime_end). A profile without a
    standard block is returned as it is."""
    layers = [_runtime_block(lp, profile.heads, dropout=dropout, flash=flash) for lp in profile.layers]
    changed = sum(new is not old for new, old in zip(layers, profile.layers))
    if not changed:
        return profile
    gpt = any(lp.kind == "gpt_block" for lp in layers)
    s, h, vocab = profile.seq_len, profile.hidden, profile.vocab
    layers = [_runtime_end(lp, s, h, vocab, dropout=dropout and gpt) for lp in layers]
    return dataclasses.replace(
        profile,
        layers=layers,
        notes=profile.notes
        + [f"{changed} standard block(s) priced as the runtime builds them (models/analytic.as_runtime_builds)"],
    )


def from_spec(spec: str, overrides: dict, *, flash: bool, dropout: bool) -> ModelProfile:
    """`--model analytic:gpt --set layers=... hidden=... heads=... [vocab= seq= ffn_hidden=]` (or
    analytic:llama, which also needs kv_heads and ffn_hidden): the closed-form profile, for plan and
    estimate only (no module is built). The runtime gives attention and dropout (gpt)."""
    from meshplan.errors import MeshplanError

    family = spec.partition(":")[2]
    need = {"gpt": ("layers", "hidden", "heads"), "llama": ("layers", "hidden", "heads", "kv_heads", "ffn_hidden")}
    if family not in need:
        raise MeshplanError(f"--model {spec}: use analytic:gpt or analytic:llama")
    missing = [k for k in need[family] if k not in overrides]
    allowed = set(need[family]) | {"vocab", "seq", "ffn_hidden"}
    unknown = sorted(set(overrides) - allowed)
    if missing or unknown:
        raise MeshplanError(
            f"--model {spec}: "
            + (
                f"--set {' '.join(k + '=N' for k in missing)} is required"
                if missing
                else f"--set {', '.join(unknown)} is unknown; use {', '.join(sorted(allowed))}"
            )
        )
    cfg = {k: _positive_int(spec, k, v) for k, v in overrides.items()}
    if cfg["hidden"] % cfg["heads"]:
        raise MeshplanError(
            f"--model {spec}: --set hidden={cfg['hidden']} is not divisible by heads={cfg['heads']}; "
            "pick heads that divide hidden"
        )
    if family == "llama" and cfg["heads"] % cfg["kv_heads"]:
        raise MeshplanError(
            f"--model {spec}: --set heads={cfg['heads']} is not a multiple of kv_heads={cfg['kv_heads']}; "
            "pick kv_heads that divide heads"
        )
    if family == "gpt":
        return gpt_profile(**cfg, dropout=dropout, flash=flash, name=spec)
    return llama_profile(**cfg, name=spec)


def _positive_int(spec: str, key: str, value) -> int:
    """A shape from --set: a whole number >= 1 (int(64.5) would silently plan hidden 64)."""
    from meshplan.errors import MeshplanError

    number = value
    if isinstance(value, str):
        try:
            number = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            number = None
    whole = isinstance(number, int) or (isinstance(number, float) and number.is_integer())
    if isinstance(number, bool) or not whole or number < 1:
        raise MeshplanError(f"--model {spec}: --set {key}={value}: expected a whole number >= 1")
    return int(number)


GPT3_175B = dict(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048)
LLAMA3_405B = dict(layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256, seq=8192)
