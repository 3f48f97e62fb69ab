"""DABMD's pieces (executor/methods/sync_dabmd.py): the mirror maps, the ring's mixing matrix and
its time-varying draws, and the whole round (any-batch mirror step + consensus) simulated on N
nodes in one process on a problem that needs the simplex."""

from __future__ import annotations

import torch

from meshplan.executor.methods.sync_dabmd import mirror_step, mixing_matrix, on_simplex, ring_order, ring_peers


def test_euclidean_mirror_step_is_sgd():
    x, g = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.25])
    torch.testing.assert_close(mirror_step(x, g, 0.1, entropy=False), x - 0.1 * g)


def test_entropy_mirror_step_is_the_exponentiated_gradient_and_stays_on_the_simplex():
    x = torch.tensor([[0.5, 0.25, 0.25]])
    g = torch.tensor([[1.0, 0.0, -1.0]])
    y = mirror_step(x, g, 0.5, entropy=True)
    w = x * torch.exp(-0.5 * g)
    torch.testing.assert_close(y, w / w.sum(-1, keepdim=True))
    assert on_simplex(y) and not on_simplex(mirror_step(x, g, 0.5, entropy=False) - 0.1)


def test_ring_mixing_matrix_is_doubly_stochastic_and_the_time_varying_ring_changes():
    for n in (2, 3, 5, 8):
        w = mixing_matrix(n, ring_order(n, 0, False))
        torch.testing.assert_close(w.sum(0), torch.ones(n, dtype=torch.float64))
        torch.testing.assert_close(w.sum(1), torch.ones(n, dtype=torch.float64))
        assert (w > 0).sum() == n * min(n, 3) if n != 2 else (w > 0).sum() == 4
    orders = {tuple(ring_order(8, t, True)) for t in range(6)}
    assert len(orders) > 1  # the graph changes between rounds ...
    assert ring_order(8, 3, True) == ring_order(8, 3, True)  # ... the same on every rank
    assert ring_peers(0, [0, 1]) == [1] and ring_peers(2, [3, 2, 0, 1]) == [0, 3]


def _simulate(entropy: bool, speeds: list[float], rounds: int, consensus_rounds: int, time_varying: bool):
    """N nodes minimising E[<c + noise, x>] + 0.5 |x - a|^2 over the probability simplex (a
    portfolio-like problem whose optimum is a projection onto the simplex): node i gets a batch of
    speeds[i] samples a round (the any-batch part), takes its mirror step, then the ring consensus."""
    torch.manual_seed(0)
    n, d = len(speeds), 4
    a = torch.tensor([0.7, 0.5, -0.2, 0.0], dtype=torch.float64)
    x = [torch.full((d,), 1.0 / d, dtype=torch.float64) for _ in range(n)]
    for t in range(rounds):
        eta = 0.5 / (1 + t) ** 0.5
        ys = []
        for i in range(n):
            noise = torch.randn(int(speeds[i]), d, dtype=torch.float64).mean(0) * 0.1
            g = (x[i] - a) + noise
            ys.append(mirror_step(x[i], g, eta, entropy))
        for r in range(consensus_rounds):
            w = mixing_matrix(n, ring_order(n, t * consensus_rounds + r, time_varying))
            ys = [sum(w[i, j] * ys[j] for j in range(n)) for i in range(n)]
        x = ys
    return x


def _projection(a: torch.Tensor) -> torch.Tensor:
    """Euclidean projection onto the simplex (sort-based)."""
    u, _ = torch.sort(a, descending=True)
    css = torch.cumsum(u, 0) - 1
    k = torch.arange(1, len(a) + 1, dtype=a.dtype)
    rho = int(torch.nonzero(u - css / k > 0).max())
    return torch.clamp(a - css[rho] / (rho + 1), min=0)


def test_any_batch_entropic_mirror_descent_reaches_the_simplex_optimum_with_a_slow_node():
    """Entropy: every node stays on the simplex and all reach the constrained optimum, with one node
    computing 8x fewer samples a round; Euclidean steps on the same problem leave the simplex."""
    a = torch.tensor([0.7, 0.5, -0.2, 0.0], dtype=torch.float64)
    best = _projection(a)  # (0.6, 0.4, 0, 0)
    xs = _simulate(True, [8, 8, 8, 1, 8], rounds=400, consensus_rounds=2, time_varying=True)
    for x in xs:
        assert on_simplex(x, tol=1e-9)
        assert torch.dist(x, best) < 0.05
    spread = max(torch.dist(x, xs[0]) for x in xs)
    assert spread < 1e-2  # consensus
    euclid = _simulate(False, [8, 8, 8, 1, 8], rounds=50, consensus_rounds=1, time_varying=False)
    assert not on_simplex(euclid[0], tol=1e-3)


def test_more_consensus_rounds_shrink_the_disagreement():
    one = _simulate(False, [1, 4, 16, 2, 8, 3], rounds=20, consensus_rounds=1, time_varying=False)
    three = _simulate(False, [1, 4, 16, 2, 8, 3], rounds=20, consensus_rounds=3, time_varying=False)

    def spread(xs):
        mean = sum(xs) / len(xs)
        return max(torch.dist(x, mean) for x in xs)

    assert spread(three) < spread(one)


def test_straggler_trade_on_a_hand_worked_case():
    """4 microbatches of 0.25 s (2 samples each) per node, one node 3x slower, a 0.5 s budget: a fast
    node starts 2 microbatches (at 0 and 0.25 s), the slow one 1 (at 0; the next would start at
    0.75 s); DDP waits 3 x 1 s for the slow node's whole batch."""
    import pytest

    from meshplan.planner.methods.sync import straggler_trade

    t = straggler_trade(1.0, 4, 8, 3.0, 0.5, 1, 0.1, 0.05, 0.01, 2)
    assert t["ddp_step_s"] == pytest.approx(3.11) and t["ddp_samples_per_s"] == pytest.approx(16 / 3.11)
    assert t["dabmd_step_s"] == pytest.approx(0.75 + 0.05 + 0.01)
    assert t["dabmd_samples_per_round"] == 6 and t["dabmd_samples_per_s"] == pytest.approx(6 / 0.81)
    whole = straggler_trade(1.0, 4, 8, 3.0, 0.0, 1, 0.1, 0.05, 0.01, 2)  # no budget: the slow node sets the round
    assert whole["dabmd_step_s"] == pytest.approx(3.0 + 0.05 + 0.01) and whole["dabmd_samples_per_round"] == 16
