"""One run per run directory, and the processes that belong to a run.

- `RunDirLock`: an exclusive `flock` on out_dir/.meshplan.lock for the whole run. A second
  `meshplan run` into the same directory refuses at once, naming the holder's pid and run id.
  The kernel drops the lock when its holder dies, so a killed launcher never leaves it stale.
- `new_run_id()`: the id every status, result and run.json of a run carries; the launcher
  reads only files with its own id, so it can never report another run's results as its own.
- `run_processes(run_id)`: the pids whose command line carries `--run-id <id>` (torchrun and
  its workers); cleanup kills only these, never a process of another run.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import time
from pathlib import Path

from meshplan.errors import MeshplanError

LOCK_NAME = ".meshplan.lock"


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}"


def check_out_dir(out: Path) -> None:
    """--out-dir must be a directory (or not exist yet) under a writable parent."""
    if out.exists() and not out.is_dir():
        raise MeshplanError(f"--out-dir {out}: is a file, not a directory; give a directory path")
    parent = next((p for p in [out, *out.parents] if p.exists()), Path("."))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise MeshplanError(f"--out-dir {out}: {parent} is not a writable directory; give another --out-dir")


class RunDirLock:
    """Exclusive lock on a run directory, held by the launcher from before its checks until the
    last rank is gone. `created` tells whether acquiring it made the directory."""

    def __init__(self, out: Path, run_id: str):
        self.out, self.run_id, self.fd, self.created = out, run_id, None, False

    def acquire(self) -> "RunDirLock":
        import fcntl

        check_out_dir(self.out)
        self.created = not self.out.exists()
        self.out.mkdir(parents=True, exist_ok=True)
        self.new_file = not (self.out / LOCK_NAME).exists()
        fd = os.open(self.out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise MeshplanError(
                f"--out-dir {self.out}: in use by run {holder.get('run_id', '?')} (pid {holder.get('pid', '?')}); "
                "wait for it to finish, stop it, or use another --out-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps({"pid": os.getpid(), "run_id": self.run_id, "started": time.time()}) + "\n").encode())
        self.fd = fd
        return self

    def release(self, *, remove_dir: bool = False) -> None:
        """Unlock; remove_dir=True deletes the directory again if acquire created it and the run
        wrote nothing else, and the lock file if acquire made it (a refused run leaves nothing)."""
        if self.fd is None:
            return
        if remove_dir and self.new_file:
            (self.out / LOCK_NAME).unlink(missing_ok=True)
        if remove_dir and self.created and not any(self.out.iterdir()):
            self.out.rmdir()
        os.close(self.fd)  # closing the descriptor drops the flock
        self.fd = None


def _read_holder(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}


def run_processes(run_id: str) -> list[int]:
    """Live pids (not zombies) whose command line carries `--run-id <run_id>`."""
    needle = b"\0--run-id\0" + run_id.encode() + b"\0"
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes() + b"\0" and _state(int(entry.name)) != "Z":
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _state(pid: int) -> str:
    """The process state letter from /proc/<pid>/stat (R, S, D, T stopped, Z zombie, ...)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat[stat.rfind(")") + 2:][:1]


def is_stopped(pid: int) -> bool:
    return _state(pid) in ("T", "t")


def kill_run(run_id: str, sig: int = signal.SIGKILL) -> int:
    """Send `sig` to every process of the run; returns how many were signalled."""
    count = 0
    for pid in run_processes(run_id):
        try:
            os.kill(pid, sig)
            count += 1
        except ProcessLookupError:
            continue
    return count


def set_parent_death_signal(sig: int) -> None:
    """Linux: this process gets `sig` when its parent dies (survives exec), so neither torchrun
    nor a rank outlives the process that started it. A no-op elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass
