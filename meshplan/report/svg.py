"""Plots as inline SVG strings (no JavaScript, no external fonts or files).

Every chart is a pure function of its numbers: same input, same bytes (coordinates are rounded).
"""

from __future__ import annotations

import math
from html import escape

PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d"]
FONT = 'font-family="system-ui, sans-serif" font-size="12"'


def n(value: float) -> str:
    """Coordinate text: 1 decimal, no trailing zeros (keeps files small and deterministic)."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def svg_open(width: int, height: int, label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(label)}" {FONT}>'
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>'
    )


def rect(x: float, y: float, w: float, h: float, fill: str, title: str = "", extra: str = "") -> str:
    tip = f"<title>{escape(title)}</title>" if title else ""
    close = f">{tip}</rect>" if tip else "/>"
    return f'<rect x="{n(x)}" y="{n(y)}" width="{n(max(w, 0.0))}" height="{n(h)}" fill="{fill}"{extra}{close}'


def text(x: float, y: float, content: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{n(x)}" y="{n(y)}" text-anchor="{anchor}"{extra}>{escape(content)}</text>'


def line(x1: float, y1: float, x2: float, y2: float, stroke: str = "#333", extra: str = "") -> str:
    return f'<line x1="{n(x1)}" y1="{n(y1)}" x2="{n(x2)}" y2="{n(y2)}" stroke="{stroke}"{extra}/>'


def nice_ticks(vmax: float, count: int = 5) -> list[float]:
    """Round tick values 0..>=vmax (1, 2, 2.5, 5 x 10^k steps)."""
    if vmax <= 0:
        return [0.0, 1.0]
    raw = vmax / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    top = math.ceil(vmax / step - 1e-9) * step
    return [round(i * step, 12) for i in range(int(round(top / step)) + 1)]


def range_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round ticks covering [lo, hi] with some padding (for scatter axes that need not start at 0)."""
    pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
    lo, hi = lo - pad, hi + pad
    step = nice_ticks(hi - lo, count)[1]
    first = math.floor(lo / step) * step
    if lo >= 0 > first:
        first = 0.0
    num = int(math.ceil((hi - first) / step - 1e-9))
    return [round(first + i * step, 12) for i in range(num + 1)]


def tick_label(value: float) -> str:
    return f"{value:g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


def legend(items: list[tuple[str, str]], x: float, y: float, width: float) -> str:
    """Swatch + label pairs on one or more rows starting at (x, y)."""
    parts, cx, cy = [], x, y
    for label, colour in items:
        w = 30 + 7.2 * len(label)
        if cx + w > x + width:
            cx, cy = x, cy + 18
        parts.append(rect(cx, cy - 10, 12, 12, colour) + text(cx + 16, cy, label))
        cx += w
    return "".join(parts)


def axis_y(ticks: list[float], x0: float, y_of, width: float, unit: str) -> str:
    parts = []
    for t in ticks:
        y = y_of(t)
        parts.append(line(x0, y, x0 + width, y, "#e3e3e3"))
        parts.append(text(x0 - 6, y + 4, tick_label(t), "end"))
    parts.append(text(4, y_of(ticks[-1]) - 12, unit))
    return "".join(parts)


def stacked_bars(
    categories: list[str],
    series: dict[str, list[float]],
    *,
    unit: str,
    capacity: list[float] | None = None,
    title: str = "",
) -> str:
    """Vertical stacked bars (one per category), optional capacity marker per bar."""
    width, height, left, top, bottom = 640, 340, 70, 30, 80
    plot_h = height - top - bottom
    totals = [sum(vals[i] for vals in series.values()) for i in range(len(categories))]
    vmax = max(totals + (capacity or []) + [1e-12])
    ticks = nice_ticks(vmax)

    def y_of(v: float) -> float:
        return top + plot_h * (1 - v / ticks[-1])

    slot = (width - left - 20) / max(len(categories), 1)
    bar_w = min(60.0, slot * 0.6)
    parts = [svg_open(width, height, title), axis_y(ticks, left, y_of, width - left - 20, unit)]
    # many bars: the shared word ("stage") moves under the axis, and labels are thinned to fit
    labels, axis_name = list(categories), ""
    words = {c.rsplit(" ", 1)[0] for c in categories if " " in c}
    if len(words) == 1 and slot < 7.2 * max(len(c) for c in categories) + 8:
        axis_name = words.pop()
        labels = [c.rsplit(" ", 1)[-1] for c in categories]
    every = max(1, math.ceil((7.2 * max((len(lbl) for lbl in labels), default=1) + 8) / slot))
    for i, cat in enumerate(categories):
        x, base = left + slot * i + (slot - bar_w) / 2, 0.0
        for k, (name, vals) in enumerate(series.items()):
            v = vals[i]
            parts.append(
                rect(
                    x,
                    y_of(base + v),
                    bar_w,
                    y_of(base) - y_of(base + v),
                    PALETTE[k % len(PALETTE)],
                    f"{cat} {name}: {v:.3g} {unit}",
                )
            )
            base += v
        if capacity:
            cy = y_of(capacity[i])
            parts.append(line(x - 6, cy, x + bar_w + 6, cy, "#d62728", ' stroke-width="2" stroke-dasharray="5,3"'))
        if i % every == 0:
            parts.append(text(x + bar_w / 2, top + plot_h + 16, labels[i], "middle"))
    if labels != categories:
        parts.append(text(left + (width - left - 20) / 2, top + plot_h + 32, axis_name, "middle"))
    items = [(name, PALETTE[k % len(PALETTE)]) for k, name in enumerate(series)]
    if capacity:
        items.append(("capacity", "#d62728"))
    parts.append(legend(items, left, height - 36, width - left - 20))
    return "".join(parts) + "</svg>"


def hbars(labels: list[str], values: list[float], *, unit: str, title: str = "") -> str:
    """Horizontal bars, one per label, value printed at the end of the bar."""
    row_h, left, right, top = 24, 200, 90, 14
    width, height = 640, top * 2 + row_h * len(labels) + 10
    vmax = max(values + [1e-12])
    scale = (width - left - right) / vmax
    parts = [svg_open(width, height, title)]
    for i, (label, v) in enumerate(zip(labels, values)):
        y = top + i * row_h
        parts.append(text(left - 8, y + 15, label, "end"))
        parts.append(rect(left, y + 3, v * scale, row_h - 6, PALETTE[i % len(PALETTE)], f"{label}: {v:.4g} {unit}"))
        parts.append(text(left + v * scale + 6, y + 15, f"{v:.3g} {unit}"))
    return "".join(parts) + "</svg>"


def scatter(points: list[tuple[float, float, str, bool, str]], *, x_unit: str, y_unit: str, title: str = "") -> str:
    """(x, y, label, chosen, tooltip) points; the chosen one is a larger red marker."""
    width, height, left, top, bottom, right = 640, 340, 70, 30, 50, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    xt = range_ticks(min(p[0] for p in points), max(p[0] for p in points)) if points else [0.0, 1.0]
    yt = range_ticks(min(p[1] for p in points), max(p[1] for p in points)) if points else [0.0, 1.0]

    def x_of(v: float) -> float:
        return left + plot_w * (v - xt[0]) / (xt[-1] - xt[0])

    def y_of(v: float) -> float:
        return top + plot_h * (1 - (v - yt[0]) / (yt[-1] - yt[0]))

    parts = [svg_open(width, height, title), axis_y(yt, left, y_of, plot_w, y_unit)]
    for t in xt:
        parts.append(text(x_of(t), top + plot_h + 16, tick_label(t), "middle"))
    parts.append(text(left + plot_w / 2, height - 8, x_unit, "middle"))
    placed: list[tuple[float, float]] = []  # label positions: a label that would overlap moves down
    for x, y, label, chosen, tip in sorted(points, key=lambda p: p[3]):  # chosen drawn last, on top
        fill, r = ("#d62728", 8) if chosen else ("#4c78a8", 5)
        parts.append(
            f'<circle cx="{n(x_of(x))}" cy="{n(y_of(y))}" r="{r}" fill="{fill}" '
            f'stroke="#222" stroke-width="{1.5 if chosen else 0.5}"><title>{escape(tip)}</title></circle>'
        )
        lx, ly = x_of(x) + r + 3, y_of(y) - r
        while any(abs(lx - px) < 7 * len(label) + 4 and abs(ly - py) < 11 for px, py in placed):
            ly += 11
        placed.append((lx, ly))
        parts.append(text(lx, ly, label, extra=' font-size="10"'))
    parts.append(legend([("chosen plan", "#d62728"), ("alternative", "#4c78a8")], left + 120, top - 12, plot_w))
    return "".join(parts) + "</svg>"


def lines(series: dict[str, list[tuple[float, float]]], *, x_unit: str, y_unit: str, title: str = "") -> str:
    """Line chart of one or more (x, y) series with markers."""
    width, height, left, top, bottom, right = 640, 300, 70, 30, 50, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for pts in series.values() for x, _ in pts] or [0.0]
    ys = [y for pts in series.values() for _, y in pts] or [0.0]
    y_lo = min(0.0, min(ys))
    xt, yt = nice_ticks(max(max(xs), 1.0)), nice_ticks(max(ys) - y_lo)

    def x_of(v: float) -> float:
        return left + plot_w * v / xt[-1]

    def y_of(v: float) -> float:
        return top + plot_h * (1 - (v - y_lo) / yt[-1])

    parts = [svg_open(width, height, title), axis_y([t + y_lo for t in yt], left, y_of, plot_w, y_unit)]
    for t in xt:
        parts.append(text(x_of(t), top + plot_h + 16, tick_label(t), "middle"))
    parts.append(text(left + plot_w / 2, height - 8, x_unit, "middle"))
    for k, (_name, pts) in enumerate(series.items()):
        colour = PALETTE[k % len(PALETTE)]
        path = " ".join(f"{n(x_of(x))},{n(y_of(y))}" for x, y in pts)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts += [f'<circle cx="{n(x_of(x))}" cy="{n(y_of(y))}" r="3" fill="{colour}"/>' for x, y in pts]
    parts.append(
        legend([(name, PALETTE[k % len(PALETTE)]) for k, name in enumerate(series)], left + 120, top - 12, plot_w - 120)
    )
    return "".join(parts) + "</svg>"
