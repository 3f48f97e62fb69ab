"""Multi-node launch on one host: two `meshplan run --nnodes 2 --node-rank 0|1
--rdzv-endpoint 127.0.0.1:PORT` processes, as two machines would run them, on loopback only.

The two nodes reproduce the single-process losses with one shared --out-dir (checkpoints on)
and with one --out-dir per node; checkpoints without a shared --out-dir are refused; a node
that never arrives or dies mid-run ends the other within its --timeout with one line, rc 4, and
no process of either node is left."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from executor_plans import make_plan
from test_run_safety import finish, processes_of, wait_for

from meshplan.executor.checkpoint import latest_step
from meshplan.executor.reference import reference_losses
from meshplan.schema import save

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(plan_path: Path, node_rank: int, port: int, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "meshplan",
        "run",
        str(plan_path),
        "--nnodes",
        "2",
        "--node-rank",
        str(node_rank),
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--out-dir",
        str(out),
        "--quiet",
        *extra,
    ]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).parent)),
    )


def run_two_nodes(tmp_path: Path, plan, outs: tuple[Path, Path], *extra: str) -> list[tuple[int, str, str]]:
    plan_path, port = tmp_path / "plan.json", free_port()
    save(plan, plan_path)
    nodes = [start_node(plan_path, r, port, outs[r], *extra) for r in (0, 1)]
    return [finish(p, 240) for p in nodes]


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def test_two_nodes_sharing_an_out_dir_match_the_single_process(tmp_path):
    """2 nodes x 1 rank (dp=2) into one --out-dir, checkpointing: each node's run file has the
    single-process losses, node 0's manifest lists both ranks' shards."""
    out = tmp_path / "run"
    (rc0, _, err0), (rc1, _, err1) = run_two_nodes(
        tmp_path, make_plan(dp=2), (out, out), "--steps", "3", "--checkpoint-every", "2", "--timeout", "120"
    )
    assert rc0 == 0 and rc1 == 0, err0[-2000:] + err1[-2000:]
    ref = reference_losses(make_plan(dp=2), steps=3)
    for name in ("run.json", "run.node1.json"):
        run = json.loads((out / name).read_text())
        assert max(abs(a - b) / b for a, b in zip(run["losses"], ref)) <= 1e-5, (name, run["losses"], ref)
    assert (out / "launch.log").exists() and (out / "launch.node1.log").exists()
    assert latest_step(out) == 2
    files = json.loads((out / "checkpoints" / "step_000002" / "manifest.json").read_text())["files"]
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(files)
    assert processes_of(out) == []


def test_two_nodes_of_two_ranks_with_their_own_out_dirs_match_the_single_process(tmp_path):
    """2 nodes x 2 ranks, one --out-dir per node: pp=2 (mesh pp, dp: the stages on different
    nodes, the point-to-point sends between them), dp=2 within each node."""
    plan, outs = make_plan(pp=2, dp=2, microbatches=2), (tmp_path / "node0", tmp_path / "node1")
    (rc0, _, err0), (rc1, _, err1) = run_two_nodes(tmp_path, plan, outs, "--steps", "3", "--timeout", "120")
    assert rc0 == 0 and rc1 == 0, err0[-2000:] + err1[-2000:]
    ref = reference_losses(plan, steps=3)
    for out, name in zip(outs, ("run.json", "run.node1.json")):
        run = json.loads((out / name).read_text())
        assert max(abs(a - b) / b for a, b in zip(run["losses"], ref)) <= 1e-5, (name, run["losses"], ref)
        assert processes_of(out) == []
    assert sorted(f.name for f in (outs[1] / "ranks").iterdir()) == ["rank2.status.json", "rank3.status.json"]


def test_checkpoints_without_a_shared_out_dir_are_refused(tmp_path):
    outs = (tmp_path / "node0", tmp_path / "node1")
    results = run_two_nodes(
        tmp_path, make_plan(dp=2), outs, "--steps", "3", "--checkpoint-every", "2", "--timeout", "120"
    )
    for rc, _, err in results:
        assert rc == 4
        assert "on a filesystem every node shares: ranks [1] do not see node 0's" in one_line(err)
    assert all(processes_of(out) == [] for out in outs)


def test_a_node_that_never_arrives_ends_the_other_within_its_timeout(tmp_path):
    plan_path, port, out = tmp_path / "plan.json", free_port(), tmp_path / "node0"
    save(make_plan(dp=2), plan_path)
    start = time.monotonic()
    rc, _, err = finish(start_node(plan_path, 0, port, out, "--steps", "3", "--timeout", "10"), 120)
    elapsed = time.monotonic() - start
    assert rc == 4, err[-2000:]
    assert one_line(err).startswith(
        f"meshplan run: error: node 0: only 1 of 2 nodes joined the rendezvous at "
        f"127.0.0.1:{port} within --timeout 10 s"
    ), err
    assert elapsed < 10 + 45  # the rendezvous timeout plus start-up (imports, plan check) on a busy host
    assert processes_of(out) == []


def test_a_node_killed_mid_run_ends_the_other(tmp_path):
    """Node 1 dies (its launcher and rank SIGKILLed) at step >= 3: node 0 ends at once with one
    line saying another node's ranks went away, rc 4; nothing of either node is left."""
    plan_path, port, outs = tmp_path / "plan.json", free_port(), (tmp_path / "node0", tmp_path / "node1")
    save(make_plan(dp=2), plan_path)
    nodes = [start_node(plan_path, r, port, outs[r], "--steps", "100000", "--timeout", "30") for r in (0, 1)]
    try:
        status = outs[1] / "ranks" / "rank1.status.json"
        pid = wait_for(lambda: _step(status) >= 3 and json.loads(status.read_text())["pid"], 120, "node 1 at step 3")
        os.killpg(nodes[1].pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        rc, _, err = finish(nodes[0], 60)
        assert time.monotonic() - start < 30 + 15
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
            node.wait()
    assert rc == 4, err[-2000:]
    assert one_line(err).startswith("meshplan run: error: node 0: another node's ranks went away at step "), err
    for out in outs:
        wait_for(lambda out=out: processes_of(out) == [], 30, f"no process of {out.name}")


def _step(status: Path) -> int:
    try:
        return json.loads(status.read_text()).get("step", -1)
    except (OSError, ValueError):
        return -1


def test_nodes_share_a_directory_but_not_a_node_rank(tmp_path):
    """Node locks: nodes 0 and 1 of a job may share --out-dir; a second node 1, or a single-node
    run, into it refuses naming the holder."""
    from meshplan.errors import MeshplanError
    from meshplan.executor.run_dir import RunDirLock

    locks = [RunDirLock(tmp_path, f"job-{r}", r).acquire() for r in (0, 1)]
    try:
        with pytest.raises(MeshplanError, match=r"in use by run job-1 \(pid \d+, node 1\)"):
            RunDirLock(tmp_path, "again", 1).acquire()
        with pytest.raises(MeshplanError, match=r"in use by run job-0 \(pid \d+, node 0\)"):
            RunDirLock(tmp_path, "single", None).acquire()
    finally:
        for lock in locks:
            lock.release()
    single = RunDirLock(tmp_path, "single", None).acquire()
    try:
        with pytest.raises(MeshplanError, match=r"in use by run single"):
            RunDirLock(tmp_path, "node", 0).acquire()
    finally:
        single.release()
