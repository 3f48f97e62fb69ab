"""ModelProfile: the model as a chain of layers with their costs (docs/design.md, "The contracts").

Layers are the units a pipeline stage boundary can fall between (embedding, each block, head).
All per-layer quantities are per *sample* (one sequence, or one image) at the profiled sequence
length, so the cost model scales them by microbatch size. `graph()` returns the networkx DiGraph
in execution order; the JSON keeps the layers as an ordered list and the edges as FQN pairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshplan.schema import check

PROFILE_SCHEMA_VERSION = 1


@dataclass(kw_only=True)
class TPRule:
    """How tensor parallelism splits this layer (Megatron-style column/row pairs)."""

    column: list[str] = field(default_factory=list)
    """Child FQNs (relative to the layer) split along the output dim (ColwiseParallel)."""
    row: list[str] = field(default_factory=list)
    """Child FQNs split along the input dim (RowwiseParallel); each ends with an all-reduce."""
    replicated: list[str] = field(default_factory=list)
    """Child FQNs kept whole on every tensor-parallel rank (norms, biases of row layers)."""
    divisors: dict[str, int] = field(default_factory=dict)
    """Sizes the TP degree must divide, by name (e.g. {"heads": 12, "kv_heads": 4, "ffn": 3072})."""
    num_allreduce_fwd: int = 0
    """All-reduces of the layer output in forward (2 for a transformer block: attention + MLP)."""
    kind: str = "none"
    """"block" (attention+MLP), "embedding" (vocab-parallel), "head" (vocab-parallel logits),
    "conv" (channel split) or "none" (not splittable: replicated)."""


@dataclass(kw_only=True)
class LayerTiming:
    """Measured cost of one layer at one microbatch size on `ModelProfile.device`."""

    microbatch_size: int
    forward_s: float
    backward_s: float
    peak_bytes: int = 0
    """Measured peak of the layer's forward+backward (allocator or live-tensor tracker)."""
    predicted_peak_bytes: int = 0
    """What the analytic memory model predicts for the same forward+backward."""
    reused_from: str = ""
    """FQN of the representative layer this timing was measured on ("" if measured here)."""


@dataclass(kw_only=True)
class LayerProfile:
    name: str
    """Module FQN of the layer in the model (e.g. "embed", "layers.3", "head")."""
    kind: str
    """Layer type; identical kinds with identical shapes share one measurement."""
    num_params: int
    """Unique parameters of this layer: a weight tied to an earlier layer's is counted there
    (num_tied_params); frozen ones are included (num_frozen_params says how many)."""
    num_tied_params: int = 0
    """Parameters this layer uses that an earlier layer owns (a tied LM head): not in num_params;
    a pipeline stage holding this layer without the owner keeps a synchronised copy."""
    num_frozen_params: int = 0
    """Part of num_params with requires_grad=False: weights only, no gradients or optimizer states."""
    param_bytes: dict[str, int] = field(default_factory=dict)
    """Parameter bytes by dtype as built (e.g. {"float32": 4096})."""
    param_shapes: list[list[int]] = field(default_factory=list)
    """Shape of each trainable parameter, in registration order (what DDP buckets, PowerSGD's
    low-rank factors and FSDP2's dim-0 padding are computed from); empty when unknown (the cost
    model then treats the layer's parameters as one flat tensor)."""
    param_names: list[str] = field(default_factory=list)
    """Name (relative to the layer, e.g. "attn.qkv.weight") of each entry of param_shapes, in the
    same order: which TP rule child holds it, so the cost model knows the shard shapes the
    executor's tensor parallelism gives each tensor; empty when unknown (profiles written before
    it: each tensor is then taken as 1/t of itself)."""
    forward_flops: float
    """Forward FLOPs per sample (matmul FLOPs = 2 x MACs), attention included."""
    backward_flops: float
    """Backward FLOPs per sample (about 2x forward for GEMMs)."""
    activation_bytes: float
    """Bytes saved for backward per sample, no recompute, at the profiled activation dtype."""
    selective_activation_bytes: float = 0.0
    """Saved bytes per sample with selective recompute (attention core recomputed)."""
    recompute_flops_selective: float = 0.0
    """Extra forward FLOPs per sample spent by selective recompute."""
    tp_replicated_activation_bytes: float = 0.0
    """Part of activation_bytes that tensor parallelism does NOT split unless sequence parallel is
    on (layer-norm inputs, dropout masks, inputs of the column-parallel linears: the `10sbh` of
    Korthikanti et al. 2022 Eq. 2). 0 means unknown: the planner then assumes 10 x seq x hidden
    bytes per sample for transformer blocks."""
    input_bytes: float = 0.0
    """Bytes per sample entering the layer (what crosses a stage boundary before it)."""
    output_bytes: float = 0.0
    """Bytes per sample leaving the layer (what crosses a stage boundary after it)."""
    tp: TPRule = field(default_factory=TPRule)
    gemm_shapes: list[list[int]] = field(default_factory=list)
    """[m_per_sample, n, k] of the layer's main GEMMs; the cost model picks GEMM efficiency from
    these (m scales with microbatch x seq)."""
    timings: list[LayerTiming] = field(default_factory=list)
    """Measured timings by microbatch size (empty when profiled on meta)."""
    optimizer_step_s: float = 0.0
    """Measured seconds of the once-per-step work on this layer's parameters on the profiled
    device: AdamW step, gradient-norm clipping and zero_grad (0 when not measured, e.g. on meta;
    the cost model then uses the memory-bound formula)."""
    framework_overhead_s: dict[str, float] = field(default_factory=dict)
    """Measured extra seconds of the executor's parallel wrappers on this layer, on a one-rank
    mesh (per-op DTensor dispatch, FSDP2 hooks and copies: costs that do not shrink with the
    degree): "tp" and "fsdp" per microbatch forward+backward, "tp_optimizer" and
    "fsdp_optimizer" per step beyond optimizer_step_s. Empty when not measured."""

    def validate(self, path: str = "") -> None:
        check(self.num_params >= 0, f"{path}.num_params", self.num_params, "must be >= 0")
        check(self.forward_flops >= 0, f"{path}.forward_flops", self.forward_flops, "must be >= 0")
        check(self.backward_flops >= 0, f"{path}.backward_flops", self.backward_flops, "must be >= 0")
        check(self.activation_bytes >= 0, f"{path}.activation_bytes", self.activation_bytes, "must be >= 0")


@dataclass(kw_only=True)
class CodecTiming:
    """Measured compute of one gradient compressor's codec on `ModelProfile.device`, per step and
    rank, at the real parameter shapes of each layer (profiler/codecs.py; planner/compression.py
    scales it to other settings, tensor-parallel shards and group sizes by its own model)."""

    params: dict[str, Any] = field(default_factory=dict)
    """The compressor parameters it was timed at (the registry defaults; Accordion in its
    critical setting, where every run starts)."""
    encode_s: dict[str, float] = field(default_factory=dict)
    """Layer FQN -> seconds of one rank's work on the layer's gradients that does not grow with
    the group: compression, and the decoding of an all-reduced payload."""
    decode_s: dict[str, float] = field(default_factory=dict)
    """Layer FQN -> seconds per rank of the group of decoding its all-gathered payload (0 for
    all-reduce compressors)."""
    refit_s: dict[str, float] = field(default_factory=dict)
    """Layer FQN -> seconds of one re-fit of its adaptive levels (ALQ/AMQ; paid every refit_every steps)."""


NORMS = ("LayerNorm", "RMSNorm")
ACTIVATIONS = ("gelu", "swiglu", "geglu", "relu")
POSITIONS = ("learned_absolute", "rope")


@dataclass(kw_only=True)
class ModelArchitecture:
    """A decoder's architecture beyond its shape (layers, hidden, heads and vocab are in model_config): what a
    trainer that builds its own model must be told to build this one (Megatron's architecture flags,
    torchtitan's model flavour). Names are Megatron's where it has them."""

    model_type: str
    """Which decoder: the zoo or closed-form family ("gpt", "llama") or the HF config's model_type
    ("llama", "gpt2", "mistral")."""
    kv_heads: int
    """Key/value heads: the attention heads, or fewer for grouped-query attention."""
    ffn_hidden: int
    """Width of the MLP's inner layer (of each of the gate and up projections when gated)."""
    norm: str
    """The blocks' and the final norm: "LayerNorm" or "RMSNorm"."""
    norm_eps: float
    """The norms' epsilon."""
    activation: str
    """The MLP: "gelu", "relu", or gated: "swiglu" (SiLU, Llama), "geglu" (GELU)."""
    position: str
    """Position embedding: "learned_absolute" (an embedding table per position) or "rope" (rotary)."""
    rope_theta: float = 0.0
    """Rotary base; 0 without rope."""
    bias: bool
    """Whether every linear layer of the blocks carries a bias (GPT) or none does (Llama)."""
    tied: bool
    """Whether the output layer is the input embedding's weight (GPT-2) or has its own (Llama 3.1 8B)."""
    qk_norm: bool = False
    """Whether queries and keys are normalised per head before attention (Qwen3; Megatron's --qk-layernorm)."""

    def validate(self, path: str = "") -> None:
        p = f"{path}." if path else ""
        check(self.kv_heads >= 1, f"{p}kv_heads", self.kv_heads, "must be >= 1")
        check(self.ffn_hidden >= 1, f"{p}ffn_hidden", self.ffn_hidden, "must be >= 1")
        check(self.norm in NORMS, f"{p}norm", self.norm, f"must be one of {', '.join(NORMS)}")
        check(self.norm_eps > 0, f"{p}norm_eps", self.norm_eps, "must be > 0")
        check(
            self.activation in ACTIVATIONS,
            f"{p}activation",
            self.activation,
            f"must be one of {', '.join(ACTIVATIONS)}",
        )
        check(self.position in POSITIONS, f"{p}position", self.position, f"must be one of {', '.join(POSITIONS)}")
        rope = self.position == "rope"
        check(
            (self.rope_theta > 0) == rope,
            f"{p}rope_theta",
            self.rope_theta,
            "must be > 0 with rope positions and 0 without",
        )


@dataclass(kw_only=True)
class ModelProfile:
    schema_version: int = PROFILE_SCHEMA_VERSION
    model_name: str
    """Zoo name, "file.py:factory", "module:factory" or "hf:NAME"."""
    model_config: dict[str, Any] = field(default_factory=dict)
    """The resolved config the model was built from (layers, hidden, heads, vocab, seq, ...)."""
    family: str = "gpt"
    """Model family: gpt, llama, bert, vit, moe, resnet, user, hf."""
    seq_len: int
    """Tokens per sample (1 for models without a sequence)."""
    param_dtype: str = "float32"
    """dtype the model was built in; the planner applies its own training precision."""
    activation_dtype_bytes: int = 2
    """Bytes per activation element that activation_bytes assume (2 = bf16 training)."""
    num_params: int
    forward_flops_per_sample: float
    num_layers: int
    """Number of repeated blocks (transformer layers); len(layers) also counts embed/head."""
    hidden: int = 0
    heads: int = 0
    vocab: int = 0
    device: str = "meta"
    """Where timings were measured: "meta" (none), "cpu", "cuda:<name>"."""
    concurrent: int = 1
    """How many processes were busy while timing (ranks that will share the host)."""
    layers: list[LayerProfile]
    edges: list[list[str]] = field(default_factory=list)
    """Graph edges [src_fqn, dst_fqn]; empty means the chain in list order (layer i's
    output_bytes cross the cut after it)."""
    edge_tensors: list[dict[str, float]] = field(default_factory=list)
    """Per edge, in the order of `edges`: the tensors it carries, value name -> bytes per sample
    (a U-Net's skip from layer i to layer j is the edge i -> j with the skip's bytes). A cut
    between layers k and k+1 sends every tensor of the edges spanning it, each once: the
    pipeline's boundary bytes (planner/pipeline.boundary_bytes). Empty when `edges` is."""
    structure_hash: str = ""
    """models.identity.structure_hash of the profiled model (module classes, parameter and
    buffer FQNs/shapes/dtypes, tied groups); "" in profiles written before it existed."""
    notes: list[str] = field(default_factory=list)
    """What the profiler did that a reader should know (reused measurements, approximations)."""
    step_overhead_s: dict[str, float] = field(default_factory=dict)
    """Whole-model, once-per-step costs measured in place on N CPU ranks (profiler/insitu.py):
    "ddp@D:bB" = the DDP-wrapped model's forward+backward (its gradient all-reduce included)
    minus the plain model's, on D-rank groups, at microbatch B; "zero1@D" = ZeRO-1's optimizer
    step (ZeroRedundancyOptimizer: its 1/D of the update and the parameter broadcast) minus the
    plain optimizer step / D; "model@1:bB" = the plain model's forward + loss + backward, absolute
    (the scale of the per-layer timings); "optimizer@1" = the plain whole-model optimizer step,
    absolute; "pp@P:bB" = a P-stage 1F1B pipeline's per-microbatch cost beyond the plain block pass
    (profiler/insitu.py PipelineCase). Empty when not measured."""
    architecture: ModelArchitecture | None = field(default=None, metadata={"omit_empty": True})
    """The decoder's architecture beyond its shape, as built (models/zoo, models/analytic, models/hf_arch.py);
    absent for other models, decoders meshplan cannot name, and profiles written before it."""
    codec_timings: dict[str, CodecTiming] = field(default_factory=dict)
    """Compressor name -> its codec's measured compute (profiler/codecs.py); empty on meta and in
    profiles written before it existed (the planner then models the compute)."""

    def validate(self, path: str = "") -> None:
        p = f"{path}." if path else ""
        check(
            self.schema_version == PROFILE_SCHEMA_VERSION,
            f"{p}schema_version",
            self.schema_version,
            f"this meshplan reads ModelProfile schema {PROFILE_SCHEMA_VERSION}; re-run meshplan profile",
        )
        check(self.seq_len >= 1, f"{p}seq_len", self.seq_len, "must be >= 1")
        check(len(self.layers) >= 1, f"{p}layers", len(self.layers), "a profile needs at least one layer")
        check(
            sum(layer.num_params for layer in self.layers) > 0,
            f"{p}layers[*].num_params",
            0,
            "a profile of a model with no parameters has nothing to train; re-run meshplan profile",
        )
        names = [layer.name for layer in self.layers]
        dup = sorted({n for n in names if names.count(n) > 1})
        check(not dup, f"{p}layers", dup[:3], "layer names must be unique module FQNs")
        for i, layer in enumerate(self.layers):
            layer.validate(f"{p}layers[{i}]")
        known = set(names)
        for i, (src, dst) in enumerate(self.edges):
            check(src in known and dst in known, f"{p}edges[{i}]", [src, dst], "edges must join known layers")
        check(
            len(self.edge_tensors) in (0, len(self.edges)),
            f"{p}edge_tensors",
            len(self.edge_tensors),
            f"needs one entry per edge ({len(self.edges)}) or none",
        )

    @property
    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def layer(self, name: str) -> LayerProfile:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    def graph(self):
        """networkx DiGraph of layers in execution order; node attributes are the LayerProfile,
        edge attributes `tensors` (value name -> bytes per sample) and their sum `bytes`.
        networkx is optional (`pip install 'meshplan[graph]'`): the planner reads the layer list
        as a chain and never builds the graph."""
        try:
            import networkx as nx
        except ImportError:
            raise ImportError("ModelProfile.graph() needs networkx: pip install 'meshplan[graph]'") from None

        g = nx.DiGraph()
        for order, layer in enumerate(self.layers):
            g.add_node(layer.name, order=order, layer=layer)
        if self.edges:
            tensors = self.edge_tensors or [{} for _ in self.edges]
            for (a, b), carried in zip(self.edges, tensors):
                g.add_edge(a, b, tensors=dict(carried), bytes=sum(carried.values()))
            return g
        for a, b in zip(self.layers, self.layers[1:]):
            g.add_edge(a.name, b.name, tensors={"output": a.output_bytes}, bytes=a.output_bytes)
        return g
