"""One rank of `meshplan profile-links`: time collectives and write the raw samples as JSON.

Launched by meshplan.profiler.links through torchrun (`python -m torch.distributed.run
--standalone --nproc-per-node N -m meshplan.profiler.links_worker CONFIG OUT`); gloo on CPU,
nccl on CUDA. CONFIG is a JSON file: {"cases": [[collective, group_size, message_bytes], ...],
"repeats_small", "repeats_large", "large_bytes", "progress", "host"} ("host": the host tiers
config, profiler/host_probe.py, or null).

Group size g splits the world into floor(N/g) disjoint groups of consecutive ranks that run the
collective at the same time (as tensor- or data-parallel groups do in training); ranks left over
stay idle. Message size is the whole buffer: the input of all_reduce, reduce_scatter and
all_to_all, the output of all_gather; send/recv is a ping-pong inside pairs, reported one-way;
gather is a fan-in, every other rank of the group sending one message of that size to the
group's first rank at once (posted receives, as master aggregation's workers send their
gradients), so the root's link carries (g - 1) messages.
One sample = the mean over a few back-to-back calls, the max over ranks (the slowest rank
decides when a collective is done); samples are taken in round-robin passes over all cases. Rank 0 writes {"device", "backend", "world_size",
"samples": [[collective, group_size, bytes, [seconds, ...]], ...]}.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

ELEMENT_BYTES = 4  # float32 buffers


def _iters(message_bytes: int, on_cuda: bool) -> int:
    """Back-to-back calls per sample: more for small messages, whose single-call time is noisy."""
    base = 10 if message_bytes <= 2**16 else 5 if message_bytes <= 2**20 else 3 if message_bytes <= 2**24 else 1
    return base * (5 if on_cuda else 1)


_GROUP_CACHE: dict[int, tuple | None] = {}


def _groups(world: int, group_size: int) -> tuple | None:
    """(group, ranks) of this rank for `group_size`, or None when idle; created once per size.

    Every rank creates every subgroup, in the same order (new_group is collective)."""
    if group_size in _GROUP_CACHE:
        return _GROUP_CACHE[group_size]
    mine = None
    for start in range(0, world - group_size + 1, group_size):
        ranks = list(range(start, start + group_size))
        group = dist.new_group(ranks) if group_size < world else dist.group.WORLD
        if dist.get_rank() in ranks:
            mine = (group, ranks)
    _GROUP_CACHE[group_size] = mine
    return mine


def _make_op(collective: str, numel: int, group, ranks: list[int], device: torch.device):
    """A closure running one call of `collective` on a message of `numel` float32 elements."""
    g = len(ranks)
    rank = dist.get_rank()
    if collective == "all_reduce":
        buf = torch.ones(numel, device=device)
        return lambda: dist.all_reduce(buf, group=group)
    if collective == "all_gather":
        out, inp = torch.zeros(numel, device=device), torch.ones(numel // g, device=device)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if collective == "reduce_scatter":
        inp, out = torch.ones(numel, device=device), torch.zeros(numel // g, device=device)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    if collective == "all_to_all":
        inp, out = torch.ones(numel, device=device), torch.zeros(numel, device=device)
        return lambda: dist.all_to_all_single(out, inp, group=group)
    if collective == "send_recv":
        buf = torch.ones(numel, device=device)
        peer, first = (ranks[1], True) if rank == ranks[0] else (ranks[0], False)

        def ping_pong():  # one round trip = two one-way messages
            if first:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)

        return ping_pong
    if collective == "gather":
        return _fan_in(numel, ranks, device)
    raise ValueError(f"unknown collective {collective!r}")  # the parent validated the names


def _fan_in(numel: int, ranks: list[int], device: torch.device):
    """Every rank but ranks[0] sends one message to ranks[0], which has posted a receive for each
    and waits for all of them: the flows run at the same time and share the root's link."""
    if dist.get_rank() != ranks[0]:
        buf = torch.ones(numel, device=device)
        return lambda: dist.send(buf, ranks[0])
    inbox = [torch.zeros(numel, device=device) for _ in ranks[1:]]

    def receive_all():
        works = [dist.irecv(b, src) for b, src in zip(inbox, ranks[1:])]
        for w in works:
            w.wait()

    return receive_all


def _time_sample(op, iters: int, one_way: bool, device: torch.device) -> float:
    """Seconds per call on this rank (0.0 when idle), started together by a world barrier."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    dist.barrier()
    if op is None:
        return 0.0
    start = time.perf_counter()
    for _ in range(iters):
        op()
    sync()
    elapsed = (time.perf_counter() - start) / iters
    return elapsed / 2 if one_way else elapsed


def _case_op(case: list, world: int, device: torch.device):
    """(op or None when this rank is idle, group size, actual message bytes) for one case."""
    collective, group_size, message_bytes = case
    if collective == "send_recv":
        group_size = 2
    if collective == "gather":  # each sender's message: no split over the group
        numel = max(1, message_bytes // ELEMENT_BYTES)
    else:
        numel = max(group_size, message_bytes // ELEMENT_BYTES // group_size * group_size)
    mine = _groups(world, group_size)
    op = _make_op(collective, numel, mine[0], mine[1], device) if mine else None
    return op, group_size, numel * ELEMENT_BYTES


def _passes_of(case: list, cfg: dict) -> set[int]:
    """The passes in which a case takes a sample: every pass, or an even spread of
    `repeats_large` passes for large messages."""
    passes = cfg["repeats_small"]
    if case[2] < cfg["large_bytes"]:
        return set(range(passes))
    count = min(cfg["repeats_large"], passes)
    return {i * passes // count for i in range(count)}


def sweep(cfg: dict, world: int, device: torch.device) -> list[list]:
    """Round-robin passes over the cases, one sample per case per pass, so that each case's
    samples are spread over the whole run: the machine drifts by tens of percent over seconds
    (another tenant, the scheduler), and a median of back-to-back samples would catch one moment."""
    cases = [c for c in cfg["cases"] if c[1] <= world]
    plan = [_passes_of(c, cfg) for c in cases]
    local: list[list[float]] = [[] for _ in cases]
    meta: list[tuple[int, int]] = [(0, 0)] * len(cases)
    total, done = sum(len(p) for p in plan), 0
    for pass_index in range(cfg["repeats_small"]):
        for i, case in enumerate(cases):
            if pass_index not in plan[i]:
                continue
            done += 1
            op, group_size, message_bytes = _case_op(case, world, device)
            meta[i] = (group_size, message_bytes)
            if op is not None and not local[i]:
                op()  # warm-up: connection set-up and first touch of the buffers
            local[i].append(_time_sample(op, _iters(case[2], device.type == "cuda"), case[0] == "send_recv", device))
        if dist.get_rank() == 0 and cfg.get("progress"):  # links.py's reader counts these
            print(
                f"profile-links: pass {pass_index + 1}/{cfg['repeats_small']} done, {done}/{total} collectives measured",
                file=sys.stderr,
                flush=True,
            )
    flat = torch.tensor([x for xs in local for x in xs], dtype=torch.float64)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX)  # the slowest rank decides when a collective is done
    out, pos = [], 0
    for case, (group_size, message_bytes), xs in zip(cases, meta, local):
        out.append([case[0], group_size, message_bytes, flat[pos : pos + len(xs)].tolist()])
        pos += len(xs)
    return out


def main(config_path: str, out_path: str) -> None:
    with open(config_path) as fh:
        cfg = json.load(fh)
    on_cuda = torch.cuda.is_available() and cfg.get("device", "auto") != "cpu"
    backend = "nccl" if on_cuda else "gloo"
    if on_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
    torch.set_num_threads(1)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=cfg.get("pg_timeout_s", 300)))
    world, rank = dist.get_world_size(), dist.get_rank()
    samples = sweep(cfg, world, device)
    host = None
    if cfg.get("host"):  # host memory, host <-> device and disk, every rank at once
        from meshplan.profiler.host_probe import measure as measure_host

        host = measure_host(cfg["host"], device, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        if host.get("disk"):
            host["disk"]["dir"] = cfg["host"]["disk_dir"]
    if rank == 0:
        name = torch.cuda.get_device_name(device) if on_cuda else "cpu"
        memory = torch.cuda.get_device_properties(device).total_memory if on_cuda else 0
        result = {
            "device": name,
            "device_memory_bytes": memory,
            "backend": backend,
            "world_size": world,
            "torch_version": torch.__version__,
            "samples": samples,
            "host": host,
        }
        tmp = out_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(result, fh)
        os.replace(tmp, out_path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
