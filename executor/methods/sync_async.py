"""sync=async: asynchronous model averaging on a background thread (BAGUA async_model_average).

Every replica trains on its own gradients. Every period steps the main thread copies its
parameters (a snapshot s) and hands it to a background thread, which all-reduces the snapshot
on its OWN process group (a gloo group made for it, so its collectives never interleave with the
main thread's) while training continues. When the round has landed, at a later step boundary the
main thread applies it without losing the local progress made meanwhile: x <- x + (mean(s) - s).
Staleness is at most one round: a new snapshot waits for the previous round to land.

No deadlock, by construction: every rank hands over its k-th snapshot at the same step (the
same period, the same number of steps), so the k-th all-reduces always pair up; the main
thread never holds a lock the thread needs (they share only a one-slot queue). Stopping:
- normal end: close() waits for the round in flight (every rank has one in the same position);
- SIGINT / SIGTERM: train.py's finally calls close(), which waits at most timeout_s;
- a dead peer: the averaging group's timeout (timeout_s) fails the round's all-reduce; the thread
  records the error and exits, close() reports it as a warning, training's own collectives fail
  as they would anyway. The thread is a daemon: it never keeps a process alive.
Bytes: one fp32 all-reduce of the parameters per round ("dp_replicate"), counted when the round
is handed over, so the steady state is exactly bytes / period, as planner/sync.py predicts.
"""

from __future__ import annotations

import datetime
import queue
import threading
import warnings

import torch
import torch.distributed as dist

from meshplan.executor.methods.sync import SyncMethod, flat, tensor_bytes, trainable, unflat

USES_DDP = False


class AsyncAverager:
    """The background averaging thread and its process group (usable without a model)."""

    def __init__(self, ranks: list[int], timeout_s: float):
        self.group = dist.new_group(ranks, backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        self.world = dist.get_world_size(self.group)
        self.timeout_s = timeout_s
        self.todo: queue.Queue = queue.Queue(maxsize=1)
        self.done: queue.Queue = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.in_flight = False
        self.thread = threading.Thread(target=self._run, name="meshplan-async-averaging", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            snapshot = self.todo.get()
            if snapshot is None:
                return
            try:
                mean = snapshot.clone()
                dist.all_reduce(mean, group=self.group)
                self.done.put((snapshot, mean / self.world))
            except BaseException as exc:  # a dead peer, a timeout, the group torn down
                self.error = exc
                self.done.put(None)
                return

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    def submit(self, snapshot: torch.Tensor) -> None:
        """Hand over a snapshot (after the previous round has been collected)."""
        assert not self.in_flight
        self.todo.put(snapshot)
        self.in_flight = True

    def collect(self, wait: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(snapshot, its mean over the ranks) once the round has landed, else None."""
        if not self.in_flight:
            return None
        try:
            got = self.done.get(timeout=self.timeout_s) if wait else self.done.get_nowait()
        except queue.Empty:
            if wait:
                self.in_flight = False  # given up: the thread stays blocked; it is a daemon
            return None
        self.in_flight = False
        return got

    def stop(self) -> None:
        if self.thread.is_alive() and self.error is None and not self.in_flight:
            self.todo.put(None)
            self.thread.join(timeout=self.timeout_s)
        if self.error is not None:
            warnings.warn(
                f"sync=async: the averaging thread stopped on {type(self.error).__name__}: {self.error}", stacklevel=2
            )


class AsyncAveraging(SyncMethod):
    def __init__(self, par, params, counter):
        super().__init__(par, params, counter)
        ranks = [dist.get_global_rank(self.group, r) for r in range(self.world)]
        self.averager = AsyncAverager(ranks, params["timeout_s"])
        self.steps = 0

    def after_step(self) -> None:
        self.steps += 1
        params = trainable(self.par.parameters())
        if self.steps % self.params["period"]:
            self._apply(params, self.averager.collect(wait=False))
            return
        self._apply(params, self.averager.collect(wait=True))  # at most one round in flight
        if not self.averager.alive:  # a peer died: train on alone (its collectives will fail anyway)
            return
        snapshot = flat(params)
        self.counter.add("dp_replicate", "all_reduce", self.world, tensor_bytes(snapshot))
        self.averager.submit(snapshot)

    @torch.no_grad()
    def _apply(self, params, landed) -> None:
        if landed is None:
            return
        snapshot, mean = landed
        unflat(flat(params) + (mean - snapshot), params)
        self.stats.append({"step": self.steps, "moved": float((mean - snapshot).norm())})

    def close(self) -> None:
        try:
            self._apply(trainable(self.par.parameters()), self.averager.collect(wait=True))
        finally:
            self.averager.stop()
            super().close()


def build(par, params, counter):
    return AsyncAveraging(par, params, counter)
