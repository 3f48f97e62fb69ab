"""sync=async: asynchronous model averaging on a background thread (BAGUA async_model_average).

Every replica trains on its own gradients. Every period steps the main thread copies its
parameters (a snapshot s) and hands it to a background thread, which all-reduces the snapshot
on its OWN process group (a gloo group made for it, so its collectives never interleave with the
main thread's) while training continues. When the round has landed, at a later step boundary the
main thread applies it without losing the local progress made meanwhile: x <- x + (mean(s) - s).
Staleness is at most one round: a new snapshot waits for the previous round to land. Every
correction sums to zero over the ranks, so the replicas' mean is exactly what local training
made it (tests/test_sync_async_safety.py checks it over many seeded runs with random delays).

No deadlock, by construction: every rank hands over its k-th snapshot at the same step (the
same period, the same number of steps), so the k-th all-reduces always pair up; the main thread
never holds a lock the thread needs (they share only two queues, one round in flight at most).
Stopping is unconditional (train.py calls close() in a finally; AsyncAverager is a context
manager), and every wait is bounded:
- normal end: close() lands the round in flight (every rank has one in the same position), then
  the thread is told to stop and joined;
- an error or a signal in the step loop (SIGINT's KeyboardInterrupt, the launcher's SIGTERM):
  close(aborted=True) does not wait for the round; the thread is told to stop and joined;
- a dead or stopped peer: the averaging group's gloo timeout (timeout_s) fails the round's
  all-reduce (a killed peer's closed sockets fail it at once); the thread records the error and
  exits; the rank trains on alone (its own collectives fail as they would anyway) and close()
  reports the error as a warning. A round that has not landed GRACE_S past the timeout marks
  the averager failed too (the thread is then left: it is a daemon, it never keeps a process
  alive).
The join waits at most timeout_s + GRACE_S (GRACE_S when aborted: the daemon thread need not
hold the exit up); the averaging group is destroyed once the thread has ended (never under a
live collective).
Bytes: one fp32 all-reduce of the parameters per round ("dp_replicate"), counted when the round
is handed over, so the steady state is exactly bytes / period, as planner/sync.py predicts.
"""

from __future__ import annotations

import datetime
import queue
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.distributed as dist

from meshplan.executor.methods.sync import SyncMethod, flat, no_ddp_comm_hook, tensor_bytes, trainable, unflat

USES_DDP = False
ddp_comm_hook = no_ddp_comm_hook
GRACE_S = 5.0
"""How long past the group's timeout a wait on the thread lasts before it is given up."""


class AsyncAverager:
    """The background averaging thread, its process group and the per-step protocol on a list of
    tensors (usable without a model: tests drive it with plain tensors).

    `delay` (tests): called in the thread before each all-reduce, e.g. a seeded random sleep."""

    def __init__(
        self,
        ranks: list[int],
        period: int,
        timeout_s: float,
        on_round: Callable[[int], None] = lambda nbytes: None,
        delay: Callable[[], None] | None = None,
    ):
        self.group = dist.new_group(ranks, backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        self.world = dist.get_world_size(self.group)
        self.period, self.timeout_s = period, timeout_s
        self.on_round, self.delay = on_round, delay
        self.todo: queue.Queue = queue.Queue()
        self.done: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.in_flight = False
        self.steps = 0
        self.submitted = 0
        self.closed = False
        self.applied: list[dict] = []
        """One entry per landed round, in order: {"round", "step" (applied after it), "waited" (the
        main thread waited for it: the round was exposed), "moved" (||mean - snapshot||)}."""
        self.thread = threading.Thread(target=self._run, name="meshplan-async-averaging", daemon=True)
        self.thread.start()

    # --- the background thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                snapshot = self.todo.get()
                if snapshot is None or self.stopping.is_set():
                    return
                if self.delay is not None:
                    self.delay()
                mean = snapshot.clone()
                dist.all_reduce(mean, group=self.group)  # fails after timeout_s on a dead peer
                self.done.put((snapshot, mean / self.world))
        except BaseException as exc:  # a dead peer, a timeout, the group torn down
            self.error = exc
            self.done.put(None)  # wakes a collect() waiting on this round

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    # --- the main thread ---------------------------------------------------------------------
    def after_step(self, tensors: Sequence[torch.Tensor]) -> None:
        """Once per optimizer step: apply a round that has landed; every period steps wait for
        the round in flight (at most one) and hand over a new snapshot."""
        self.steps += 1
        if self.steps % self.period:
            self._apply(tensors, self._collect(wait=False), waited=False)
            return
        self._apply(tensors, self._collect(wait=True), waited=True)
        if not self.alive:  # a peer died: train on alone (its collectives will fail anyway)
            return
        snapshot = flat(tensors)
        self.on_round(tensor_bytes(snapshot))
        self.todo.put(snapshot)
        self.in_flight = True
        self.submitted += 1

    def _collect(self, wait: bool):
        """(snapshot, its mean over the ranks) once the round has landed, else None."""
        if not self.in_flight:
            return None
        try:
            got = self.done.get(timeout=self.timeout_s + GRACE_S) if wait else self.done.get_nowait()
        except queue.Empty:
            if wait:  # longer than the group's own timeout: the thread is stuck; give up on it
                self.error = self.error or TimeoutError(f"no averaging round landed within {self.timeout_s:g} s")
                self.in_flight = False
            return None
        self.in_flight = False
        return got

    @torch.no_grad()
    def _apply(self, tensors: Sequence[torch.Tensor], landed, waited: bool) -> None:
        if landed is None:
            return
        snapshot, mean = landed
        unflat(flat(tensors) + (mean - snapshot), tensors)
        moved = float((mean - snapshot).norm())
        self.applied.append({"round": len(self.applied), "step": self.steps, "waited": waited, "moved": moved})

    def close(self, tensors: Sequence[torch.Tensor] | None, aborted: bool = False) -> None:
        """Stop, always: land the round in flight (unless aborted), stop and join the thread
        (bounded), destroy the averaging group once the thread has ended. Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            if not aborted and tensors is not None:
                self._apply(tensors, self._collect(wait=True), waited=True)
        finally:
            self.stopping.set()
            self.todo.put(None)
            # aborted: peers may be gone mid-round; the daemon thread need not hold the exit up
            self.thread.join(timeout=GRACE_S if aborted else self.timeout_s + GRACE_S)
            if not self.thread.is_alive():
                dist.destroy_process_group(self.group)
            if self.error is not None:
                warnings.warn(
                    f"sync=async: the averaging thread stopped on {type(self.error).__name__}: {self.error}",
                    stacklevel=2,
                )

    def __enter__(self) -> AsyncAverager:
        return self

    def __exit__(self, kind, exc, tb) -> Literal[False]:
        self.close(None, aborted=True)
        return False


class AsyncAveraging(SyncMethod):
    def __init__(self, par, params, counter):
        super().__init__(par, params, counter)
        ranks = [dist.get_global_rank(self.group, r) for r in range(self.world)]
        self.averager = AsyncAverager(
            ranks,
            params["period"],
            params["timeout_s"],
            on_round=lambda nbytes: self.counter.add("dp_replicate", "all_reduce", self.world, nbytes),
        )
        self.stats = self.averager.applied

    def after_step(self) -> None:
        self.averager.after_step(trainable(self.par.parameters()))

    def close(self, aborted: bool = False) -> None:
        try:
            self.averager.close(trainable(self.par.parameters()), aborted)
        finally:
            super().close(aborted)


def build(par, params, counter):
    return AsyncAveraging(par, params, counter)
