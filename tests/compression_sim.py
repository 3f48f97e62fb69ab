"""N simulated ranks in one process for the compression codecs (executor/methods/compressed.py):
each rank is a thread with its own codec; `ThreadComm` is the group (all_gather / all_reduce
through a barrier, sums in rank order like every rank of a real group). Used by the unit and
convergence tests; the gloo tests run the same codecs inside DDP."""

from __future__ import annotations

import threading

import torch


class ThreadGroup:
    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world)
        self.slots: list = [None] * world
        self.sent_bytes = [0] * world


class ThreadComm:
    def __init__(self, group: ThreadGroup, rank: int):
        self.group, self.rank, self.world = group, rank, group.world

    def _swap(self, t: torch.Tensor) -> list[torch.Tensor]:
        self.group.barrier.wait()
        self.group.slots[self.rank] = t.clone()
        self.group.barrier.wait()
        out = list(self.group.slots)
        self.group.barrier.wait()
        return out

    def all_gather(self, payload: torch.Tensor) -> list[torch.Tensor]:
        self.group.sent_bytes[self.rank] += (self.world - 1) * payload.numel() * payload.element_size()
        return self._swap(payload)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = self._swap(tensor)
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        tensor.copy_(total)
        return tensor


def run_ranks(world: int, fn) -> list:
    """fn(rank, comm) on `world` threads; their results in rank order (exceptions re-raised)."""
    group, out, errors = ThreadGroup(world), [None] * world, []

    def body(rank):
        try:
            out[rank] = fn(rank, ThreadComm(group, rank))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def exchange(codecs: list, grads: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """One step: rank r's tensors `grads[r]` (keys 0..k-1) exchanged by `codecs[r]`; returns the
    averaged tensors each rank ends with (copies)."""

    def fn(rank, comm):
        items = [(i, g.reshape(-1).clone(), tuple(g.shape)) for i, g in enumerate(grads[rank])]
        codecs[rank].exchange(comm, items)
        return [f.view(g.shape) for (_, f, _), g in zip(items, grads[rank])]

    return run_ranks(len(codecs), fn)
