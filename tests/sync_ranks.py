"""The rank side of tests/test_sync_async_safety.py's one 4-rank launch (spawned processes import
this module, so it imports only torch and the two methods it drives, not the test suite)."""

from __future__ import annotations

import os
import random
import threading
import time

import torch

WORLD = 4
DIM = 1000
ROUNDS = 8
ASYNC_RUNS = 24
"""Seeded asynchronous runs in the one launch (periods 1-3, 4-10 steps, delays 0-4 ms)."""
DEAD_TIMEOUT_S = 3.0
"""The averaging group's timeout in the dead-peer run."""


def ring_matrix(n: int, gamma: float) -> torch.Tensor:
    """(1 - gamma) I + gamma W, W_ij = 1/3 for j in {i-1, i, i+1} mod n (n >= 3), in float64."""
    w = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in (i - 1, i, i + 1):
            w[i, j % n] = 1 / 3
    return (1 - gamma) * torch.eye(n, dtype=torch.float64) + gamma * w


def second_eigenvalue(w: torch.Tensor) -> float:
    """|lambda_2|: the largest eigenvalue modulus below the consensus eigenvalue 1."""
    return float(torch.linalg.eigvalsh(w).abs().sort(descending=True).values[1])


# --- inside each spawned rank ---------------------------------------------------------------


def _gathered(x: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return torch.stack(out).double()  # (N, DIM)


def _disagreement(xs: torch.Tensor) -> float:
    return float((xs - xs.mean(0)).norm())


def _gossip_rates(rank: int, gamma: float) -> dict:
    import torch.distributed as dist

    from meshplan.executor.methods.sync_gossip import GossipRing

    ring = GossipRing(dist.group.WORLD, {"low_precision": False, "gamma": gamma, "chunk": 64, "period": 1})
    x = torch.randn(DIM, generator=torch.Generator().manual_seed(100 + rank))
    xs = _gathered(x)
    errors, mean0, drift = [_disagreement(xs)], xs.mean(0), 0.0
    for _ in range(ROUNDS):
        x = ring.round(x)
        xs = _gathered(x)
        errors.append(_disagreement(xs))
        drift = max(drift, float((xs.mean(0) - mean0).abs().max()))
    return {"errors": errors, "drift": drift}


def _gossip_8bit(rank: int, chunk: int = 64) -> dict:
    """Each round's excess over the stated bound gamma (sum_j W_ij h_j + h_i), computed from
    everyone's replicas and public copies before the round."""
    import torch.distributed as dist

    from meshplan.executor.methods.sync_gossip import GossipRing

    gamma, n = 1.0, dist.get_world_size()
    w = ring_matrix(n, 1.0)
    ring = GossipRing(dist.group.WORLD, {"low_precision": True, "gamma": gamma, "chunk": chunk, "period": 1})
    x = torch.randn(DIM, generator=torch.Generator().manual_seed(200 + rank))
    excess, errors = [], [_disagreement(_gathered(x))]
    for _ in range(ROUNDS):
        public = ring.copies[rank] if ring.copies is not None else torch.zeros_like(x)
        xs, diffs = _gathered(x), _gathered(x - public)
        pad = (-DIM) % chunk
        rows = torch.nn.functional.pad(diffs, (0, pad)).view(n, -1, chunk)
        h = ((rows.max(2).values - rows.min(2).values) / 510).repeat_interleave(chunk, 1)[:, :DIM]  # (N, DIM)
        exact = xs + gamma * (w @ xs - xs)
        bound = gamma * (w @ h + h)
        x = ring.round(x)
        got = _gathered(x)
        excess.append(float(((got - exact).abs() - bound).max()))
        errors.append(_disagreement(got))
    fp32 = 16 * torch.finfo(torch.float32).eps * float(xs.abs().max())  # the rounds' own fp32 rounding
    return {"excess": excess, "errors": errors, "fp32": fp32}


def _async_run(rank: int, seed: int) -> dict:
    """One seeded asynchronous run on a 256-element replica: random compute time per step,
    random delays before each all-reduce; its bookkeeping and the replicas' sum invariant."""
    import torch.distributed as dist

    from meshplan.executor.methods.sync_async import AsyncAverager

    plan = random.Random(seed)  # the same on every rank: period and steps
    period, steps = plan.choice([1, 2, 3]), plan.randint(4, 10)
    main_rng, thread_rng = random.Random(seed * 1000 + rank), random.Random(seed * 1000 + 500 + rank)
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(256, generator=gen)
    expected = x.clone()
    threads, groups = threading.active_count(), len(dist.distributed_c10d._world.pg_map)
    start = time.monotonic()
    with AsyncAverager(list(range(WORLD)), period, 20.0, delay=lambda: time.sleep(thread_rng.uniform(0, 0.004))) as avg:
        for step in range(steps):
            # every 4th run has one long step (100 ms) right after a hand-over: its round lands
            # behind it, unwaited (the others mostly wait: a round outlasts 0-3 ms of compute)
            slow = seed % 4 == 0 and step == period and period > 1
            time.sleep(0.1 if slow else main_rng.uniform(0, 0.003))
            update = 0.1 * torch.randn(256, generator=gen)
            x += update
            expected += update
            avg.after_step([x])
        avg.close([x])
    elapsed = time.monotonic() - start
    total, want = x.double(), expected.double()
    dist.all_reduce(total)
    dist.all_reduce(want)
    return {
        "seed": seed,
        "submitted": avg.submitted,
        "rounds": [a["round"] for a in avg.applied],
        "early": sum(1 for a in avg.applied if not a["waited"]),  # landed behind the steps, unwaited
        "sum_error": float((total - want).abs().max() / want.abs().max()),
        "error": repr(avg.error) if avg.error else "",
        "thread_left": avg.thread.is_alive() or threading.active_count() != threads,
        "groups_left": len(dist.distributed_c10d._world.pg_map) - groups,
        "elapsed_s": elapsed,
        "expected_rounds": steps // period,
    }


def _aborted(rank: int) -> dict:
    """Rank 0's step loop raises at its third step (what SIGINT's KeyboardInterrupt does): its
    close(aborted=True) must not wait for a round its peers will never finish with it; the
    others' next round then fails within the group's timeout."""
    from meshplan.executor.methods.sync_async import AsyncAverager

    x, closed_s = torch.zeros(64), 0.0
    start = time.monotonic()
    try:
        with AsyncAverager(list(range(WORLD)), 1, DEAD_TIMEOUT_S) as avg:
            for step in range(6):
                time.sleep(0.05)
                if rank == 0 and step == 2:
                    raise KeyboardInterrupt
                x += 1.0
                avg.after_step([x])
            avg.close([x])
    except KeyboardInterrupt:
        closed_s = time.monotonic() - start
    return {
        "error": type(avg.error).__name__ if avg.error else "",
        "elapsed_s": time.monotonic() - start,
        "aborted_close_s": closed_s,
        "thread_alive": avg.thread.is_alive(),
    }


def _dead_peer(rank: int) -> dict:
    """Rank WORLD-1 dies after 2 steps (os._exit, like SIGKILL: its sockets close); the others
    keep stepping with period 1 and close normally."""
    from meshplan.executor.methods.sync_async import AsyncAverager

    x = torch.zeros(64)
    start = time.monotonic()
    with AsyncAverager(list(range(WORLD)), 1, DEAD_TIMEOUT_S) as avg:
        for step in range(8):
            if rank == WORLD - 1 and step == 2:
                os._exit(0)
            time.sleep(0.05)
            x += 1.0
            avg.after_step([x])
        avg.close([x])
    return {
        "error": type(avg.error).__name__ if avg.error else "",
        "elapsed_s": time.monotonic() - start,
        "thread_alive": avg.thread.is_alive(),
        "submitted": avg.submitted,
    }


def _rank_main(rank: int, port: int, results) -> None:
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    out = {
        "gossip": {g: _gossip_rates(rank, g) for g in (1.0, 0.5)},
        "gossip8": _gossip_8bit(rank),
        "async": [_async_run(rank, seed) for seed in range(ASYNC_RUNS)],
        "aborted": _aborted(rank),
    }
    dist.barrier()
    results.put((rank, out))
    dead = _dead_peer(rank)  # the last rank does not come back from this
    results.put((rank, {"dead_peer": dead}))
    results.close()
    results.join_thread()
    os._exit(0)  # the default group lost a peer: skip its teardown
