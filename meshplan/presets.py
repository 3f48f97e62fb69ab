"""Cluster presets from spec sheets and the local CPU preset.

The spec-sheet numbers (dense bf16 TFLOP/s, HBM GB and TB/s, NVLink and inter-node GB/s per GPU)
are read from meshplan/data/hardware.csv, shipped with the package and cited per row: the one
source of truth. The calibration on top of them, one per device type, never per published row:
- gemm_efficiency: achieved fraction of dense bf16 peak by GEMM size (FLOPs of one GEMM).
  The large-GEMM plateau is the measured "maximum achievable matmul FLOPs" (MAMF) of
  stas00/ml-engineering compute/accelerator/README.md: A100 SXM 271.2/312 = 0.869,
  H100/H200 SXM 794.5/989 = 0.803. Smaller GEMMs fall off as tiles stop filling the SMs:
  A100 and B200 on the generic ramp of _curve; the Hopper parts (H100, H800, H200) on the
  measured H100 curve HOPPER_BF16_GEMM (OpenXLA's GEMM performance table).
- link efficiency: nccl-tests all-reduce bus bandwidth over wire bandwidth — A100 node
  235/300 = 0.78 (ml-engineering network/README.md); H200 ring 365.6/450 = 0.81. Inter-node:
  A100_INTERNODE_EFFICIENCY, measured on Selene at scale; the other types 0.9 as in calculon's
  system files (no at-scale measurement was available for them).
- framework GEMM fraction 0.896: MAMF is the best GEMM over a sweep of shapes; a training
  framework's GEMMs reach less. The planner's A100 layer model (planner/layer_cost.py: GEMMs on
  this curve, the materialised attention core as the batched GEMM Megatron-LM runs it —
  planner/compute.attention_efficiency —, memory-bound kernels, TP all-reduces) reproduces the
  measured 22B GPT layer of Korthikanti et al. 2022 Table 4 (b=4, t=8, no recompute: 7.7 + 11.9 =
  19.6 ms) with the plateau at 0.896 x MAMF (0.946 while the core was read at one head's GEMM
  size, which left it 2x slow); the other device types take the same framework/MAMF ratio. Table 4's
  other four rows (sequence parallel, full, selective, selective+sequence) are then predictions,
  checked in tests/test_cost_model.py. Not fitted to any end-to-end published run.
- dp_overlap: fraction of bucketed gradient communication hidden behind backward (DDP/FSDP
  overlap everything but the last bucket).
- memory: the spec sheet's "80 GB" is read as 80e9 bytes (74.5 GiB), then 5% is reserved. The
  parts hold 80 GiB (nvidia-smi 81920 MiB), so plans keep ~11% of the card free for the CUDA
  context, NCCL buffers and allocator fragmentation, which the memory model does not count; no GPU
  measurement of predicted vs measured peak was available to narrow it (benchmarks/gpu_check.py).
"""

from __future__ import annotations

import csv
import functools
import io
import os
from importlib import resources

from meshplan.cluster import Calibration, ClusterSpec, DeviceSpec, LinkSpec
from meshplan.errors import MeshplanError

GIB = 1024**3
FRAMEWORK_GEMM_FRACTION = 0.896
"""Achieved large-GEMM throughput in training frameworks over MAMF (see module docstring)."""
GB = 1e9
A100_INTERNODE_EFFICIENCY = {"default": 0.34, "send_recv": 0.74}
"""Achieved fraction of the 25 GB/s per-GPU HDR InfiniBand on DGX A100 (Selene, a 3-level fat tree)
with the whole machine communicating, from the network figures Narayanan et al. 2021 measured for
the 1T model on 3072 GPUs: data-parallel all-reduce at an
effective bisection bandwidth of 12.9 TB/s, i.e. 12.9 TB/s over the 1536 GPUs on one side =
8.4 GB/s of bus bandwidth per GPU (0.34); pipeline sends at 892 GB/s over the 48 GPU pairs that cross the middle
stage boundary (6 replicas x t = 8) = 18.6 GB/s each (0.74). Held out, Korthikanti et al. 2022
Sec 6.3 measures 8-way data parallelism of the 530B model adding 1.32 s for a 13.2 GB ring
all-reduce per GPU: 10 GB/s (0.40). Jobs inside one leaf switch see more (two-node nccl-tests reach
~0.85 of the NICs)."""

FP8_MAMF = {"h100": 0.709, "h200": 0.734, "b200": 0.80}
"""Measured fp8 MAMF fraction of the dense fp8 peak (hardware.csv's fp8_dense_tflops, with its
source): ml-engineering compute/accelerator/README.md, H100 SXM 1402.6 / 1979 = 0.709, H200
1453.4 / 1979 = 0.734. B200: no fp8 MAMF in the stored sources; its bf16 plateau fraction (0.80)
is assumed. The fp8 ramp scales with the fp8 peak (_curve), the framework fraction is the bf16 one."""

PRESET_ROWS = {
    "a100-40g": "A100-SXM4-40GB",
    "a100-80g": "A100-SXM4-80GB",
    "h100-80g": "H100-SXM5-80GB",
    "h100-96g": "H100 96GB HBM2e (Meta Grand Teton, 500W)",
    "h800-80g": "H800-SXM5-80GB",
    "h200-141g": "H200-SXM-141GB",
    "b200-180g": "B200-SXM-180GB",
}
"""GPU preset -> its row of meshplan/data/hardware.csv (spec-sheet numbers and their sources)."""


HOST = {"a100": (51.2, 250), "h100": (76.8, 250), "h800": (76.8, 250), "h200": (76.8, 250), "b200": (89.6, 500)}
"""Host DRAM (bandwidth GB/s, capacity GB) per GPU of the DGX node, from the CPUs' memory
channels: DGX A100 2x EPYC 7742, 8 ch DDR4-3200 each = 409.6 GB/s, 2 TB; DGX H100/H200 2x Xeon
8480C, 8 ch DDR5-4800 = 614.4 GB/s, 2 TB; DGX B200 2x Xeon 8570, 8 ch DDR5-5600 = 716.8 GB/s,
4 TB (NVIDIA DGX user guides' system specifications); / 8 GPUs, capacity rounded down for the OS.
Peak channel bandwidth: STREAM reaches ~70-80% of it, which the CPU-Adam model leaves in the
28 bytes it charges per parameter (planner/offload.py). The H800 (HGX H800 boards) and the 96 GB
H100 take the DGX H100 host: no sheet of their hosts was available."""

H100_96G = "H100 96GB HBM2e (Meta Grand Teton, 500W)"
"""hardware.csv's row of the 96 GB HBM2e SXM H100 capped at 500 W (torchtitan's 2024 benchmarks):
bf16 peak taken as the H100 NVL's 835 TFLOP/s dense, the lower end of torchtitan's "between SXM
and NVL"; fp8 twice that (NVL product brief: 3,341 sparse); the SXM's MAMF fractions."""
NVME_READ_GBPS = 3.5
NVME_WRITE_FRACTION = 0.54
"""Local NVMe per GPU: DGX A100/H100 hold 8 x 3.84 TB U.2 PCIe Gen4 data drives (DGX user guides),
Samsung PM1733-class: 7.0 GB/s sequential read, 3.8 GB/s write each (vendor spec sheet); as
RAID-0 shared by 8 GPUs, 7.0 GB/s read per GPU, but DeepSpeed's ZeRO-Infinity runs reach about
half the raw drive rate (SC'21 Sec 8 used 3.5 GB/s per GPU-equivalent): 3.5 GB/s read, write at
3.8/7.0 of it."""


HOPPER_BF16_GEMM = (
    (3.36e7, 6.45),
    (1.34e8, 22.55),
    (2.68e8, 81.0),
    (2.15e9, 236.3),
    (8.59e9, 489.8),
    (1.72e10, 632.0),
    (3.44e10, 717.7),
    (6.87e10, 725.7),
    (1.37e11, 783.3),
    (5.50e11, 794.5),
)
"""Measured bf16 GEMM throughput on an H100 SXM (989 TFLOP/s peak): (FLOPs of one GEMM, TFLOP/s).
Source: OpenXLA's default matmul performance table, xla/service/gpu/model/matmul_interpolator_data.h
(kDefaultMatmulPTable, key "sm_90", "bf16xbf16->bf16"), the cube shapes b x n x n x n (FLOPs
2bn^3): 1x256^3, 4x256^3, 2x512^3, 1x1024^3, 4x1024^3, 1x2048^3, 2x2048^3, 4x2048^3, 1x4096^3.
The table stops at 4096 per dimension; above it the plateau is the MAMF 794.5 TFLOP/s
(ml-engineering; the table's 2x and 4x 4096^3 read 807.7 and 793.1, the same level). Not taken
from any training run. The H800 and H200 are the same die and clocks (their curve is this one);
a part with another peak scales the FLOPs axis as _curve does (fixed per-kernel time)."""


def _measured_curve(points, measured_peak_tflops: float, tflops: float) -> list[list[float]]:
    """A measured (FLOPs, TFLOP/s) curve as (FLOPs, fraction of peak) for a part of `tflops`,
    times the framework fraction (the A100 curve's plateau carries it too)."""
    scale = tflops / measured_peak_tflops
    return [[f * scale, round(t / measured_peak_tflops * FRAMEWORK_GEMM_FRACTION, 4)] for f, t in points]


def _curve(plateau: float, tflops: float = 312.0) -> list[list[float]]:
    """Efficiency vs GEMM FLOPs: on an A100 (312 TFLOP/s) it ramps from ~20% of the plateau at 1e8
    FLOPs to the plateau at 1e12. The ramp is set by per-kernel fixed time (launch, prologue,
    the last partial wave of tiles), so a device k times faster needs k times the FLOPs to reach
    the same fraction: the points scale with peak / 312 TFLOP/s."""
    points = [(1e6, 0.02), (1e8, 0.20), (1e9, 0.45), (1e10, 0.72), (1e11, 0.92), (1e12, 1.0)]
    scale = tflops / 312.0
    return [[flops * scale, round(frac * plateau, 4)] for flops, frac in points]


def _gpu(
    name: str,
    tflops: float,
    mem_gb: float,
    hbm_tbs: float,
    nvlink_gbps: float,
    internode_gbps: float,
    plateau: float,
    nvlink_eff: float,
    source: str,
    internode_eff: dict[str, float] | None = None,
    fp8: tuple[float, float] | None = None,
    hopper: bool = False,
) -> ClusterSpec:
    """fp8: (dense fp8 TFLOP/s, fp8 MAMF fraction of it) where the part has fp8 tensor cores.
    hopper: the bf16 GEMMs on the measured H100 curve (HOPPER_BF16_GEMM), fp8 on the same curve at
    the fp8 rate (FLOPs axis x fp8/bf16 peak) with the fp8 MAMF plateau (fractions x fp8 MAMF /
    bf16 MAMF); else the generic ramp of _curve."""
    peaks = {"bf16": tflops * 1e12, "fp16": tflops * 1e12, "fp32": tflops * 1e12 / 16}
    if fp8:
        peaks["fp8"] = fp8[0] * 1e12
    return ClusterSpec(
        name=name,
        device=DeviceSpec(
            name=name.upper(),
            kind="cuda",
            peak_flops=peaks,
            memory_bytes=int(mem_gb * GB),
            hbm_gbps=hbm_tbs * 1000,
            gemm_efficiency=_bf16_curve(plateau, tflops, hopper),
            fp8_gemm_efficiency=_fp8_curve(fp8, plateau, tflops, hopper) if fp8 else [],
            memory_reserved_fraction=0.05,
        ),
        num_nodes=1,
        devices_per_node=8,
        intra_node=LinkSpec(bandwidth_gbps=nvlink_gbps, latency_s=8e-6, efficiency={"default": nvlink_eff}),
        inter_node=LinkSpec(
            bandwidth_gbps=internode_gbps, latency_s=2e-5, efficiency=dict(internode_eff or {"default": 0.9})
        ),
        host_device=LinkSpec(bandwidth_gbps=32 if "a100" in name else 64, latency_s=1e-5, efficiency={"default": 0.87}),
        nvme=LinkSpec(
            bandwidth_gbps=NVME_READ_GBPS, latency_s=1e-4, efficiency={"read": 1.0, "write": NVME_WRITE_FRACTION}
        ),
        host_memory_gbps=HOST[name.split("-")[0]][0],
        host_memory_bytes=int(HOST[name.split("-")[0]][1] * GB),
        calibration=Calibration(
            dp_overlap=0.9,
            tp_overlap=0.0,
            pp_overlap=0.0,
            kernel_overhead_s=0.0,
            source="spec sheet + MAMF and nccl-tests fractions; see meshplan/presets.py",
        ),
        source=source,
    )


def _bf16_curve(plateau: float, tflops: float, hopper: bool) -> list[list[float]]:
    if hopper:
        return _measured_curve(HOPPER_BF16_GEMM, 989.0, tflops)
    return _curve(plateau * FRAMEWORK_GEMM_FRACTION, tflops)


def _fp8_curve(fp8: tuple[float, float], plateau: float, tflops: float, hopper: bool) -> list[list[float]]:
    if not hopper:
        return _curve(fp8[1] * FRAMEWORK_GEMM_FRACTION, fp8[0])
    ratio = fp8[1] / plateau  # fp8 MAMF fraction over the bf16 one
    return [[f * fp8[0] / tflops, round(e * ratio, 4)] for f, e in _bf16_curve(plateau, tflops, True)]


@functools.cache
def hardware_table() -> dict[str, dict[str, str]]:
    """meshplan/data/hardware.csv by its `gpu` column (values as written)."""
    text = resources.files("meshplan.data").joinpath("hardware.csv").read_text(encoding="utf-8")
    return {row["gpu"]: row for row in csv.DictReader(io.StringIO(text))}


def _number(text: str) -> float:
    """A table cell as written: "312" an int, "2.0" a float."""
    return int(text) if text.isdigit() else float(text)


def _sheet(gpu: str) -> dict:
    """_gpu's spec-sheet arguments from hardware.csv's row `gpu`."""
    row = hardware_table()[gpu]
    cols = {
        "tflops": "bf16_dense_tflops",
        "mem_gb": "hbm_gb",
        "hbm_tbs": "hbm_tb_s",
        "nvlink_gbps": "nvlink_gb_s_per_gpu_unidir",
        "internode_gbps": "typical_internode_gb_s_per_gpu",
    }
    return {arg: _number(row[col]) for arg, col in cols.items()} | {"source": f"meshplan/data/hardware.csv {gpu}"}


def _fp8(gpu: str, mamf: str) -> tuple[float, float]:
    """(dense fp8 TFLOP/s from hardware.csv, fp8 MAMF fraction) of a part with fp8 tensor cores."""
    return float(hardware_table()[gpu]["fp8_dense_tflops"]), FP8_MAMF[mamf]


def peak_table() -> dict[str, dict[str, tuple[float | None, str]]]:
    """Preset -> {"bf16": (dense TFLOP/s, source), "fp8": (dense TFLOP/s or None, source)}: the
    two peaks `meshplan presets` shows side by side (a part's fp8 peak is twice its bf16 one on
    Hopper and Blackwell; an A100 has none)."""
    out: dict[str, dict[str, tuple[float | None, str]]] = {}
    for name, gpu in PRESET_ROWS.items():
        row = hardware_table()[gpu]
        fp8 = row["fp8_dense_tflops"]
        out[name] = {
            "bf16": (float(row["bf16_dense_tflops"]), row["source"]),
            "fp8": (float(fp8) if fp8 else None, row["fp8_source"]),
        }
    cpu = local_cpu(1).device.peak_flops["bf16"] / 1e12
    out["local-cpu"] = {
        "bf16": (cpu, "nominal; meshplan profile --device cpu measures layer times, which the cost model prefers"),
        "fp8": (None, "none: CPU ranks"),
    }
    return out


def _ampere(name: str, row: str) -> ClusterSpec:
    """An A100 part: MAMF plateau 0.869, NVLink 0.78, DGX A100 inter-node fractions; no fp8."""
    return _gpu(name, **_sheet(row), plateau=0.869, nvlink_eff=0.78, internode_eff=A100_INTERNODE_EFFICIENCY)


def _hopper(name: str, row: str, mamf: str) -> ClusterSpec:
    """An H100/H800/H200 part: MAMF plateau 0.803, NVLink 0.81, the Hopper GEMM curve, fp8 from
    the `mamf` chip's fractions."""
    return _gpu(name, **_sheet(row), plateau=0.803, nvlink_eff=0.81, fp8=_fp8(row, mamf), hopper=True)


def _gpu_presets() -> dict[str, ClusterSpec]:
    return {
        "a100-40g": _ampere("a100-40g", PRESET_ROWS["a100-40g"]),
        "a100-80g": _ampere("a100-80g", PRESET_ROWS["a100-80g"]),
        "h100-80g": _hopper("h100-80g", PRESET_ROWS["h100-80g"], "h100"),
        "h100-96g": _hopper("h100-96g", H100_96G, "h100"),
        "h800-80g": _hopper("h800-80g", PRESET_ROWS["h800-80g"], "h100"),
        "h200-141g": _hopper("h200-141g", PRESET_ROWS["h200-141g"], "h200"),
        "b200-180g": _gpu(
            "b200-180g",
            **_sheet(PRESET_ROWS["b200-180g"]),
            plateau=0.80,
            nvlink_eff=0.76,
            fp8=_fp8(PRESET_ROWS["b200-180g"], "b200"),
        ),
    }


def local_cpu(num_ranks: int = 4) -> ClusterSpec:
    """This machine: N CPU ranks on one node sharing host memory; links are gloo over loopback.

    Spec-sheet numbers are nominal; `meshplan profile-links` replaces the links with measured fits
    and `meshplan profile --device cpu` gives measured layer times, which the cost model prefers.
    """
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 16 * GIB
    per_rank = int(total * 0.8 / max(num_ranks, 1))
    return ClusterSpec(
        name="local-cpu",
        device=DeviceSpec(
            name="cpu",
            kind="cpu",
            peak_flops={"fp32": 5e10, "bf16": 5e10},
            memory_bytes=per_rank,
            hbm_gbps=10.0,
            gemm_efficiency=[[1e4, 0.05], [1e6, 0.3], [1e8, 0.8], [1e10, 1.0]],
        ),
        num_nodes=1,
        devices_per_node=num_ranks,
        intra_node=LinkSpec(bandwidth_gbps=1.0, latency_s=1e-4, efficiency={"default": 1.0}),
        inter_node=LinkSpec(bandwidth_gbps=1.0, latency_s=1e-4, efficiency={"default": 1.0}),
        # the host is the device: offload=cpu moves nothing; offload=nvme goes to the local disk
        # (nominal 0.5 GB/s; benchmarks/offload.py measures it)
        nvme=LinkSpec(bandwidth_gbps=0.5, latency_s=1e-4, efficiency={"read": 1.0, "write": 1.0}),
        host_memory_gbps=10.0,
        host_memory_bytes=per_rank,
        calibration=Calibration(
            dp_overlap=0.0,
            tp_overlap=0.0,
            pp_overlap=0.0,
            kernel_overhead_s=0.0,
            source="nominal; run `meshplan profile-links` for measured links",
        ),
        source="local CPU ranks (gloo)",
    )


CLUSTER_PRESETS = (
    "a100-40g",
    "a100-80g",
    "h100-80g",
    "h100-96g",
    "h800-80g",
    "h200-141g",
    "b200-180g",
    "local-cpu",
)


def cluster_preset(name: str, num_devices: int) -> ClusterSpec:
    """A preset sized to `num_devices` (8 per node for GPUs; N ranks on one node for local-cpu)."""
    if num_devices < 1:
        raise MeshplanError(f"--num-gpus {num_devices}: must be >= 1")
    if name == "local-cpu":
        return local_cpu(num_devices)
    presets = _gpu_presets()
    if name not in presets:
        raise MeshplanError(
            f"cluster {name!r} is not a preset; use one of {', '.join(CLUSTER_PRESETS)} "
            "or a cluster.json from meshplan profile-links"
        )
    return presets[name].with_num_devices(num_devices)


def load_cluster(name_or_path: str, num_devices: int | None) -> ClusterSpec:
    """A preset name or a ClusterSpec JSON file, resized to `num_devices` when given."""
    from meshplan import schema

    if name_or_path.endswith(".json") or os.path.sep in name_or_path:
        spec = schema.load(ClusterSpec, name_or_path, "cluster")
        return spec.with_num_devices(num_devices) if num_devices else spec
    return cluster_preset(name_or_path, num_devices or (4 if name_or_path == "local-cpu" else 8))
