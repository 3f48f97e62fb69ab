"""The GPU presets take their spec-sheet numbers from the shipped meshplan/data/hardware.csv (one
source of truth): each preset equals its row, read here independently of meshplan.presets."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import meshplan
from meshplan.presets import cluster_preset

CSV = Path(meshplan.__file__).parent / "data" / "hardware.csv"
ROWS = {
    "a100-40g": "A100-SXM4-40GB",
    "a100-80g": "A100-SXM4-80GB",
    "h100-80g": "H100-SXM5-80GB",
    "h100-96g": "H100 96GB HBM2e (Meta Grand Teton, 500W)",
    "h800-80g": "H800-SXM5-80GB",
    "h200-141g": "H200-SXM-141GB",
    "b200-180g": "B200-SXM-180GB",
}


@pytest.mark.parametrize("preset, gpu", sorted(ROWS.items()))
def test_preset_is_its_hardware_csv_row(preset, gpu):
    with CSV.open(encoding="utf-8") as f:
        (row,) = [r for r in csv.DictReader(f) if r["gpu"] == gpu]
    spec = cluster_preset(preset, 16)
    assert spec.device.peak_flops["bf16"] == float(row["bf16_dense_tflops"]) * 1e12
    assert spec.device.memory_bytes == int(float(row["hbm_gb"]) * 1e9)
    assert spec.device.hbm_gbps == pytest.approx(float(row["hbm_tb_s"]) * 1000)
    assert spec.intra_node.bandwidth_gbps == float(row["nvlink_gb_s_per_gpu_unidir"])
    assert spec.inter_node.bandwidth_gbps == float(row["typical_internode_gb_s_per_gpu"])
    assert spec.source == f"meshplan/data/hardware.csv {gpu}"


XLA_SM90_BF16_TFLOPS = {
    (1, 1024): 236.3,
    (4, 1024): 489.8,
    (1, 2048): 632.0,
    (2, 2048): 717.7,
    (4, 2048): 725.7,
    (1, 4096): 783.3,
}
"""OpenXLA xla/service/gpu/model/matmul_interpolator_data.h, table "sm_90", "bf16xbf16->bf16":
measured TFLOP/s of b x n x n x n GEMMs (typed here from the source, apart from presets.py)."""


@pytest.mark.parametrize("preset", ["h100-80g", "h800-80g", "h200-141g"])
def test_hopper_gemm_curve_is_the_cited_measurement(preset):
    """The Hopper parts' bf16 curve passes through XLA's measured H100 GEMMs (times the framework
    fraction the A100 curve carries) and ends at the MAMF plateau 794.5/989; between the points it
    never falls as GEMMs grow."""
    from meshplan.planner.cost.compute import gemm_efficiency
    from meshplan.presets import FRAMEWORK_GEMM_FRACTION

    curve = cluster_preset(preset, 8).device.gemm_efficiency
    for (b, n), tflops in XLA_SM90_BF16_TFLOPS.items():
        eff = gemm_efficiency(curve, 2.0 * b * n**3)
        assert eff * 989 / FRAMEWORK_GEMM_FRACTION == pytest.approx(tflops, rel=0.01)
    assert gemm_efficiency(curve, 1e13) * 989 / FRAMEWORK_GEMM_FRACTION == pytest.approx(794.5, rel=1e-3)
    sizes = [10 ** (6 + k / 20) for k in range(141)]
    effs = [gemm_efficiency(curve, f) for f in sizes]
    assert all(b >= a for a, b in zip(effs, effs[1:]))


def test_hopper_curve_scales_with_the_part_and_fp8_rate():
    """The 835-TFLOP/s 96 GB part reaches a fraction at 835/989 of the FLOPs (fixed per-kernel time);
    fp8 reaches it at twice the FLOPs, with the fp8 MAMF plateau (0.709 of its peak)."""
    from meshplan.planner.cost.compute import gemm_efficiency
    from meshplan.presets import FRAMEWORK_GEMM_FRACTION

    sxm, part = cluster_preset("h100-80g", 8).device, cluster_preset("h100-96g", 8).device
    for f in (2.15e9, 1.72e10, 1.37e11):
        assert gemm_efficiency(part.gemm_efficiency, f * 835 / 989) == pytest.approx(
            gemm_efficiency(sxm.gemm_efficiency, f), rel=1e-9
        )
        assert gemm_efficiency(sxm.fp8_gemm_efficiency, 2 * f) == pytest.approx(
            gemm_efficiency(sxm.gemm_efficiency, f) * 0.709 / 0.803, rel=1e-3
        )
    assert gemm_efficiency(sxm.fp8_gemm_efficiency, 1e14) == pytest.approx(0.709 * FRAMEWORK_GEMM_FRACTION, rel=1e-3)


def test_h800_differs_from_h100_only_in_nvlink():
    """H800: the H100 SXM with NVLink cut to 400 GB/s bidirectional; a tensor-parallel plan pays for it."""
    h100, h800 = cluster_preset("h100-80g", 8), cluster_preset("h800-80g", 8)
    assert h800.intra_node.bandwidth_gbps == 200 and h100.intra_node.bandwidth_gbps == 450
    assert h800.device.peak_flops == h100.device.peak_flops
    assert h800.device.gemm_efficiency == h100.device.gemm_efficiency
    assert h800.inter_node == h100.inter_node


@pytest.mark.parametrize("preset, gpu", sorted(ROWS.items()))
def test_fp8_peak_is_its_hardware_csv_row_or_absent(preset, gpu):
    with CSV.open(encoding="utf-8") as f:
        (row,) = [r for r in csv.DictReader(f) if r["gpu"] == gpu]
    peaks = cluster_preset(preset, 8).device.peak_flops
    if row["fp8_dense_tflops"]:
        assert peaks["fp8"] == float(row["fp8_dense_tflops"]) * 1e12
        assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"], rel=1e-3)  # Hopper, Blackwell: twice bf16
    else:
        assert "fp8" not in peaks and row["fp8_source"].startswith("none")
    assert row["source"] and row["fp8_source"]


def test_presets_show_dense_bf16_and_fp8_apart_with_sources(capsys):
    """`meshplan presets` once showed max(peaks): 1979 (fp8) for H100 beside 312 (bf16) for A100."""
    import json

    from meshplan.cli import main

    assert main(["presets", "--json"]) == 0
    clusters = json.loads(capsys.readouterr().out)["clusters"]
    a100, h100 = clusters["a100-80g"], clusters["h100-80g"]
    assert (a100["bf16_dense_tflops"], a100["fp8_dense_tflops"]) == (312, None)
    assert (h100["bf16_dense_tflops"], h100["fp8_dense_tflops"]) == (989, 1979)
    assert h100["peak_tflops"] == 989  # the key kept, as the dense bf16 peak MFU is measured against
    assert "H100 SXM datasheet" in h100["peak_sources"]["fp8"] and "Ampere" in a100["peak_sources"]["fp8"]
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "bf16" in out and "fp8" in out and "peak sources" in out and "1979" in out
