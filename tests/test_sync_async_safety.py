"""Gossip's convergence rate and asynchronous averaging's safety, on real gloo ranks.

One spawn of 4 gloo ranks, pure tensors, no model (`ranks` fixture), checks:
- ring gossip contracts the disagreement ||x_t - mean|| by |lambda_2(W)| per round, W the ring's
  mixing matrix built here from its definition (1/3 self and each neighbour), at gamma 1 and 0.5;
  the mean is preserved; the 8-bit variant ends every round within its stated error of the
  full-precision round (executor/methods/sync_gossip.py);
- asynchronous averaging over many seeded runs with random delays in the averaging thread and
  the step loop never deadlocks and always ends with identical bookkeeping: every round handed
  over lands once, in order, on every rank; the replicas' sum is exactly what local training
  made it (every correction sums to zero); the thread is joined and its group destroyed;
- a rank whose step loop raises (SIGINT's KeyboardInterrupt) closes without waiting on its
  peers, whose next round then fails within the group's timeout;
- a peer that dies mid-run ends the survivors' averaging threads with an error within the
  group's timeout instead of blocking, and close() returns.
Then two `meshplan run` launches of gpt-tiny with --sync async on 2 ranks: SIGTERM to the
launcher and SIGKILL to a rank each end the run with the documented exit code (143, 4) within
seconds, leaving no process (tests/test_run_safety.py's helpers).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from sync_ranks import ASYNC_RUNS, DEAD_TIMEOUT_S, WORLD, _rank_main, ring_matrix, second_eigenvalue
from test_run_safety import _signal_rank_when_running, finish, processes_of, wait_for
from test_sync_methods import sync_plan

from meshplan.schema import save

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict]:
    os.environ["OMP_NUM_THREADS"] = "1"
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, results), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    got: dict[int, dict] = {r: {} for r in range(WORLD)}
    try:
        for _ in range(2 * WORLD - 1):  # the dying rank reports once
            rank, part = results.get(timeout=120)
            got[rank].update(part)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return got


def test_ring_gossip_contracts_at_the_spectral_gap(ranks):
    for gamma in (1.0, 0.5):
        rate = second_eigenvalue(ring_matrix(WORLD, gamma))
        run = ranks[0]["gossip"][gamma]
        errors = run["errors"]
        ratios = [b / a for a, b in zip(errors, errors[1:])]
        # W is symmetric: no round contracts by less than |lambda_2|, and the slowest mode
        # (lambda_2's eigenvector) dominates, so the rate tends to it
        assert all(r <= rate * (1 + 1e-6) for r in ratios), (gamma, rate, ratios)  # fp32 replicas
        assert ratios[-1] == pytest.approx(rate, rel=0.02), (gamma, rate, ratios)
        assert run["drift"] < 1e-6
    assert second_eigenvalue(ring_matrix(WORLD, 1.0)) == pytest.approx(1 / 3)
    assert ranks[0]["gossip"][1.0]["errors"][-1] < 1e-3 * ranks[0]["gossip"][1.0]["errors"][0]


def test_8bit_gossip_stays_within_its_stated_error(ranks):
    for rank in range(WORLD):
        run = ranks[rank]["gossip8"]
        assert max(run["excess"]) <= run["fp32"], run["excess"]
    errors = ranks[0]["gossip8"]["errors"]
    assert errors[-1] < 0.05 * errors[0], errors  # and it still reaches consensus


def test_async_averaging_never_deadlocks_and_ends_with_identical_bookkeeping(ranks):
    for seed in range(ASYNC_RUNS):
        runs = [ranks[r]["async"][seed] for r in range(WORLD)]
        want = runs[0]["expected_rounds"]
        for run in runs:
            assert run["error"] == "" and not run["thread_left"] and run["groups_left"] == 0, run
            assert run["submitted"] == want and run["rounds"] == list(range(want)), run
            assert run["sum_error"] < 1e-5, run  # fp32 replicas; one round lost or doubled is ~1e-1
            assert run["elapsed_s"] < 5.0, run
    assert sum(run["early"] for r in range(WORLD) for run in ranks[r]["async"]) > 0  # rounds did overlap steps


def test_an_aborted_rank_stops_without_waiting_and_its_peers_fail_the_round(ranks):
    aborted = ranks[0]["aborted"]
    assert 0 < aborted["aborted_close_s"] < 6 * 0.05 + 5.0 and not aborted["thread_alive"], aborted  # GRACE_S
    for rank in range(1, WORLD):
        run = ranks[rank]["aborted"]
        assert run["error"] and not run["thread_alive"], run
        assert run["elapsed_s"] < 6 * 0.05 + DEAD_TIMEOUT_S + 5.0 + 2.0, run


def test_a_dead_peer_ends_the_averaging_thread_with_an_error(ranks):
    assert "dead_peer" not in ranks[WORLD - 1]
    for rank in range(WORLD - 1):
        run = ranks[rank]["dead_peer"]
        assert run["error"] and not run["thread_alive"], run
        assert run["elapsed_s"] < 8 * 0.05 + DEAD_TIMEOUT_S + 5.0 + 2.0, run  # steps + timeout + GRACE_S


# --- launched runs: signals and a killed rank -----------------------------------------------


def _start_async_run(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    plan_path, out = tmp_path / "plan.json", tmp_path / "run"
    save(sync_plan("async", {"period": 1, "timeout_s": 5.0}, dp=2), plan_path)
    cmd = [sys.executable, "-m", "meshplan", "run", str(plan_path), "--out-dir", str(out), "--quiet"]
    cmd += ["--steps", "100000", "--timeout", "60"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).parent), OMP_NUM_THREADS="1"),
    )
    return proc, out


def _steps(out: Path) -> list[int]:
    import json

    steps = []
    for rank in (0, 1):
        try:
            steps.append(json.loads((out / "ranks" / f"rank{rank}.status.json").read_text()).get("step", -1))
        except (OSError, ValueError):
            steps.append(-1)
    return steps


def test_sigterm_stops_an_async_run_within_seconds(tmp_path):
    proc, out = _start_async_run(tmp_path)
    wait_for(lambda: min(_steps(out)) >= 3 or proc.poll() is not None, 120, "both ranks past step 3")
    assert proc.poll() is None, proc.communicate()[1]
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc, stdout, stderr = finish(proc, 60)
    assert time.monotonic() - start < 15
    assert rc == 128 + signal.SIGTERM, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("meshplan run: interrupted by SIGTERM: all 2 ranks stopped"), stderr
    assert processes_of(out) == []


def test_a_killed_rank_ends_an_async_run_within_seconds(tmp_path):
    proc, out = _start_async_run(tmp_path)
    watcher = _signal_rank_when_running(out, 1, signal.SIGKILL, min_step=3)
    wait_for(lambda: not watcher.is_alive(), 120, "rank 1 killed")
    start = time.monotonic()
    rc, stdout, stderr = finish(proc, 60)
    assert time.monotonic() - start < 20
    assert rc == 4, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "rank 1 died (exit code -9)" in lines[0], stderr
    assert processes_of(out) == []
