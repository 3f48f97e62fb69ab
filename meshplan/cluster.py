"""ClusterSpec: what the planner knows about the hardware (docs/design.md, "The contracts").

Bandwidths are GB/s (1e9 bytes per second) per device, unidirectional; latencies in seconds.
Presets come from spec sheets (see presets.py); `local` clusters are measured by
`meshplan profile-links` and carry alpha-beta fits per collective and group size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.schema import check

CLUSTER_SCHEMA_VERSION = 1
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "gather")
"""What a measured fit may name; "gather" is a fan-in to one root (profiler/links_worker.py)."""
EFFICIENCY_LIKE = {"gather": "send_recv"}
"""A collective without an efficiency of its own on a link takes this one's: a fan-in is N - 1
point-to-point flows into one link, not a collective over every rank's."""


@dataclass(kw_only=True)
class DeviceSpec:
    name: str
    """Device type, e.g. "A100-SXM4-80GB" or "cpu"."""
    kind: str = "cuda"
    """torch device type the executor uses: "cuda" or "cpu" (decides nccl vs gloo)."""
    peak_flops: dict[str, float]
    """Dense peak FLOP/s by compute dtype ("bf16", "fp16", "fp32")."""
    memory_bytes: int
    """Usable device memory per device."""
    hbm_gbps: float
    """Memory bandwidth in GB/s (memory-bound terms such as the optimizer step)."""
    gemm_efficiency: list[list[float]] = field(default_factory=list)
    """Achieved fraction of peak by GEMM size: [[flops_per_gemm, efficiency], ...], ascending.
    Interpolated in log(flops); the calibration of this device type (one curve per type)."""
    fp8_gemm_efficiency: list[list[float]] = field(default_factory=list)
    """The same curve for fp8 GEMMs against peak_flops["fp8"] (--precision fp8); empty: the bf16
    curve's fractions are used."""
    memory_reserved_fraction: float = 0.0
    """Fraction of memory_bytes kept free for the allocator, CUDA context and fragmentation."""

    def validate(self, path: str = "") -> None:
        p = f"{path}." if path else ""
        check(self.memory_bytes > 0, f"{p}memory_bytes", self.memory_bytes, "must be > 0")
        check(self.hbm_gbps > 0, f"{p}hbm_gbps", self.hbm_gbps, "must be > 0 GB/s")
        check(self.kind in ("cuda", "cpu"), f"{p}kind", self.kind, 'use "cuda" or "cpu"')
        check(bool(self.peak_flops), f"{p}peak_flops", self.peak_flops, 'give at least {"bf16": FLOP/s}')
        for dtype, flops in self.peak_flops.items():
            check(flops > 0, f"{p}peak_flops.{dtype}", flops, "must be > 0 FLOP/s")
        for i, point in enumerate(self.gemm_efficiency):
            check(
                len(point) == 2 and point[0] > 0 and 0 < point[1] <= 1,
                f"{p}gemm_efficiency[{i}]",
                point,
                "use [flops > 0, efficiency in (0, 1]]",
            )
        check(
            0 <= self.memory_reserved_fraction < 1,
            f"{p}memory_reserved_fraction",
            self.memory_reserved_fraction,
            "must be in [0, 1)",
        )


@dataclass(kw_only=True)
class LinkSpec:
    bandwidth_gbps: float
    """Peak unidirectional bandwidth per device in GB/s on this tier."""
    latency_s: float
    """Per-message latency (alpha) in seconds."""
    efficiency: dict[str, float] = field(default_factory=dict)
    """Achieved fraction of bandwidth_gbps by collective (missing: its EFFICIENCY_LIKE stand-in's,
    else "default", else 1.0)."""

    def validate(self, path: str = "") -> None:
        check(self.bandwidth_gbps > 0, f"{path}.bandwidth_gbps", self.bandwidth_gbps, "must be > 0 GB/s")
        check(self.latency_s >= 0, f"{path}.latency_s", self.latency_s, "must be >= 0 s")
        for name, eff in self.efficiency.items():
            check(0 < eff <= 1, f"{path}.efficiency.{name}", eff, "must be in (0, 1]")

    def effective_gbps(self, collective: str) -> float:
        default = self.efficiency.get("default", 1.0)
        like = EFFICIENCY_LIKE.get(collective)
        eff = self.efficiency.get(collective, self.efficiency.get(like, default) if like else default)
        return self.bandwidth_gbps * eff


@dataclass(kw_only=True)
class CollectiveFit:
    """A measured alpha-beta fit: time(bytes) = latency_s + bytes / (bandwidth_gbps * 1e9)."""

    collective: str
    """One of COLLECTIVES; a gather's bytes are each sender's message."""
    group_size: int
    tier: str = "intra_node"
    latency_s: float
    bandwidth_gbps: float
    """Algorithm bandwidth: message bytes / (time - latency), not bus bandwidth."""
    min_s: list[float] = field(default_factory=list)
    median_s: list[float] = field(default_factory=list)
    max_s: list[float] = field(default_factory=list)
    sizes_bytes: list[int] = field(default_factory=list)
    """Message sizes measured; min/median/max times align with these."""

    def validate(self, path: str = "") -> None:
        check(
            self.collective in COLLECTIVES,
            f"{path}.collective",
            self.collective,
            "use one of " + ", ".join(COLLECTIVES),
        )
        check(self.group_size >= 2, f"{path}.group_size", self.group_size, "must be >= 2")
        check(self.bandwidth_gbps > 0, f"{path}.bandwidth_gbps", self.bandwidth_gbps, "must be > 0")
        check(self.latency_s >= 0, f"{path}.latency_s", self.latency_s, "must be >= 0")

    def time_s(self, message_bytes: float) -> float:
        return self.latency_s + message_bytes / (self.bandwidth_gbps * 1e9)


@dataclass(kw_only=True)
class Calibration:
    """One calibration per device type (never per published row); documented in presets.py."""

    dp_overlap: float = 0.9
    """Fraction of bucketed data-parallel communication hidden behind backward compute."""
    tp_overlap: float = 0.0
    """Fraction of tensor-parallel communication hidden behind compute."""
    pp_overlap: float = 0.0
    """Fraction of pipeline point-to-point communication hidden behind compute."""
    kernel_overhead_s: float = 0.0
    """Fixed per-layer, per-microbatch overhead (kernel launches, framework) in seconds."""
    source: str = ""
    """Where these numbers come from."""

    def validate(self, path: str = "") -> None:
        for name in ("dp_overlap", "tp_overlap", "pp_overlap"):
            value = getattr(self, name)
            check(0 <= value <= 1, f"{path}.{name}", value, "must be in [0, 1]")
        check(self.kernel_overhead_s >= 0, f"{path}.kernel_overhead_s", self.kernel_overhead_s, "must be >= 0")


@dataclass(kw_only=True)
class ClusterSpec:
    schema_version: int = CLUSTER_SCHEMA_VERSION
    name: str
    """Preset name ("a100-80g", "local-cpu") or a user label."""
    device: DeviceSpec
    num_nodes: int
    devices_per_node: int
    intra_node: LinkSpec
    """NVLink (or shared memory between local CPU ranks)."""
    inter_node: LinkSpec
    """InfiniBand / RoCE / EFA, per device."""
    host_device: LinkSpec | None = None
    """PCIe host <-> device (offload)."""
    nvme: LinkSpec | None = None
    """Local NVMe per device (the node's drives shared by its devices); efficiency "read" and
    "write" scale bandwidth_gbps for each direction (offload=nvme)."""
    host_memory_gbps: float | None = None
    """Host DRAM bandwidth per device (the node's / devices per node), GB/s: the host optimizer
    step of offload=cpu/nvme is memory-bound (CPU Adam touches ~28 bytes per parameter)."""
    host_memory_bytes: int | None = None
    """Host DRAM per device (the node's / devices per node): what offload=cpu may fill."""
    collectives: list[CollectiveFit] = field(default_factory=list)
    """Measured fits; when present the cost model uses them instead of the link tiers."""
    calibration: Calibration = field(default_factory=Calibration)
    measured: bool = False
    """True when produced by `meshplan profile-links` rather than a spec sheet."""
    source: str = ""

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node

    def validate(self, path: str = "") -> None:
        p = f"{path}." if path else ""
        check(
            self.schema_version == CLUSTER_SCHEMA_VERSION,
            f"{p}schema_version",
            self.schema_version,
            f"this meshplan reads ClusterSpec schema {CLUSTER_SCHEMA_VERSION}; regenerate the file",
        )
        check(self.num_nodes >= 1, f"{p}num_nodes", self.num_nodes, "must be >= 1")
        check(self.devices_per_node >= 1, f"{p}devices_per_node", self.devices_per_node, "must be >= 1")

    def with_num_devices(self, num_devices: int) -> ClusterSpec:
        """The same hardware sized to `num_devices` (full nodes, or one partial node)."""
        import dataclasses

        per_node = min(self.devices_per_node, num_devices)
        nodes = -(-num_devices // self.devices_per_node)
        return dataclasses.replace(self, num_nodes=nodes, devices_per_node=per_node)

    def fit(self, collective: str, group_size: int) -> CollectiveFit | None:
        """The measured fit for this collective and group size (nearest group size if absent)."""
        fits = [f for f in self.collectives if f.collective == collective]
        if not fits:
            return None
        return min(fits, key=lambda f: (abs(f.group_size - group_size), f.group_size))
