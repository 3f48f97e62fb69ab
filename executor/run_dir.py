"""One run per run directory, and the processes that belong to a run.

- `RunDirLock`: an exclusive `flock` on out_dir/.meshplan.lock for the whole run. A second
  `meshplan run` into the same directory refuses at once, naming the holder's pid and run id.
  The kernel drops the lock when its holder dies, so a killed launcher never leaves it stale.
  A node of a multi-node job holds .meshplan.lock shared and its own .meshplan.node<R>.lock
  exclusively: the nodes of one job may share a directory (one shared filesystem), a second
  launch of the same node rank or a single-node run into it refuses.
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

from meshplan.errors import MeshplanError, os_error_text

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

    def __init__(self, out: Path, run_id: str, node_rank: int | None = None):
        self.out, self.run_id, self.created = out, run_id, False
        self.fd: int | None = None
        self.node_rank = node_rank  # one node of a multi-node job
        self.node_fd: int | None = None

    def acquire(self) -> RunDirLock:
        check_out_dir(self.out)
        self.created = not self.out.exists()
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MeshplanError(
                f"--out-dir {self.out}: cannot create it ({os_error_text(exc)}); give another --out-dir"
            ) from None
        self.new_file = not (self.out / LOCK_NAME).exists()
        if self.node_rank is None:
            self.fd = self._lock(LOCK_NAME, exclusive=True)
            return self
        self.fd = self._lock(LOCK_NAME, exclusive=False)
        self.node_new_file = not (self.out / node_lock_name(self.node_rank)).exists()
        self.node_fd = self._lock(node_lock_name(self.node_rank), exclusive=True)
        return self

    def _lock(self, name: str, *, exclusive: bool) -> int:
        """flock out/name (shared: written by nobody); exclusive: write the holder into it."""
        import fcntl

        try:
            fd = os.open(self.out / name, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
            kind = "is a directory" if (self.out / name).is_dir() else f"cannot be opened ({os_error_text(exc)})"
            raise MeshplanError(
                f"--out-dir {self.out}: its lock file {name} {kind}; remove it (no run holds it) or use another --out-dir"
            ) from None
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            holders = _node_holders(self.out) if name == LOCK_NAME and exclusive else []
            holder = holders[0] if holders else _read_holder(fd)
            os.close(fd)
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
            raise MeshplanError(
                f"--out-dir {self.out}: in use by run {holder.get('run_id', '?')} (pid {holder.get('pid', '?')}"
                + (f", node {holder['node_rank']}" if "node_rank" in holder else "")
                + "); wait for it to finish, stop it, or use another --out-dir"
            ) from None
        if exclusive:
            holder = {"pid": os.getpid(), "run_id": self.run_id, "started": time.time()}
            if self.node_rank is not None:
                holder["node_rank"] = self.node_rank
            try:
                os.ftruncate(fd, 0)
                os.write(fd, (json.dumps(holder) + "\n").encode())
            except OSError as exc:  # a full disk at start: nothing of the run can be written
                os.close(fd)
                if self.fd is not None:
                    os.close(self.fd)
                    self.fd = None
                raise MeshplanError(
                    f"--out-dir {self.out}: cannot write {name}: {os_error_text(exc)}; free space or give another --out-dir"
                ) from None
        return fd

    def release(self, *, remove_dir: bool = False) -> None:
        """Unlock; remove_dir=True deletes the directory again if acquire created it and the run
        wrote nothing else, and the lock file if acquire made it (a refused run leaves nothing)."""
        if self.fd is None:
            return
        if self.node_fd is not None:
            if remove_dir and self.node_new_file and self.node_rank is not None:
                (self.out / node_lock_name(self.node_rank)).unlink(missing_ok=True)
            os.close(self.node_fd)
            self.node_fd = None
        if remove_dir and self.new_file:
            (self.out / LOCK_NAME).unlink(missing_ok=True)
        if remove_dir and self.created and not any(self.out.iterdir()):
            self.out.rmdir()
        os.close(self.fd)  # closing the descriptor drops the flock
        self.fd = None


def node_lock_name(node_rank: int) -> str:
    return f".meshplan.node{node_rank}.lock"


def _node_holders(out: Path) -> list[dict]:
    """Holders of the node locks in `out` that are held now (a free one is tried and let go)."""
    import fcntl

    holders = []
    for path in sorted(out.glob(".meshplan.node*.lock")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holders.append(_read_holder(fd))
        finally:
            os.close(fd)  # also lets go of a lock this test took
    return holders


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
    return stat[stat.rfind(")") + 2 :][:1]


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
