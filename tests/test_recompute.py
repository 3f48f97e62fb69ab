"""The recompute solvers against exhaustive enumeration and against an ILP (pulp/CBC)."""

from __future__ import annotations

import itertools
import random

import pulp
import pytest

from meshplan.planner.cost.memory import fits
from meshplan.planner.search.recompute import pareto_frontier, solve_frontier, solve_identical


def _enumerate(layer_options, base, flight, cap):
    best = None
    for choice in itertools.product(*layer_options):
        act = sum(o[2] for o in choice)
        if fits(base + flight * act, cap):
            time = sum(o[1] for o in choice)
            best = time if best is None else min(best, time)
    return best


def _ilp(layer_options, base, flight, cap):
    """sac_ilp-style: x[i][m] = 1 when layer i uses mode m."""
    prob = pulp.LpProblem("recompute", pulp.LpMinimize)
    # [Decision] one binary per layer and mode
    x = {
        (i, j): pulp.LpVariable(f"x_{i}_{j}", cat="Binary")
        for i, opts in enumerate(layer_options)
        for j in range(len(opts))
    }
    # [Objective] per-microbatch time of the stage
    prob += pulp.lpSum(layer_options[i][j][1] * v for (i, j), v in x.items())
    # [Constraint] one mode per layer
    for i, opts in enumerate(layer_options):
        prob += pulp.lpSum(x[(i, j)] for j in range(len(opts))) == 1
    # [Constraint] memory: base + in-flight x saved bytes <= capacity
    prob += base + flight * pulp.lpSum(layer_options[i][j][2] * v for (i, j), v in x.items()) <= cap
    status = prob.solve(pulp.PULP_CBC_CMD(msg=False))
    return pulp.value(prob.objective) if pulp.LpStatus[status] == "Optimal" else None


def _random_layer(rng, with_sel=True):
    t0, a0 = rng.uniform(1, 3), rng.uniform(5, 10)
    opts = [("none", t0, a0), ("full", t0 + rng.uniform(0.5, 1.5), rng.uniform(0.1, 1))]
    if with_sel:
        opts.append(("selective", t0 + rng.uniform(0.01, 0.4), a0 * rng.uniform(0.2, 0.8)))
    return opts


@pytest.mark.parametrize("seed", range(12))
def test_identical_blocks_match_enumeration(seed):
    rng = random.Random(seed)
    layer = _random_layer(rng, with_sel=seed % 3 != 0)
    n = rng.randint(1, 7)
    flight = rng.choice([1, 2, 3.5])
    base = rng.uniform(0, 20)
    cap = base + flight * n * rng.uniform(0.3, 9)
    got = solve_identical(n, layer, base, flight, cap)
    expected = _enumerate([layer] * n, base, flight, cap)
    if expected is None:
        assert got is None
    else:
        assert got[0] == pytest.approx(expected, rel=1e-12)
        assert sum(got[1].values()) == n


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pulp 3.x announces its 4.0 API
@pytest.mark.parametrize("seed", range(8))
def test_frontier_matches_enumeration_and_ilp(seed):
    rng = random.Random(100 + seed)
    layers = [_random_layer(rng, with_sel=rng.random() < 0.6) for _ in range(rng.randint(2, 7))]
    flight, base = rng.choice([1, 2, 4]), rng.uniform(0, 5)
    cap = base + flight * sum(o[0][2] for o in layers) * rng.uniform(0.2, 1.1)
    point = solve_frontier(pareto_frontier(layers), base, flight, cap)
    expected = _enumerate(layers, base, flight, cap)
    ilp = _ilp(layers, base, flight, cap)
    if expected is None:
        assert point is None and ilp is None
    else:
        assert point[1] == pytest.approx(expected, rel=1e-12)
        assert ilp == pytest.approx(expected, rel=1e-6)
        assert fits(base + flight * point[0], cap)


def test_dominated_mode_is_never_chosen():
    """A mode that saves less memory for more time (a useless 'selective') is dropped."""
    opts = [("none", 1.0, 10.0), ("selective", 1.5, 11.0), ("full", 2.0, 1.0)]
    time, counts = solve_identical(4, opts, 0.0, 1.0, 25.0)
    assert counts.get("selective", 0) == 0 and time == pytest.approx(6.0)
