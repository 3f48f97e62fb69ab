"""Busy neighbours: N-1 extra processes run the layer being timed, as the other local ranks will.

On a shared host the ranks compete for cores and memory bandwidth, so a layer timed alone is
optimistic (docs/design.md; `--concurrent N`). Each worker is a process with one thread; it
builds the same model skeleton, and on each command materialises the named layer at the named
microbatch size and runs forward+backward in a loop until the next command. Commands are acked
once the worker is busy, so timing starts only when every neighbour is running.

Workers are never forked from the calling process. A fork copies its whole state, including
native threads that `threading` does not see (gloo's `gloo_tcp_loop`/`pt_gloo_runloop`, left by
wrapper_timing's one-rank process group) and unreachable C++ objects that own them: when the
child's garbage collector frees such a ProcessGroupGloo, its destructor joins threads that do not
exist in the child and the worker aborts (`std::system_error: Invalid argument`, SIGABRT) or hangs.
The workers come from a fork server instead: a process started by exec that imports only torch
and the worker's modules, and forks each worker from that clean state (spawn on CUDA and where no
fork server exists). Like spawn, it re-imports the caller's `__main__` in each worker, hence the
guard.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError, RunError

START_TIMEOUT_S = 120.0
SYNC_PAUSE_S = 1e-3
"""Ranks block on their peers (collectives, pipeline p2p, DDP buckets) between units of work,
and a Linux scheduler runs a task waking from such a wait ahead of CPU-bound load; the busy
neighbours and the timed process (timing.measure_times) pause this long after each pass, so
the host share they measure is that of ranks, not of CPU hogs."""
FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "torch._refs", "meshplan.profiler.concurrency", "meshplan.models.zoo"]
"""Imported once by the fork server, so that a worker starts in milliseconds, not seconds
(torch._dynamo and torch._refs: what the first nn.init on the meta device imports, ~1 s)."""
LOG_TAIL_LINES = 6


def _worker(spec: str, overrides: dict | None, device: str, commands, acks, log_path: str) -> None:
    _redirect_output(log_path)  # stdout/stderr (C++ aborts included) go where the parent can read them
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from meshplan.models.loader import load_model
    from meshplan.profiler.runner import forward_backward, make_input, materialise_layer

    torch.set_num_threads(1)
    model = load_model(spec, overrides, "meta")
    work: tuple | None = None  # the (layer, input) this worker repeats while no command waits
    while True:
        try:
            cmd = commands.get(block=work is None, timeout=None)
        except queue.Empty:
            assert work is not None  # get() waits while there is no work
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


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)


def start_method(device: str) -> str:
    """Never fork (module doc): forkserver where the platform has it (Linux, macOS); spawn on CUDA,
    whose driver must not be initialised before a fork (the server's imports could query it),
    and where no fork server exists."""
    if device.startswith("cuda") or "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    return "forkserver"


def worker_context(device: str):
    """The multiprocessing context for profiler workers: start_method(device), with the fork
    server preloading torch and the worker modules (FORKSERVER_PRELOAD) so a worker starts fast."""
    ctx = mp.get_context(start_method(device))
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)  # no effect once the server runs
    return ctx


class BusyNeighbours:
    """Context manager owning `count` worker processes; `run(fqn, batch, spec)` retargets them."""

    def __init__(self, count: int, spec: str, overrides: dict | None, device: str):
        self.count, self.spec, self.overrides, self.device = count, spec, overrides, device
        self.procs: list[Any] = []
        self.commands: list[Any] = []
        self.logs: list[Path] = []

    def __enter__(self) -> BusyNeighbours:
        _refuse_while_bootstrapping(self.count + 1)
        ctx = worker_context(self.device)
        self._log_dir = tempfile.TemporaryDirectory(prefix="meshplan-busy-")
        self.acks = ctx.Queue()
        try:
            for i in range(self.count):
                self._start(ctx, i)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self, ctx, i: int) -> None:
        cmd = ctx.Queue()
        log = Path(self._log_dir.name) / f"busy-{i}.log"
        proc = ctx.Process(
            target=_worker,
            args=(self.spec, self.overrides, self._device_for(i), cmd, self.acks, str(log)),
            daemon=True,
            name=f"meshplan-busy-{i}",
        )
        self.commands.append(cmd)
        self.logs.append(log)
        proc.start()
        self.procs.append(proc)

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
                self._check_alive(fqn)
                if time.monotonic() > deadline:
                    raise RunError(
                        f"--concurrent {self.count + 1}: {pending} busy worker(s) did not start {fqn} "
                        f"within {START_TIMEOUT_S:.0f} s (load average {os.getloadavg()[0]:.1f}); "
                        f"{self._tails()}; retry on a quieter host or use --concurrent 1"
                    ) from None

    def _check_alive(self, fqn: str) -> None:
        """Raise with the exit code and output of the first worker that died."""
        for proc, log in zip(self.procs, self.logs):
            if proc.is_alive():
                continue
            if proc.exitcode == 1 and not log.exists():  # an exception before _worker: the caller's __main__
                raise MeshplanError(
                    f"--concurrent {self.count + 1}: busy worker {proc.name} exited ({_exit_text(proc.exitcode)}) "
                    "before it started (its traceback is on stderr above); a script calling "
                    "profile_model(concurrent>1) needs an `if __name__ == '__main__':` guard "
                    f"(multiprocessing {start_method(self.device)}), or use --concurrent 1"
                )
            raise RunError(
                f"--concurrent {self.count + 1}: busy worker {proc.name} died "
                f"({_exit_text(proc.exitcode)}) while starting {fqn}; its output: {_tail(log)}"
            )

    def _tails(self) -> str:
        return "worker output: " + " | ".join(f"{p.name}: {_tail(log)}" for p, log in zip(self.procs, self.logs))

    def __exit__(self, *exc) -> None:
        for cmd in self.commands:
            cmd.put(("stop",))
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for q in [*self.commands, self.acks]:  # end the queues' feeder threads
            q.close()
            q.join_thread()
        self._log_dir.cleanup()


def _refuse_while_bootstrapping(concurrent: int) -> None:
    """In a worker importing an unguarded `__main__`, fail with the fix instead of multiprocessing's
    bootstrapping RuntimeError (the parent then reports the worker's early exit)."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise MeshplanError(
            f"--concurrent {concurrent}: this script runs profile_model(concurrent>1) when "
            "imported; put that call under an `if __name__ == '__main__':` guard "
            "(multiprocessing re-imports the main module in each busy worker)"
        )


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _tail(log: Path) -> str:
    """The worker's last output lines on one line, or a note that it wrote nothing."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no output)"
    return " / ".join(lines[-LOG_TAIL_LINES:]) or "(no output)"
