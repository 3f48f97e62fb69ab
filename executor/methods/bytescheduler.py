"""comm_schedule=bytescheduler (Peng et al., ByteScheduler, SOSP 2019): gradients partitioned into
chunks of `chunk_mb`, enqueued as backward produces them, and sent by a scheduler thread that
always picks the most urgent ready chunk (priority = the layer's position from the input: the
parameter the next forward needs first goes first) whenever the credit window (`credit_mb` of
chunks in flight) has room. ZeRO-0 without tensor or pipeline parallelism
(meshplan/feasibility.py); instead of DDP.

`ScheduledReplica` wraps the model part. A post-accumulate-grad hook per parameter marks its
gradient ready on the last microbatch (`set_requires_gradient_sync`, which Parallelized's
accumulation loop calls as for FSDP2) and returns at once: backward never waits on the credit.
`PriorityScheduler`'s thread does the rest, in rounds:
1. negotiate: which gradients are ready on every rank (an all-reduce MIN of the ready flags over
   a small control group of the same ranks: what Horovod's coordinator does for ByteScheduler's
   all-reduce plugin, since gloo, like NCCL, needs every rank to issue the same collectives in
   the same order). Agreed gradients' chunks join a priority queue;
2. commit: pop the most urgent queued chunks, up to one credit of bytes, and issue each as an
   asynchronous all-reduce once the bytes in flight leave room for it (waiting on the oldest).
A chunk of a higher-priority layer that becomes ready later joins the queue at the next round
and overtakes every lower-priority chunk still queued: preemption at credit granularity
(Sec 4.2). Every decision depends only on the agreed flags, so every rank issues the same chunks
in the same order; the negotiations are control traffic, not counted in the gradient bytes (a
round's flags are 4 bytes a parameter tensor), and their number is in the statistics.

Backward's end (an autograd-engine callback) marks gradients that never arrived (unused
parameters) as zeros, waits for the thread, then divides each gradient by the group size: DDP's
average, element for element (a sum split into chunks is the same sum).

The next forward does not start per layer (ByteScheduler's dependency proxy, Sec 4.3): train.py
steps the optimizer once over every parameter after backward, and global-norm clipping, when
on, needs every gradient first. `EARLY_FORWARD` says so, the statistics repeat it, and the
planner (planner/comm_schedule.py) prices the wait for the last chunk, plus one negotiation
latency per round.

Statistics (sync.STATS_DIR_ENV, rewritten after every step): per step the ready order, the send
order (priority, chunk, bytes, bytes in flight after issuing, round), the rounds and the
overtakes (chunks sent ahead of an earlier-queued, lower-priority chunk).
"""

from __future__ import annotations

import heapq
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from meshplan.comm_bytes import ByteCounter
from meshplan.executor.methods.counting import tensor_bytes
from meshplan.executor.methods.sync import STATS_DIR_ENV

EARLY_FORWARD = False
"""Whether the next forward's layer i starts once layer i's chunks land (module docstring)."""
EARLY_FORWARD_WHY = (
    "the next forward starts after every chunk has landed: the optimizer steps once over all "
    "parameters (and global-norm clipping needs every gradient)"
)


class Agreed:
    """A negotiation in flight: the flags once every rank's have been combined."""

    def __init__(self, flags, work=None):
        self.flags, self.work = flags, work

    def result(self) -> list[bool]:
        if self.work is not None:
            self.work.wait()
        return [bool(x) for x in (self.flags.tolist() if isinstance(self.flags, torch.Tensor) else self.flags)]


class PriorityScheduler:
    """The scheduler of one backward pass (module docstring), on `sizes[p]` = the chunk byte sizes of
    priority p (0 = most urgent). `issue(p, c)` starts chunk c of priority p and returns a work
    with wait(); `negotiate(flags)` starts the agreement and returns a handle whose result() is
    the flags ready on every rank (Agreed: those flags, on one rank)."""

    def __init__(
        self,
        sizes: list[list[int]],
        credit: int,
        issue: Callable[[int, int], object],
        negotiate: Callable[[list[bool]], Agreed],
    ):
        self.sizes, self.credit, self.issue, self.negotiate = sizes, credit, issue, negotiate
        self.local = [False] * len(sizes)
        self.ready_order: list[int] = []
        self.sent: list[tuple[int, int, int, int, int]] = []
        self.rounds = self.overtakes = 0
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="bytescheduler", daemon=True)
        self.thread.start()

    def ready(self, priority: int) -> None:
        """Called from backward: never blocks on the credit."""
        with self.cond:
            if not self.local[priority]:
                self.local[priority] = True
                self.ready_order.append(priority)
                self.cond.notify()

    def finish(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"bytescheduler's communication thread failed: {self.error}") from self.error

    def _run(self) -> None:
        try:
            self._rounds()
        except BaseException as exc:  # handed to finish(), in the training thread
            self.error = exc

    def _rounds(self) -> None:
        n = len(self.sizes)
        agreed: list[bool] = [False] * n
        queue: list[tuple[int, int, int]] = []
        flight: deque = deque()
        in_flight = 0
        while not (all(agreed) and not queue):
            with self.cond:  # a local wait only: what happens next depends on agreed state
                while not queue and not any(mine and not ok for mine, ok in zip(self.local, agreed)):
                    self.cond.wait()
                flags = list(self.local)
            pending = None if all(agreed) else self.negotiate(flags)  # overlaps the credit wait
            while queue and flight and in_flight + self.sizes[queue[0][0]][queue[0][1]] > self.credit:
                work, landed = flight.popleft()
                work.wait()
                in_flight -= landed
            if pending is not None:
                self.rounds += 1
                for p, ok in enumerate(pending.result()):
                    if ok and not agreed[p]:
                        agreed[p] = True
                        for c in range(len(self.sizes[p])):
                            heapq.heappush(queue, (p, c, len(self.sent) + len(queue)))
            while queue and (not flight or in_flight + self.sizes[queue[0][0]][queue[0][1]] <= self.credit):
                p, c, seq = heapq.heappop(queue)
                if queue and min(q[2] for q in queue) < seq:  # a lower-priority chunk queued earlier waits
                    self.overtakes += 1
                size = self.sizes[p][c]
                flight.append((self.issue(p, c), size))
                in_flight += size
                self.sent.append((p, c, size, in_flight, self.rounds))
        while flight:
            flight.popleft()[0].wait()


class ScheduledReplica(nn.Module):
    def __init__(self, module: nn.Module, group, params: dict, counter: ByteCounter, axis: str = "dp_replicate"):
        super().__init__()
        self.module, self.group, self.counter, self.axis = module, group, counter, axis
        self.chunk_bytes = int(params["chunk_mb"] * 2**20)
        self.credit_bytes = max(int(params["credit_mb"] * 2**20), self.chunk_bytes)
        self.world = dist.get_world_size(group)
        ranks = dist.get_process_group_ranks(group)
        self.control = dist.new_group(ranks, backend="gloo", use_local_synchronization=True) if self.world > 1 else None
        self.sync = True
        self.scheduler: PriorityScheduler | None = None
        self.steps: list[dict] = []
        self.totals = {"steps": 0, "rounds": 0, "overtakes": 0, "chunks": 0}
        counter.notes_from.append(self)
        self.params = [p for p in module.parameters() if p.requires_grad]
        directory = os.environ.get(STATS_DIR_ENV)
        self.stats_path = os.path.join(directory, f"bytescheduler.rank{dist.get_rank()}.json") if directory else None
        for priority, p in enumerate(self.params):  # parameters() runs input -> output
            p.register_post_accumulate_grad_hook(lambda p, priority=priority: self._ready(priority))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def set_requires_gradient_sync(self, flag: bool) -> None:
        self.sync = flag

    def _chunk_elems(self, p: nn.Parameter) -> int:
        return max(1, self.chunk_bytes // p.element_size())

    def _sizes(self) -> list[list[int]]:
        out = []
        for p in self.params:
            step, n = self._chunk_elems(p), p.numel()
            out.append([min(step, n - s) * p.element_size() for s in range(0, n, step)] or [0])
        return out

    def _issue(self, priority: int, index: int):
        p = self.params[priority]
        step = self._chunk_elems(p)
        assert p.grad is not None  # ready: its hook fired, or _drain zero-filled it
        chunk = p.grad.view(-1)[index * step : (index + 1) * step]
        self.counter.add(self.axis, "all_reduce", self.world, tensor_bytes(chunk))
        return dist.all_reduce(chunk, group=self.group, async_op=True)

    def _negotiate(self, flags: list[bool]):
        if self.control is None:
            return Agreed(flags)
        t = torch.tensor(flags, dtype=torch.int32)
        return Agreed(t, dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control, async_op=True))

    def _ready(self, priority: int) -> None:
        if not self.sync:
            return
        if self.scheduler is None:
            torch.autograd.Variable._execution_engine.queue_callback(self._drain)
            self.scheduler = PriorityScheduler(self._sizes(), self.credit_bytes, self._issue, self._negotiate)
        self.scheduler.ready(priority)

    def _drain(self) -> None:
        scheduler, self.scheduler = self.scheduler, None
        assert scheduler is not None
        for priority, p in enumerate(self.params):  # unused parameters: zeros, as DDP
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            scheduler.ready(priority)
        backward_end = time.perf_counter()
        scheduler.finish()
        for p in self.params:
            assert p.grad is not None
            p.grad.div_(self.world)
        for key, value in (("steps", 1), ("rounds", scheduler.rounds), ("overtakes", scheduler.overtakes)):
            self.totals[key] += value
        self.totals["chunks"] += len(scheduler.sent)
        if not self.stats_path:
            return
        self.steps.append(
            {
                "ready_order": scheduler.ready_order,
                "sent": scheduler.sent,
                "rounds": scheduler.rounds,
                "overtakes": scheduler.overtakes,
                "wait_after_backward_s": time.perf_counter() - backward_end,
                "early_forward": EARLY_FORWARD,
                "why": EARLY_FORWARD_WHY,
            }
        )
        os.makedirs(os.path.dirname(self.stats_path), exist_ok=True)
        with open(self.stats_path, "w") as f:
            json.dump(self.steps, f)

    def notes(self) -> list[str]:
        """The run's line (RankResult.method_notes): what the scheduler did, and the early-forward rule."""
        t = self.totals
        return [
            f"bytescheduler: {t['chunks']} chunks in {t['rounds']} negotiation rounds over {t['steps']} steps, "
            f"{t['overtakes']} sent ahead of an earlier-queued lower-priority chunk; {EARLY_FORWARD_WHY}"
        ]


def wrap(part: nn.Module, group, params: dict, counter: ByteCounter) -> ScheduledReplica:
    return ScheduledReplica(part, group, params, counter)


def bucket_bytes(params: dict) -> int:
    """The ReplicaGradReducer's bucket if a layout ever falls back to it (feasibility forbids it)."""
    return int(params["chunk_mb"] * 2**20)
