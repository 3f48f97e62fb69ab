"""Overheads measured in place on real ranks (profiler/insitu.py), read at any microbatch size.

Keys are "<wrapper>@<degree>:b<microbatch>" (forward+backward) and the same + ":fwd" (forward
only), in LayerProfile.framework_overhead_s (per layer: "tp@2", "tp_sp@2", "zero3@4") and
ModelProfile.step_overhead_s (per step: "ddp@4"). Values are piecewise linear in the microbatch
between the measured sizes (the fixed part is dispatch and waiting, the slope the bytes moved):
the profiler measures every profiled microbatch, because the overhead is not one line over the
range (waits on partner ranks shift with the size).
"""

from __future__ import annotations


def measured_points(overheads: dict[str, float], key: str, forward_only: bool = False) -> list[tuple[int, float]]:
    """[(microbatch, seconds)] of the entries "<key>:b<B>" (":fwd" appended when forward_only),
    sorted by microbatch."""
    suffix = ":fwd" if forward_only else ""
    pts = []
    for k, v in overheads.items():
        if not k.startswith(key + ":b") or k.endswith(":fwd") != forward_only:
            continue
        pts.append((int(k[len(key) + 2 : len(k) - len(suffix)]), v))
    return sorted(pts)


def in_place_overhead_s(overheads: dict[str, float], key: str, b: int, forward_only: bool = False) -> float | None:
    """A wrapper's overhead measured in place on real ranks (profiler/insitu.py: keys "tp@2:b1",
    "zero3@4:b8", + ":fwd" for the forward share) at microbatch b (linear_in_b); None when the
    profile has no such measurement."""
    return linear_in_b(measured_points(overheads, key, forward_only), b)


def linear_in_b(pts: list[tuple[int, float]], b: int) -> float | None:
    """The value at microbatch b (clamped at 0) from the measured (microbatch, seconds) points,
    sorted by microbatch: between the two measured sizes around b (between()), and beyond the
    measured range on the line through the smallest and largest (the widest baseline for the
    fixed part and the slope); None when there are none."""
    if not pts:
        return None
    (b0, v0), (b1, v1) = pts[0], pts[-1]
    if b0 < b < b1:
        return max(0.0, between(pts, b))
    return v0 if b1 == b0 else max(0.0, v0 + (b - b0) * (v1 - v0) / (b1 - b0))


def between(pts: list[tuple[int, float]] | tuple[tuple[int, float], ...], b: int) -> float:
    """Linear between the two (microbatch, value) points around b: pts sorted by microbatch, b
    inside their range (the callers decide what holds beyond it)."""
    for (b0, v0), (b1, v1) in zip(pts, pts[1:]):
        if b <= b1:
            return v0 + (b - b0) * (v1 - v0) / (b1 - b0)
    return pts[-1][1]
