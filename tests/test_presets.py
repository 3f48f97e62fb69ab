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
