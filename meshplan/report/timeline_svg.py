"""Draw a simulated pipeline Timeline as SVG.

Small schedules are drawn block by block (microbatch numbers inside the blocks, p2p arrows).
Large ones (hundreds of microbatches) are drawn at screen resolution: each pixel column of a
rank is coloured by what fills it (forward, backward, both interleaved, communication, idle),
and runs of equal columns become one rectangle, so the file stays small and the bubbles stay
exactly where the replay put them.
"""

from __future__ import annotations

from meshplan.report.svg import legend, line, n, nice_ticks, rect, svg_open, text, tick_label
from meshplan.report.timeline import Block, Timeline

COLOURS = {"F": "#4c78a8", "B": "#54a24b", "FB": "#5f8f7a", "DP": "#e45756", "OPT": "#b279a2", "idle": "#eeeeee"}
LABELS = {
    "F": "forward",
    "B": "backward (+recompute)",
    "FB": "forward/backward interleaved",
    "DP": "exposed DP comm",
    "OPT": "optimizer",
    "idle": "bubble (idle)",
}
MAX_EXACT_BLOCKS = 600
WINDOW_PX = 3
"""Columns this close that hold both F and B are drawn as one interleaved run."""
WIDTH, LEFT, RIGHT, ROW_H, TOP = 900, 70, 20, 26, 34


def timeline_svg(tl: Timeline, title: str = "pipeline schedule") -> str:
    span_s = max(tl.makespan_s, 1e-12)
    plot_w = WIDTH - LEFT - RIGHT
    height = TOP + ROW_H * tl.num_ranks + 70
    ticks = nice_ticks(span_s, 8)
    scale = plot_w / ticks[-1]
    parts = [svg_open(WIDTH, height, title)]
    for r in range(tl.num_ranks):
        y = TOP + r * ROW_H
        parts.append(text(LEFT - 8, y + 17, f"rank {r}", "end"))
        parts.append(rect(LEFT, y + 2, span_s * scale, ROW_H - 4, COLOURS["idle"]))
    exact = len(tl.blocks) <= MAX_EXACT_BLOCKS
    kinds = set()
    if exact:
        parts += [_block(b, scale, tl.virtual_stages) for b in tl.blocks]
        parts += [_arrow(src, dst, scale) for src, dst in tl.sends]
        kinds = {b.kind for b in tl.blocks}
    else:
        for r in range(tl.num_ranks):
            runs = _binned_runs([b for b in tl.blocks if b.rank == r], scale, int(span_s * scale) + 1)
            kinds |= {k for k, _, _ in runs}
            y = TOP + r * ROW_H + 2
            parts += [rect(LEFT + x0, y, x1 - x0, ROW_H - 4, COLOURS[k]) for k, x0, x1 in runs if k != "idle"]
    axis_y = TOP + ROW_H * tl.num_ranks + 4
    parts.append(line(LEFT, axis_y, LEFT + plot_w, axis_y))
    for t in ticks:
        parts.append(line(LEFT + t * scale, axis_y, LEFT + t * scale, axis_y + 4))
        parts.append(text(LEFT + t * scale, axis_y + 16, tick_label(t), "middle"))
    parts.append(text(LEFT + plot_w, axis_y + 30, "seconds", "end"))
    items = [(LABELS[k], COLOURS[k]) for k in ("F", "B", "FB", "DP", "OPT") if k in kinds]
    items.append((LABELS["idle"], COLOURS["idle"]))
    if exact and tl.sends:
        items.append(("p2p send", "#222222"))
    parts.append(legend(items, LEFT, axis_y + 34 + 12, plot_w))
    parts.append(
        text(
            LEFT,
            20,
            f"{tl.schedule}: {tl.num_ranks} ranks x {tl.num_microbatches} microbatches"
            + (f" x {tl.virtual_stages} chunks" if tl.virtual_stages > 1 else "")
            + ("" if exact else " (drawn at screen resolution)"),
            extra=' font-weight="bold"',
        )
    )
    return "".join(parts) + "</svg>"


def _block(b: Block, scale: float, v: int) -> str:
    x, y = LEFT + b.start_s * scale, TOP + b.rank * ROW_H + 2
    w = (b.end_s - b.start_s) * scale
    colour = COLOURS[b.kind]
    name = LABELS[b.kind] + (f" mb {b.microbatch}" if b.microbatch >= 0 else "")
    name += f" chunk {b.chunk}" if v > 1 and b.kind in ("F", "B") else ""
    opacity = f' fill-opacity="{n(1 - 0.35 * b.chunk / max(v - 1, 1))}"' if v > 1 else ""
    out = rect(
        x,
        y,
        w,
        ROW_H - 4,
        colour,
        f"{name}: {b.start_s:.4g}-{b.end_s:.4g} s",
        opacity + ' stroke="#ffffff" stroke-width="0.5"',
    )
    if b.microbatch >= 0 and w >= 14:
        out += text(x + w / 2, y + 15, str(b.microbatch), "middle", ' fill="#ffffff" font-size="10"')
    return out


def _arrow(src: Block, dst: Block, scale: float) -> str:
    y1 = TOP + src.rank * ROW_H + ROW_H / 2
    y2 = TOP + dst.rank * ROW_H + ROW_H / 2
    return line(
        LEFT + src.end_s * scale,
        y1,
        LEFT + dst.start_s * scale,
        y2,
        "#222222",
        ' stroke-width="0.6" stroke-opacity="0.6"',
    )


def _binned_runs(blocks: list[Block], scale: float, num_px: int) -> list[tuple[str, int, int]]:
    """Run-length encoded pixel columns: (kind, x0, x1) with kind by what covers each column."""
    cover: list[dict[str, float]] = [{} for _ in range(num_px)]
    for b in blocks:
        x0, x1 = b.start_s * scale, b.end_s * scale
        for px in range(int(x0), min(int(x1) + 1, num_px)):
            overlap = min(x1, px + 1) - max(x0, px)
            if overlap > 0:
                cover[px][b.kind] = cover[px].get(b.kind, 0.0) + overlap
    runs: list[tuple[str, int, int]] = []
    for px in range(num_px):
        kind = _column_kind(cover[px], cover[max(0, px - WINDOW_PX) : px + WINDOW_PX + 1])
        if runs and runs[-1][0] == kind and runs[-1][2] == px:
            runs[-1] = (kind, runs[-1][1], px + 1)
        else:
            runs.append((kind, px, px + 1))
    return runs


def _column_kind(kinds: dict[str, float], around: list[dict[str, float]]) -> str:
    """What fills one pixel column; F and B alternating within a few pixels read as "FB"."""
    if sum(kinds.values()) < 0.5:
        return "idle"
    comm = {k: v for k, v in kinds.items() if k in ("DP", "OPT")}
    if comm and sum(comm.values()) >= 0.5:
        return max(comm, key=lambda k: comm[k])
    near = {k for column in around for k, v in column.items() if v > 0}
    if "F" in near and "B" in near:
        return "FB"
    return "F" if kinds.get("F", 0) > 0 else "B"
