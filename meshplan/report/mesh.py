"""The parallel layout as a picture: which ranks sit on which node, each axis's groups, and which
link each axis's traffic uses, with its bytes per step.

Ranks are numbered by the plan's rank_placement, outermost axis first (torchtitan's mesh order
"pp,dp_replicate,dp_shard,cp,tp": tp is innermost, so a TP group is consecutive ranks). An axis of
degree d and stride s (the product of the degrees inside it) groups ranks r, r+s, ..., r+(d-1)s;
the group stays inside a node when its first and last rank do, and then its traffic uses the
intra-node link (NVLink on GPU presets), else the inter-node network. Nodes come from the
cluster preset the plan names (8 GPUs a node); a cluster from a file is drawn as one node.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.plan import Plan
from meshplan.report import fmt
from meshplan.report.svg import PALETTE, rect, svg_open, text

AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
TERM = {"pp": "pp_comm", "dp_replicate": "dp_comm", "dp_shard": "dp_comm", "cp": "cp_comm", "tp": "tp_comm"}
WHAT = {
    "pp": "pipeline stages: activations forward, gradients back (p2p)",
    "dp_replicate": "data-parallel replicas: gradient all-reduce",
    "dp_shard": "data-parallel shards (ZeRO/FSDP): reduce-scatter, all-gather",
    "cp": "context parallel: key/value ring",
    "tp": "tensor parallel: all-reduce / all-gather of activations",
}
MAX_NODES_DRAWN = 256


def stage_colour(stage: int, pp: int) -> str:
    """The palette up to 8 stages; beyond, evenly spaced hues, alternating lightness so that
    neighbouring stages differ."""
    if pp <= len(PALETTE):
        return PALETTE[stage % len(PALETTE)]
    hue = round(360 * stage / pp) % 360
    return f"hsl({hue},{60 if stage % 2 else 70}%,{42 if stage % 2 else 55}%)"


@dataclass(frozen=True)
class Layout:
    degrees: dict[str, int]
    order: list[str]
    """Outermost first."""
    devices_per_node: int
    device: str
    """"GPU" or "rank" (CPU ranks are not GPUs)."""
    intra_link: str
    inter_link: str
    from_preset: bool

    @property
    def world(self) -> int:
        out = 1
        for d in self.degrees.values():
            out *= d
        return out

    @property
    def num_nodes(self) -> int:
        return -(-self.world // self.devices_per_node)

    def stride(self, axis: str) -> int:
        s = 1
        for inner in self.order[self.order.index(axis) + 1 :]:
            s *= self.degrees[inner]
        return s

    def coords(self, rank: int) -> dict[str, int]:
        return {a: (rank // self.stride(a)) % self.degrees[a] for a in self.order}

    def within_node(self, axis: str) -> bool:
        last = self.stride(axis) * (self.degrees[axis] - 1)
        return all(r // self.devices_per_node == (r + last) // self.devices_per_node for r in self._group_starts(axis))

    def _group_starts(self, axis: str) -> list[int]:
        s, d = self.stride(axis), self.degrees[axis]
        return [r for r in range(min(self.world, 4096)) if (r // s) % d == 0]


def layout(plan: Plan) -> Layout:
    from meshplan.presets import CLUSTER_PRESETS, cluster_preset

    degrees = {
        "pp": plan.pipeline_parallel_degree,
        "dp_replicate": plan.data_parallel_replicate_degree,
        "dp_shard": plan.data_parallel_shard_degree,
        "cp": plan.context_parallel_degree,
        "tp": plan.tensor_parallel_degree,
    }
    order = [a.strip() for a in plan.rank_placement.split(",") if a.strip() in degrees]
    order += [a for a in AXES if a not in order]
    if plan.cluster_name in CLUSTER_PRESETS:
        spec = cluster_preset(plan.cluster_name, plan.world_size)
        cpu = spec.device.kind == "cpu"
        intra = "shared memory (gloo)" if cpu else f"NVLink {spec.intra_node.bandwidth_gbps:g} GB/s"
        inter = f"inter-node network {spec.inter_node.bandwidth_gbps:g} GB/s"
        per_node = plan.world_size if cpu else spec.devices_per_node
        return Layout(degrees, order, per_node, "rank" if cpu else "GPU", intra, inter, True)
    return Layout(degrees, order, plan.world_size, "rank", "the measured intra-node links", "-", False)


def axis_rows(plan: Plan) -> list[list[str]]:
    """One row per axis of degree > 1: its groups, stride, where it runs, its traffic."""
    lay = layout(plan)
    pred = plan.prediction
    measured = pred.comm_bytes_per_step if pred else {}
    rows = []
    for axis in lay.order:
        d = lay.degrees[axis]
        if d == 1:
            continue
        inside = lay.within_node(axis)
        s = lay.stride(axis)
        example = ", ".join(str(k * s) for k in range(min(d, 4))) + (", ..." if d > 4 else "")
        term_s = pred.breakdown.get(TERM[axis]) if pred else None
        rows.append(
            [
                axis,
                str(d),
                f"{lay.world // d} group{'s' if lay.world // d > 1 else ''} of {d}, stride {s} (ranks {example})",
                lay.intra_link if inside else lay.inter_link,
                fmt.nbytes(measured[axis]) if axis in measured else "-",
                fmt.seconds(term_s) if term_s is not None else "-",
                WHAT[axis],
            ]
        )
    return rows


AXIS_HEADERS = ["axis", "degree", "groups", "link", "bytes per step per rank", "exposed time term", "traffic"]


def mesh_svg(plan: Plan) -> str:
    """Node 0 in detail (each rank with its coordinates, the axes inside the node bracketed), then
    every node as a box of cells coloured by pipeline stage."""
    lay = layout(plan)
    pp = lay.degrees["pp"]
    width = 1000
    per_node = min(lay.devices_per_node, lay.world)
    cell_w = min(110.0, (width - 40) / max(per_node, 1))
    detail = per_node <= 64
    parts = []
    y = 24.0
    parts.append(
        text(
            12,
            y,
            f"node 0 of {lay.num_nodes}: {per_node} {lay.device}s (rank: coordinates)",
            extra=' font-weight="600"',
        )
    )
    y += 10
    if detail:
        for i in range(per_node):
            c = lay.coords(i)
            x = 20 + i * cell_w
            colour = stage_colour(c["pp"], pp)
            label = f"r{i}"
            parts.append(rect(x, y, cell_w - 4, 44, colour, f"rank {i}: " + " ".join(f"{a}={c[a]}" for a in lay.order)))
            parts.append(text(x + (cell_w - 4) / 2, y + 16, label, "middle", ' fill="#fff" font-weight="600"'))
            if cell_w >= 60:
                small = " ".join(
                    f"{a.replace('dp_replicate', 'dpr').replace('dp_shard', 'dps')}{c[a]}"
                    for a in lay.order
                    if lay.degrees[a] > 1
                )
                parts.append(text(x + (cell_w - 4) / 2, y + 34, small, "middle", ' fill="#fff" font-size="10"'))
        y += 52
        for axis in reversed(lay.order):  # inner axes first: the brackets under the cells
            d, s = lay.degrees[axis], lay.stride(axis)
            if d == 1 or not lay.within_node(axis) or s * d > per_node:
                continue
            for start in range(0, per_node, s * d):
                for off in range(min(s, 1)):
                    x0 = 20 + (start + off) * cell_w
                    x1 = 20 + (start + off + s * (d - 1)) * cell_w + cell_w - 4
                    parts.append(rect(x0, y, x1 - x0, 3, "#333"))
                    parts.append(
                        text(
                            (x0 + x1) / 2,
                            y + 14,
                            f"{axis} group" + (f" (stride {s})" if s > 1 else ""),
                            "middle",
                            ' font-size="10"',
                        )
                    )
            y += 24
    crossing = [a for a in lay.order if lay.degrees[a] > 1 and not lay.within_node(a)]
    if crossing:
        parts.append(
            text(
                12, y + 6, "across nodes: " + ", ".join(f"{a} (x{lay.degrees[a]}, {lay.inter_link})" for a in crossing)
            )
        )
        y += 20
    # every node: a box of cells coloured by pipeline stage
    nodes = min(lay.num_nodes, MAX_NODES_DRAWN)
    if lay.num_nodes > 1:
        y += 14
        parts.append(
            text(
                12,
                y,
                f"all {lay.num_nodes} nodes, each {lay.device} coloured by its pipeline stage"
                + (f" (first {nodes} drawn)" if nodes < lay.num_nodes else ""),
                extra=' font-weight="600"',
            )
        )
        y += 10
        cell = max(2.0, min(10.0, 110.0 / per_node))
        box_w = per_node * cell + 6
        cols = max(1, int((width - 20) // (box_w + 6)))
        for k in range(nodes):
            bx, by = 12 + (k % cols) * (box_w + 6), y + (k // cols) * (cell + 10)
            parts.append(
                rect(
                    bx,
                    by,
                    box_w,
                    cell + 6,
                    "#f6f8fa",
                    f"node {k}: ranks {k * per_node}..{(k + 1) * per_node - 1}",
                    ' stroke="#d1d9e0"',
                )
            )
            for i in range(per_node):
                r = k * per_node + i
                if r >= lay.world:
                    break
                stage = lay.coords(r)["pp"]
                parts.append(rect(bx + 3 + i * cell, by + 3, cell - 0.5, cell, stage_colour(stage, pp)))
        y += ((nodes - 1) // cols + 1) * (cell + 10) + 6
    if pp > 1:
        step = max(1, pp // 16)
        items = [
            (f"stage {s}" + (f"..{min(s + step, pp) - 1}" if step > 1 else ""), stage_colour(s, pp))
            for s in range(0, pp, step)
        ]
        x = 12
        y += 12
        for label, colour in items[:16]:
            parts.append(rect(x, y - 10, 12, 12, colour) + text(x + 16, y, label))
            x += 30 + 7.2 * len(label)
            if x > width - 100:
                x, y = 12, y + 18
        y += 8
    height = int(y + 12)
    return svg_open(width, height, "parallel layout") + "".join(parts) + "</svg>"
