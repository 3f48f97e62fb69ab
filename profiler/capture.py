"""Capture one layer's costs by running it forward+backward on fake tensors (nothing allocated).

The layer is copied into a FakeTensorMode on the CPU device and run in the profile's activation
dtype (bf16), under three observers at once:
- `FlopCounterMode` counts matmul/conv/attention FLOPs in forward and backward;
- a dispatch mode (`_OpTracker`) records GEMM shapes and which op produced each storage;
- `saved_tensors_hooks` see every tensor autograd saves for backward: their distinct storages,
  minus the parameters, are the layer's activation bytes (measured, not assumed); forward hooks
  attribute each to the submodule that saved it, which gives the share tensor parallelism
  leaves unsplit (norms, inputs of column-parallel linears).
CPU fake tensors run SDPA as the fused flash kernel, the path every real device takes, so the
s^2 attention matrix is never stored (see `activations.py` for the closed form this matches).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from meshplan.profiler.flop_formulas import ATTENTION_CORE_OPS, register_cpu_attention_formulas

aten = torch.ops.aten
_GEMM_OPS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default}


@dataclass
class LayerCapture:
    forward_flops: float
    backward_flops: float
    activation_bytes: int
    selective_activation_bytes: int
    recompute_flops_selective: float
    input_bytes: int
    output_bytes: int
    output: torch.Tensor | tuple[torch.Tensor, ...]
    """The fake output tensor (detached), the next layer's input; a tuple for a layer returning
    the several tensors crossing its cut."""
    gemm_shapes: list[list[int]] = field(default_factory=list)
    tp_replicated_bytes: int = 0
    """Saved bytes tensor parallelism leaves whole on every rank (see `replicated_bytes`)."""
    saved_bytes_by_dtype: dict[str, int] = field(default_factory=dict)
    """activation_bytes split by dtype (to rescale to another run precision)."""
    largest_saved: tuple[int, str] = (0, "")
    """(bytes, dtype) of the largest single saved storage."""


class _OpTracker(TorchDispatchMode):
    """Remembers the last op run, the producer op of each output storage and forward GEMM shapes."""

    def __init__(self):
        super().__init__()
        self.last_op = None
        self.producer: dict[int, object] = {}
        self.gemm_shapes: list[list[int]] = []
        self.record_gemms = True
        self.eager_core_flops = 0
        """Forward FLOPs of the bmm's that make or read an s x s score matrix (eager attention)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace != "prim":  # prim.device etc. come from our own hooks' queries
            self.last_op = func
        inputs = {_key(a) for a in args if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and _key(t) not in inputs:
                self.producer[_key(t)] = func  # a new storage (views keep theirs)
        if self.record_gemms and func in _GEMM_OPS:
            self.gemm_shapes.append(_gemm_shape(func, args))
            if func is aten.bmm.default and (_scores_shaped(out) or _scores_shaped(args[0])):
                m, n, k = self.gemm_shapes[-1]
                self.eager_core_flops += 2 * m * n * k  # QK^T (out s x s) or PV (in s x s)
        return out


EAGER_CORE_OPS = {
    aten.bmm.default,
    aten._softmax.default,
    aten.native_dropout.default,
    aten._to_copy.default,
    aten.mul.Tensor,
    aten.div.Tensor,
    aten.add.Tensor,
    aten.masked_fill.Scalar,
    aten.where.self,
}
"""Ops of an eager attention core (scores QK^T, scale, mask, softmax, dropout, PV): under a block's
rule, what they produce and alone save with an s x s trailing shape is the core's s^2 memory."""


def _scores_shaped(t) -> bool:
    """(..., s, s) with s > 1 and at least a batch or head dim: an attention score matrix."""
    return isinstance(t, torch.Tensor) and t.dim() >= 3 and t.shape[-1] == t.shape[-2] > 1


def _gemm_shape(func, args) -> list[int]:
    """[m, n, k] of a GEMM (batch of a bmm folded into m; conv as implicit GEMM)."""
    if func is aten.addmm.default:
        (m, k), n = args[1].shape, args[2].shape[1]
        return [m, n, k]
    if func is aten.mm.default:
        (m, k), n = args[0].shape, args[1].shape[1]
        return [m, n, k]
    if func is aten.bmm.default:
        (bt, m, k), n = args[0].shape, args[1].shape[2]
        return [bt * m, n, k]
    x, w = args[0], args[1]  # convolution: (N, C, H, W) x (Cout, Cin/g, kh, kw)
    out_pixels = x.shape[0] * _conv_out_pixels(x.shape[2:], w.shape[2:], args[3], args[4], args[5])
    return [out_pixels, w.shape[0], int(w[0].numel())]


def _conv_out_pixels(spatial, kernel, stride, padding, dilation) -> int:
    n = 1
    for size, k, s, p, d in zip(spatial, kernel, stride, padding, dilation):
        n *= (size + 2 * p - d * (k - 1) - 1) // s + 1
    return n


def fake_copy(layer: nn.Module, fake_mode, dtype: torch.dtype) -> nn.Module:
    """A copy of `layer` whose parameters and buffers are fake CPU tensors (floats in `dtype`)."""
    clone = copy.deepcopy(layer)
    with fake_mode:
        return clone._apply(
            lambda t: torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device="cpu")
        )


class _SavedTensors:
    """saved_tensors_hooks target: distinct non-parameter storages autograd keeps for backward,
    with the ops and the (innermost) submodules that saved them."""

    def __init__(self, layer: nn.Module, tracker: _OpTracker):
        self.params = {_key(p) for p in layer.parameters()}
        self.tracker = tracker
        self.saved: dict[int, tuple[int, set, str]] = {}  # storage -> (bytes, saving ops, dtype)
        self.modules: dict[int, set[str]] = {}  # storage -> FQNs (relative to the layer) saving it
        self.stack: list[str] = [""]
        self.keep: list[torch.Tensor] = []  # hold them so storage keys stay unique
        self.scores: set[int] = set()  # storages saved as (..., s, s) tensors

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _key(t)
        if key not in self.params:
            self.keep.append(t)
            entry = self.saved.setdefault(key, (t.untyped_storage().nbytes(), set(), str(t.dtype)))
            entry[1].add(self.tracker.last_op)
            if _scores_shaped(t):
                self.scores.add(key)
            self.modules.setdefault(key, set()).add(self.stack[-1])
        return t

    def track_modules(self, layer: nn.Module) -> list:
        """Forward hooks keeping `stack` = FQNs of the submodules running now; returns handles."""
        handles = []
        for fqn, module in layer.named_modules():
            if fqn:
                handles.append(module.register_forward_pre_hook(lambda m, a, fqn=fqn: self._enter(fqn)))
                handles.append(module.register_forward_hook(lambda m, a, o: self._exit()))
        return handles

    def _enter(self, fqn: str) -> None:
        self.stack.append(fqn)

    def _exit(self) -> None:
        self.stack.pop()

    def replicated_bytes(self, rule) -> int:
        """Korthikanti et al. 2022 Eq. 2's unsplit part: what the replicated children (norms) and the
        column-parallel linears (their full input) save. A layer TP cannot split: all of it."""
        if rule is None or rule.kind == "none":
            return self.total_bytes()
        parents = {c.rsplit(".", 1)[0] for c in rule.column if "." in c}  # a norm inside them sees local heads
        whole = [r for r in rule.replicated if r.rsplit(".", 1)[0] not in parents] + list(rule.column)
        inside = lambda fqn: any(fqn == c or fqn.startswith(c + ".") for c in whole)  # noqa: E731
        return sum(n for key, (n, _, _) in self.saved.items() if any(inside(m) for m in self.modules[key]))

    def total_bytes(self) -> int:
        return sum(n for n, _, _ in self.saved.values())

    def attention_core_only_bytes(self) -> int:
        """Bytes produced and saved only by the attention core: what selective recompute frees."""
        core = ATTENTION_CORE_OPS
        return sum(
            n for key, (n, savers, _) in self.saved.items() if savers <= core and self.tracker.producer.get(key) in core
        )

    def eager_core_bytes(self) -> int:
        """The s x s scores and probabilities an eager attention core makes and alone keeps
        (Korthikanti et al. 2022 Eq. 1's softmax output; here also its fp32 copy), or 0."""
        core = EAGER_CORE_OPS
        return sum(
            n
            for key, (n, savers, _) in self.saved.items()
            if key in self.scores and savers <= core and self.tracker.producer.get(key) in core
        )

    def by_dtype(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for n, _, dtype in self.saved.values():
            totals[dtype] = totals.get(dtype, 0) + n
        return totals

    def largest(self) -> tuple[int, str]:
        return max(((n, d) for n, _, d in self.saved.values()), default=(0, ""))


def capture_layer(layer: nn.Module, x: torch.Tensor | tuple, fake_mode, rule=None) -> LayerCapture:
    """Run a fake `layer` on fake input `x` forward and backward; see the module docstring.
    `rule` (the layer's TPRule) tells which saved bytes tensor parallelism would not split."""
    register_cpu_attention_formulas()
    _batch_statistics_on_one_value(layer, x)
    tracker = _OpTracker()
    saved = _SavedTensors(layer, tracker)
    handles = saved.track_modules(layer)
    with fake_mode, FlopCounterMode(display=False) as flops, tracker:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            y = layer(*x) if isinstance(x, tuple) else layer(x)
        for handle in handles:
            handle.remove()
        forward_flops, core_flops = flops.get_total_flops(), _core_flops(flops)
        tracker.record_gemms = False
        _backward(y)
        out = _detached(y)
    dropped = saved.attention_core_only_bytes()
    # eager attention (no fused SDPA op ran): its s x s scores are the core. Where SDPA ran, a saved
    # (..., n, n) tensor is no score matrix (the hidden states when seq == hidden, as in Llama-3 70B
    # at 8192 tokens)
    eager = core_flops == 0 and saved.eager_core_bytes()
    if rule is not None and rule.kind == "block" and eager:
        dropped, core_flops = dropped + saved.eager_core_bytes(), core_flops + tracker.eager_core_flops
    return LayerCapture(
        forward_flops=float(forward_flops),
        backward_flops=float(flops.get_total_flops() - forward_flops),
        activation_bytes=saved.total_bytes(),
        selective_activation_bytes=saved.total_bytes() - dropped,
        recompute_flops_selective=float(core_flops if dropped else 0),
        tp_replicated_bytes=saved.replicated_bytes(rule),
        input_bytes=_nbytes(x),
        output_bytes=_nbytes(y),  # a tuple of crossing tensors (models/fx_layers.py): their sum
        gemm_shapes=tracker.gemm_shapes,
        saved_bytes_by_dtype=saved.by_dtype(),
        largest_saved=saved.largest(),
        output=out,
    )


def _batch_statistics_on_one_value(layer: nn.Module, x) -> None:
    """A BatchNorm over one value per channel (the per-sample capture, where a ResNet's last
    stage is 1 x 1) cannot train: with one sample the fake copy's BatchNorms run on their running
    statistics (same FLOPs and shapes)."""
    first = x[0] if isinstance(x, tuple) else x
    if first.dim() >= 2 and first.shape[0] == 1:
        for module in layer.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()


def _key(t: torch.Tensor) -> int:
    """Identity of a tensor's storage (the C++ object, shared by views and Python re-wraps)."""
    return t.untyped_storage()._cdata


def _core_flops(counter: FlopCounterMode) -> int:
    """Forward FLOPs of attention-core ops so far (what selective recompute runs again)."""
    packets = {op.overloadpacket for op in ATTENTION_CORE_OPS}
    return sum(n for op, n in counter.get_flop_counts().get("Global", {}).items() if op in packets)


def _nbytes(t: torch.Tensor | tuple) -> int:
    if isinstance(t, tuple):
        return sum(_nbytes(v) for v in t)
    return t.numel() * t.element_size()


def _backward(y: torch.Tensor | tuple) -> None:
    """Backward from every output that needs a gradient, each with a gradient of ones (a
    layer cut from the fx graph returns the tuple of tensors crossing its cut; a skip it only
    passes on is a leaf: its gradient lands there and nothing else runs)."""
    outs = [t for t in (y if isinstance(y, tuple) else (y,)) if t.requires_grad]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])


def _detached(y: torch.Tensor | tuple) -> torch.Tensor | tuple:
    """The next layer's fake input(s): detached, floating-point ones requiring grad."""
    if isinstance(y, tuple):
        return tuple(_detached(t) for t in y)
    return y.detach().requires_grad_(y.is_floating_point())
