"""One node of a multi-node job: `meshplan run --nnodes N --node-rank R --rdzv-endpoint HOST:PORT`.

Each node runs its own launcher, which starts torchrun for its world_size / N local ranks and
watches only those (global ranks R * local .. (R + 1) * local - 1; torchrun's static rendezvous
keeps --node-rank, c10d would renumber nodes by arrival). The nodes' --out-dir may be one shared
directory (one filesystem every node mounts) or one per node:
- files: node 0 writes run.json and launch.log, node R > 0 run.node<R>.json and launch.node<R>.log;
  each node locks .meshplan.node<R>.lock (executor/run_dir.py), status and result files are per rank;
- checkpoints need the shared directory: DCP on resume reads shards other ranks wrote, and rank 0
  hashes every shard into the step's manifest. The ranks check it (a probe file rank 0 writes) and
  refuse --checkpoint-every / --resume otherwise;
- every node must run the same plan and flags: the ranks compare them before the first step.
The launcher-side half (the lines that name a missing or dead node) is here too."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError

SAME_FLAGS = ("steps", "optimizer", "lr", "grad_clip", "seed", "data", "checkpoint_every", "resume")


def node_file(name: str, node_rank: int, nnodes: int) -> str:
    """run.json -> run.node1.json on node 1 (node 0 and single-node runs keep the plain name)."""
    if nnodes == 1 or node_rank == 0:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}.node{node_rank}{dot}{ext}"


# ---- rank side (torch.distributed initialised) -------------------------------------------------


def is_multinode() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) != int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def check_ranks_agree(args, plan_hashes: list[str]) -> None:
    """Refuse (on every rank) when another node was started with another plan or flags."""
    import torch.distributed as dist

    mine = {"plan": plan_hashes, **{k: getattr(args, k) for k in SAME_FLAGS}}
    every: list[Any] = [None] * dist.get_world_size()  # each rank's `mine`
    dist.all_gather_object(every, mine)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    for rank, theirs in enumerate(every):
        for key, value in theirs.items():
            if value != every[0][key]:
                raise MeshplanError(
                    f"node {rank // local} was started with {key} {value!r}, node 0 with "
                    f"{every[0][key]!r}: start every node with the same plan and flags"
                )


def check_shared_out_dir(args) -> None:
    """--checkpoint-every / --resume across nodes need one --out-dir every rank sees."""
    import torch.distributed as dist

    if not (args.checkpoint_every or args.resume):
        return
    token = [secrets.token_hex(8) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0)
    probe = Path(args.out_dir) / f".meshplan-probe-{token[0]}"
    if dist.get_rank() == 0:
        probe.write_text("")
    dist.barrier()
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, probe.exists())
    dist.barrier()
    if dist.get_rank() == 0:
        probe.unlink()
    if not all(seen):
        blind = [r for r, s in enumerate(seen) if not s]
        raise MeshplanError(
            f"--checkpoint-every/--resume on several nodes need one --out-dir on a filesystem "
            f"every node shares: ranks {blind} do not see node 0's {args.out_dir} (DCP resume "
            "reads other ranks' shards); give every node the same shared --out-dir, or run "
            "without checkpoints"
        )


# ---- launcher side: one line naming the node that is missing or gone --------------------------

_WAITING = re.compile(r"waiting for clients\. (\d+)/(\d+) clients joined")
_NO_SERVER = re.compile(r"timed out after \d+ms while trying to connect to")
_IN_USE = re.compile(r"EADDRINUSE|failed to listen")


def rendezvous_message(log_text: str, node_rank: int, nnodes: int, endpoint: str, timeout_s: float) -> str | None:
    """What torchrun's rendezvous failure in `log_text` means, or None if it did not fail there."""
    waiting = _WAITING.search(log_text)
    start = (
        f"start every node with `meshplan run PLAN --nnodes {nnodes} --node-rank R --rdzv-endpoint "
        f"{endpoint}` within --timeout of each other"
    )
    if waiting:
        return (
            f"node {node_rank}: only {waiting.group(1)} of {nnodes} nodes joined the rendezvous at {endpoint} "
            f"within --timeout {timeout_s:g} s; {start}; no rank started"
        )
    if _NO_SERVER.search(log_text):
        return (
            f"node {node_rank}: node 0 did not open the rendezvous at {endpoint} within --timeout "
            f"{timeout_s:g} s (not started, or another address/port); {start}; no rank started"
        )
    if _IN_USE.search(log_text):
        return (
            f"node {node_rank}: --rdzv-endpoint {endpoint}: the port is in use on this host; "
            "give every node another port; no rank started"
        )
    return None


def peer_failure_message(statuses: dict[int, dict], node_rank: int, is_secondary) -> str | None:
    """Every local rank that failed only lost a peer: the failure is on another node."""
    errors = [s for s in statuses.values() if s.get("state") == "error"]
    if not errors or not all(is_secondary(s.get("error", "")) for s in errors):
        return None
    first = min(errors, key=lambda s: s.get("time", 0))
    return (
        f"node {node_rank}: another node's ranks went away at step {first.get('step', -1)} (rank "
        f"{first['rank']}: {first.get('error', '')[:120]}); that node died or was stopped, see its own "
        "output; this node's ranks ended"
    )


def hang_message(statuses: dict[int, dict], node_rank: int, nnodes: int, endpoint: str, timeout_s: float) -> str | None:
    """The watchdog fired on a node: before its ranks started, or with all of them waiting at one
    step (None when they are at different steps: then a rank of this node fell behind)."""
    steps = {s.get("step", -1) for s in statuses.values()}
    if all(s.get("state") == "not started" for s in statuses.values()):
        return (
            f"node {node_rank}: no rank started within the rendezvous at {endpoint} and --timeout "
            f"{timeout_s:g} s: not every one of the {nnodes} nodes arrived; job killed"
        )
    if len(steps) > 1:
        return None
    return (
        f"node {node_rank}: no progress from any rank for {timeout_s:g} s, this node's ranks all at step "
        f"{max(steps)}: a rank on another node is stuck or its node is gone; job killed"
    )
