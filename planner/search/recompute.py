"""Per-layer activation recompute under a rank's memory budget, solved exactly.

Each layer picks a mode m in {none, selective, full} with time t_m and saved bytes a_m; a rank
must satisfy `static + in_flight x sum(a) <= capacity` and wants the least `sum(t)`: a multiple-
choice knapsack. Two exact solvers:
- identical blocks (the transformer case): with x_f blocks on full and x_s on selective the time
  is linear in (x_s, x_f), so for every x_f the least x_s that fits is optimal — O(n).
- any layers: a Pareto frontier of (bytes, time) built layer by layer, dominated points dropped
  (the exact DP of the knapsack on real-valued weights; sac_ilp-style ILP gives the same optimum,
  see tests/test_recompute.py which checks it against pulp/CBC).
"""

from __future__ import annotations

import math
from bisect import bisect_right

from meshplan.planner.cost.memory import fits

Option = tuple[str, float, float]
"""(mode, time_s, act_bytes)."""


def _least_x1(n_free: int, fixed_act: float, save1: float, base: float, flight: float, cap: float) -> int | None:
    """Least x1 in [0, n_free] with fits(base + flight*(fixed_act - x1*save1), cap), O(1)."""
    if fits(base + flight * fixed_act, cap):
        return 0
    if save1 <= 0 or flight <= 0:
        return None
    guess = min(max(math.ceil((fixed_act - (cap - base) / flight) / save1 - 1e-9), 0), n_free)
    while guess > 0 and fits(base + flight * (fixed_act - (guess - 1) * save1), cap):
        guess -= 1
    while guess <= n_free and not fits(base + flight * (fixed_act - guess * save1), cap):
        guess += 1
    return guess if guess <= n_free else None


def undominated(options: list[Option]) -> list[Option]:
    """Options no other beats on both time and bytes, most bytes (least time) first."""
    keep: list[Option] = []
    for m, t, a in sorted(options, key=lambda o: (o[1], o[2], o[0])):
        if not keep or a < keep[-1][2]:
            keep.append((m, t, a))
    return keep


def solve_identical(
    n: int,
    options: list[Option],
    base_bytes: float,
    in_flight: float,
    capacity: float,
    already_undominated: bool = False,
) -> tuple[float, dict[str, int]] | None:
    """Least time of n identical blocks; memory = base_bytes + in_flight x sum(act) <= capacity.
    Returns (time_s of the n blocks, {mode: count}) or None when even the leanest mix OOMs.
    Options are ordered by saved bytes, most first: o0 (e.g. none), o1 (selective), o2 (full).
    A caller solving the same options many times passes undominated(options) once and
    already_undominated=True."""
    opts = options if already_undominated else undominated(options)
    (m0, t0, a0) = opts[0]
    if n == 0 or len(opts) == 1:
        ok = fits(base_bytes + in_flight * n * a0, capacity)
        return (n * t0, {m0: n}) if ok else None
    (m1, t1, a1), last = opts[1], (opts[2] if len(opts) > 2 else None)
    best = None
    for x2 in range(0, n + 1 if last else 1):
        if best is not None and n * t0 + x2 * ((last[1] if last else t0) - t0) >= best[0]:
            break  # every later x2 costs at least this much, whatever x1 is
        fixed = x2 * (last[2] if last else 0.0) + (n - x2) * a0
        x1 = _least_x1(n - x2, fixed, a0 - a1, base_bytes, in_flight, capacity)
        if x1 is not None:
            time = (n - x1 - x2) * t0 + x1 * t1 + x2 * (last[1] if last else 0.0)
            best = _better(best, time, x2, x1)
            if x1 == 0:
                break  # more blocks on the leanest mode only add time
    if best is None:
        return None
    time, x2, x1 = best
    counts = {m0: n - x1 - x2, m1: x1}
    if last:
        counts[last[0]] = x2
    return time, counts


def _better(best, time, x_f, x_s):
    cand = (time, x_f, x_s)
    return cand if best is None or cand < best else best


def pareto_frontier(layer_options: list[list[Option]], start=None, max_act: float = math.inf) -> list[tuple]:
    """Non-dominated points (act_bytes, time_s, previous point, mode) over every per-layer choice,
    act ascending (extending the frontier `start` of the layers before, when given). A point's
    modes are read back along its chain of previous points (`modes_of`). Points above `max_act`
    (more bytes than any rank can hold) are dropped."""
    frontier = start if start is not None else [(0.0, 0.0, None, None)]
    for options in layer_options:
        merged = sorted(
            ((point[0] + oa, point[1] + ot, point, m) for point in frontier for m, ot, oa in options),
            key=lambda q: (q[0], q[1]),
        )
        frontier = []
        best_time = math.inf
        for point in merged:
            if point[0] > max_act * (1 + 1e-9):
                break  # bytes only grow as layers are added: never feasible
            if point[1] < best_time:
                frontier.append(point)
                best_time = point[1]
    return frontier


def modes_of(point) -> tuple[str, ...]:
    """The per-layer modes of a frontier point, first layer first."""
    out = []
    while point is not None and point[3] is not None:
        out.append(point[3])
        point = point[2]
    return tuple(reversed(out))


def solve_frontier(frontier, base_bytes: float, in_flight: float, capacity: float):
    """Least-time frontier point that fits, or None."""
    acts = [p[0] for p in frontier]
    limit = (capacity - base_bytes) / in_flight if in_flight > 0 else math.inf
    i = bisect_right(acts, limit * (1 + 1e-9) + 1e-9)
    for j in range(min(i, len(frontier)) - 1, -1, -1):
        if fits(base_bytes + in_flight * frontier[j][0], capacity):
            return frontier[j]
    return None
