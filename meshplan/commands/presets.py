"""`meshplan presets`: the model zoo and the cluster presets, with where each peak comes from."""

from __future__ import annotations

import argparse
from typing import Any

from meshplan.commands.output import print_json, print_table


def cmd_presets(args: argparse.Namespace) -> int:
    from meshplan.models.catalog import FAMILY_NAMES as FAMILIES
    from meshplan.models.catalog import ZOO
    from meshplan.presets import CLUSTER_PRESETS, cluster_preset, peak_table

    models: dict[str, dict[str, Any]] = {name: {"family": fam, **cfg} for name, (fam, cfg) in sorted(ZOO.items())}
    clusters: dict[str, dict[str, Any]] = {}
    peaks = peak_table()
    for name in CLUSTER_PRESETS:
        spec = cluster_preset(name, 8 if name != "local-cpu" else 4)
        (bf16, bf16_source), (fp8, fp8_source) = peaks[name]["bf16"], peaks[name]["fp8"]
        clusters[name] = {
            "device": spec.device.name,
            "peak_tflops": bf16,  # dense bf16, the peak MFU is measured against
            "bf16_dense_tflops": bf16,
            "fp8_dense_tflops": fp8,
            "peak_sources": {"bf16": bf16_source, "fp8": fp8_source},
            "memory_gib": spec.device.memory_bytes / 2**30,
            "devices_per_node": spec.devices_per_node,
            "intra_node_gbps": spec.intra_node.bandwidth_gbps,
            "inter_node_gbps": spec.inter_node.bandwidth_gbps,
        }
    if args.json:
        print_json({"models": models, "families": sorted(FAMILIES), "clusters": clusters})
        return 0
    from rich.table import Table

    table = Table(title="models (use --model NAME; families take --set)")
    for col in ("name", "family", "shape"):
        table.add_column(col)
    for name, cfg in models.items():
        table.add_row(name, cfg["family"], " ".join(f"{k}={v}" for k, v in cfg.items() if k != "family"))
    table.add_row("[dim]" + ", ".join(sorted(FAMILIES)), "family", "--set keys of the family config")
    ctable = Table(title="clusters (use --cluster NAME --num-gpus N)")
    cols = ("name", "device", "bf16 dense TFLOP/s", "fp8 dense TFLOP/s", "memory GiB", "per node", "NVLink GB/s")
    for col in (*cols, "inter-node GB/s"):
        ctable.add_column(col)
    for name, c in clusters.items():
        ctable.add_row(
            name,
            c["device"],
            f"{c['bf16_dense_tflops']:.4g}",
            f"{c['fp8_dense_tflops']:.4g}" if c["fp8_dense_tflops"] else "–",
            f"{c['memory_gib']:.0f}",
            str(c["devices_per_node"]),
            f"{c['intra_node_gbps']:g}",
            f"{c['inter_node_gbps']:g}",
        )
    print_table(args, table)
    print_table(args, ctable)
    sources = Table(title="peak sources (meshplan/data/hardware.csv)", show_lines=True)
    for col in ("name", "bf16 dense", "fp8 dense"):
        sources.add_column(col)
    for name, c in clusters.items():
        sources.add_row(name, c["peak_sources"]["bf16"], c["peak_sources"]["fp8"])
    print_table(args, sources)
    return 0
