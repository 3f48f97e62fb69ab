"""comm_schedule=bytescheduler (Peng et al., SOSP 2019): gradients cut into chunks of `chunk_mb`,
all-reduced in layer-priority order (the parameter the next forward needs first goes first)
under a credit window of `credit_mb` bytes in flight. ZeRO-0 without tensor or pipeline
parallelism (meshplan/feasibility.py); instead of DDP.

`ScheduledReplica` wraps the model part: a post-accumulate-grad hook per parameter enqueues its
gradient's chunks when backward produces it on the last microbatch (`set_requires_gradient_sync`,
which Parallelized's accumulation loop calls as for FSDP2); each enqueue issues the most urgent
ready chunks while credit remains, and when the window is full waits for the oldest chunk in
flight. Every decision depends only on the order gradients become ready, which is the same on
every rank (a full window is waited out in the hook, never polled), so every rank issues the same collectives in the same order (gloo requires it).
Backward's end (an autograd-engine callback) drains the queue and waits for everything, then
each gradient is divided by the group size: DDP's average, element for element (a sum split into
chunks is the same sum). `sent` records (priority, chunk, bytes, bytes in flight after issuing)
per message for the tests. Not done: starting the next forward per layer before the last chunk
lands (ByteScheduler's dependency proxy) — global-norm clipping needs every gradient first.
"""

from __future__ import annotations

import heapq

import torch
import torch.distributed as dist
from torch import nn

from meshplan.comm_bytes import ByteCounter
from meshplan.executor.methods.counting import tensor_bytes


class ScheduledReplica(nn.Module):
    def __init__(self, module: nn.Module, group, params: dict, counter: ByteCounter, axis: str = "dp_replicate"):
        super().__init__()
        self.module, self.group, self.counter, self.axis = module, group, counter, axis
        self.chunk_bytes = int(params["chunk_mb"] * 2**20)
        self.credit_bytes = max(int(params["credit_mb"] * 2**20), self.chunk_bytes)
        self.world = dist.get_world_size(group)
        self.sync = True
        self.ready: list = []  # heap of (priority, chunk index, flat view)
        self.flight: list = []  # FIFO of (work, bytes)
        self.in_flight = 0
        self.sent: list[tuple[int, int, int, int]] = []
        self._queued = False
        self.params = [p for p in module.parameters() if p.requires_grad]
        for priority, p in enumerate(self.params):  # parameters() runs input -> output
            p.register_post_accumulate_grad_hook(lambda p, priority=priority: self._ready(priority, p))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def set_requires_gradient_sync(self, flag: bool) -> None:
        self.sync = flag

    def _ready(self, priority: int, p: nn.Parameter) -> None:
        if not self.sync:
            return
        if not self._queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._drain)
            self._queued = True
        flat = p.grad.view(-1)
        step = max(1, self.chunk_bytes // flat.element_size())
        for index, chunk in enumerate(flat.split(step)):
            heapq.heappush(self.ready, (priority, index, chunk))
        self._issue()
        while self.ready and self.flight:  # window full: the oldest chunk must land first
            self._release_oldest()
            self._issue()

    def _issue(self) -> None:
        while self.ready:
            size = tensor_bytes(self.ready[0][2])
            if self.flight and self.in_flight + size > self.credit_bytes:
                return
            priority, index, chunk = heapq.heappop(self.ready)
            self.counter.add(self.axis, "all_reduce", self.world, size)
            work = dist.all_reduce(chunk, group=self.group, async_op=True)
            self.flight.append((work, size))
            self.in_flight += size
            self.sent.append((priority, index, size, self.in_flight))

    def _release_oldest(self) -> None:
        work, size = self.flight.pop(0)
        work.wait()
        self.in_flight -= size

    def _drain(self) -> None:
        self._queued = False
        while self.ready or self.flight:
            if self.ready and (not self.flight or self.in_flight + tensor_bytes(self.ready[0][2]) <= self.credit_bytes):
                self._issue()
            else:
                self._release_oldest()
        for p in self.params:
            if p.grad is not None:
                p.grad.div_(self.world)


def wrap(part: nn.Module, group, params: dict, counter: ByteCounter) -> ScheduledReplica:
    return ScheduledReplica(part, group, params, counter)


def bucket_bytes(params: dict) -> int:
    """The ReplicaGradReducer's bucket if a layout ever falls back to it (feasibility forbids it)."""
    return int(params["chunk_mb"] * 2**20)
