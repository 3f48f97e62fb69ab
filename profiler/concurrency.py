"""Busy neighbours: N-1 extra processes run the layer being timed, as the other local ranks will.

On a shared host the ranks compete for cores and memory bandwidth, so a layer timed alone is
optimistic (DESIGN.md; `--concurrent N`). Each worker is a process with one thread; it
builds the same model skeleton, and on each command materialises the named layer at the named
microbatch size and runs forward+backward in a loop until the next command. Commands are acked
once the worker is busy, so timing starts only when every neighbour is running.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
import time
from typing import Any

from meshplan.errors import MeshplanError

START_TIMEOUT_S = 120.0
SYNC_PAUSE_S = 1e-3
"""Ranks block on their peers (collectives, pipeline p2p, DDP buckets) between units of work,
and a Linux scheduler runs a task waking from such a wait ahead of CPU-bound load; the busy
neighbours and the timed process (timing.measure_times) pause this long after each pass, so
the host share they measure is that of ranks, not of CPU hogs."""


def _worker(spec: str, overrides: dict | None, device: str, commands, acks) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from meshplan.profiler.loader import load_model
    from meshplan.profiler.runner import forward_backward, make_input, materialise_layer

    torch.set_num_threads(1)
    model = load_model(spec, overrides, "meta")
    work = None
    while True:
        try:
            cmd = commands.get(block=work is None, timeout=None)
        except queue.Empty:
            forward_backward(*work)
            if not device.startswith("cuda"):
                time.sleep(SYNC_PAUSE_S)  # a rank waits on its peers between units of work
            continue
        if cmd[0] == "stop":
            return
        _, fqn, batch, input_spec = cmd
        layer = materialise_layer(model, fqn, device)
        work = (layer, make_input(model, input_spec, batch, device, seed=1))
        forward_backward(*work)
        acks.put(("busy", fqn, batch))


class BusyNeighbours:
    """Context manager owning `count` worker processes; `run(fqn, batch, spec)` retargets them."""

    def __init__(self, count: int, spec: str, overrides: dict | None, device: str):
        self.count, self.spec, self.overrides, self.device = count, spec, overrides, device
        self.procs: list[Any] = []
        self.commands: list[Any] = []

    def __enter__(self) -> "BusyNeighbours":
        ctx = mp.get_context(self._start_method())
        self.acks = ctx.Queue()
        for i in range(self.count):
            cmd = ctx.Queue()
            device = self._device_for(i)
            proc = ctx.Process(target=_worker, args=(self.spec, self.overrides, device, cmd, self.acks),
                               daemon=True, name=f"meshplan-busy-{i}")
            proc.start()
            self.procs.append(proc)
            self.commands.append(cmd)
        return self

    def _start_method(self) -> str:
        """fork where safe (CPU on Linux: starts in milliseconds, like DataLoader workers); spawn for
        CUDA, which cannot be used in a forked child once the parent initialised it."""
        if self.device.startswith("cuda") or "fork" not in mp.get_all_start_methods():
            return "spawn"
        if threading.active_count() > 1:
            return "spawn"  # forking a threaded parent can copy a held lock into the child: it hangs
        return "fork"

    def _device_for(self, i: int) -> str:
        if not self.device.startswith("cuda"):
            return self.device
        return f"cuda:{i + 1}"  # one neighbour per other GPU (timing.py caps the count)

    def run(self, fqn: str, batch: int, input_spec) -> None:
        """Point every worker at (fqn, batch) and return once all of them run it."""
        for cmd in self.commands:
            cmd.put(("run", fqn, batch, input_spec))
        pending, deadline = len(self.commands), time.monotonic() + START_TIMEOUT_S
        while pending:
            try:
                self.acks.get(timeout=0.5)
                pending -= 1
            except queue.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    raise MeshplanError(
                        f"--concurrent {self.count + 1}: busy worker(s) {dead or 'timed out'} did not start "
                        f"{fqn}; a script calling profile_model(concurrent>1) needs an "
                        "`if __name__ == '__main__':` guard (multiprocessing spawn), or use --concurrent 1")

    def __exit__(self, *exc) -> None:
        for cmd in self.commands:
            cmd.put(("stop",))
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for q in [*self.commands, self.acks]:  # end the queues' feeder threads before the next fork
            q.close()
            q.join_thread()
