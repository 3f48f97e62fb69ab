"""Launch a plan with torchrun on local devices and turn the ranks' reports into a RunResult.

`launch_command` is the exact torchrun line (also for `--print-launch` / Slurm). `run_plan`
checks the plan, starts torchrun in its own process group and watches the ranks' status files:
- success = every local rank wrote its result file; torchrun's exit code is then only noted
  (gloo processes sometimes abort at interpreter shutdown after all work is done);
- a rank that exits or raises: RunError naming it and the step it was at;
- no status file changed for `timeout_s` (a hang): the job is killed, RunError naming the
  rank(s) that fell behind. Checkpoints are only declared complete after every rank saved.
On several nodes each node's launcher watches its own ranks (executor/multinode.py).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from meshplan.errors import MeshplanError, RunError, RunInterrupted, disk_full, os_error_text
from meshplan.executor import multinode, run_dir, run_history
from meshplan.executor.check import check_plan, check_run_options
from meshplan.executor.checkpoint import checkpoint_root, latest_step, saved_plan_path
from meshplan.executor.checkpoint_manifest import resume_point
from meshplan.executor.output_filter import WarningDedupe
from meshplan.executor.run_history import job_step_times, median_step_s
from meshplan.executor.run_progress import RunJsonWriter, steps_path
from meshplan.executor.worker import variant_dir
from meshplan.plan import Plan
from meshplan.run_result import RunResult
from meshplan.schema import check_output as schema_check_output
from meshplan.schema import content_hash, load, save

LAUNCH_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
"""What the launcher adds to the environment of torchrun (`run --print-launch --json` says it)."""

STARTUP_GRACE_S = 60.0
"""Seconds the launcher waits for the first rank report before declaring a hang."""


@dataclass(kw_only=True)
class LaunchOptions:
    steps: int = 5
    data: str | None = None
    out_dir: str = "runs/latest"
    checkpoint_every: int = 0
    resume: bool = False
    overwrite: bool = False
    """Start afresh even if out_dir holds an earlier run's resumable checkpoint (deleting it)."""
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    timeout_s: float = 300
    quiet: bool = False
    optimizer: str = "adamw"
    lr: float = 3e-4
    grad_clip: float = 1.0
    seed: int = 0
    env: dict | None = None


def launch_command(
    plan: Plan,
    opts: LaunchOptions | None = None,
    *,
    plan_path: str = "plan.json",
    extra_plans: list[str] | tuple[str, ...] = (),
    run_id: str | None = None,
    **changes,
) -> list[str]:
    """The torchrun command that runs `plan` (world_size / nnodes processes on this node) with
    `opts` (keyword `changes` replace its fields: launch_command(plan, steps=7))."""
    opts = dataclasses.replace(opts or LaunchOptions(), **changes)
    nnodes, rdzv_endpoint = opts.nnodes, opts.rdzv_endpoint
    if nnodes < 1 or plan.world_size % nnodes:
        raise MeshplanError(f"--nnodes {nnodes}: must divide the plan's world size {plan.world_size}")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={plan.world_size // nnodes}"]
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        if not rdzv_endpoint:
            raise MeshplanError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the node-rank-0 host)")
        # static rendezvous: torchrun's c10d backend ignores --node-rank and numbers nodes by
        # arrival, so a node could not know which global ranks are its own (their status files)
        cmd += [
            f"--nnodes={nnodes}",
            f"--node-rank={opts.node_rank}",
            "--rdzv-backend=static",
            f"--rdzv-endpoint={rdzv_endpoint}",
            "--rdzv-id=meshplan",
            f"--rdzv-conf=timeout={max(1, int(opts.timeout_s))}",
            "--max-restarts=0",
        ]
    cmd += ["-m", "meshplan.executor.worker", "--plan", plan_path]
    for extra in extra_plans:
        cmd += ["--plan", extra]
    if run_id:
        cmd += ["--run-id", run_id]  # how cleanup finds this run's processes and files
    cmd += [
        "--out-dir",
        opts.out_dir,
        "--steps",
        str(opts.steps),
        "--optimizer",
        opts.optimizer,
        "--lr",
        repr(opts.lr),
        "--grad-clip",
        repr(opts.grad_clip),
        "--seed",
        str(opts.seed),
        "--timeout-s",
        repr(opts.timeout_s),
    ]
    if opts.data:
        cmd += ["--data", opts.data]
    if opts.checkpoint_every:
        cmd += ["--checkpoint-every", str(opts.checkpoint_every)]
    if opts.resume:
        cmd.append("--resume")
    return cmd


def run_plan(plan: Plan, opts: LaunchOptions | None = None, **changes) -> RunResult:
    """Run `plan` with torchrun; writes out_dir/run.json and returns the RunResult. Keyword
    `changes` replace fields of `opts` (run_plan(plan, steps=3, out_dir=...))."""
    (result,) = run_plans([plan], dataclasses.replace(opts or LaunchOptions(), **changes), run_json=True)
    return result


def run_plans(plans: list[Plan], opts: LaunchOptions, *, run_json: bool = False) -> list[RunResult]:
    """Run several plans of one world size in ONE torchrun launch (one RunResult each), holding
    the run directory's lock throughout; run_json=True also writes out_dir/run.json (one plan)."""
    sizes = {p.world_size for p in plans}
    if len(sizes) != 1:
        raise MeshplanError(f"plans of different world sizes {sorted(sizes)} cannot share a launch")
    for plan in plans:
        check_plan(plan, nnodes=opts.nnodes)
        check_run_options(plan, opts.optimizer, opts.checkpoint_every)
    if opts.steps < 1:
        raise MeshplanError(f"--steps {opts.steps}: must be >= 1")
    if opts.data:  # what the ranks would find as a traceback each, found once before launch
        from meshplan.executor.data import check_dataset

        for plan in plans:
            check_dataset(opts.data, plan)
    if opts.nnodes > 1 and opts.rdzv_endpoint:
        multinode_host_check(opts.rdzv_endpoint)
    _check_offload_dir(plans, opts)
    out = Path(opts.out_dir)
    run_dir.check_out_dir(out)
    run_id = run_dir.new_run_id()
    with _interrupt_signals():
        node = opts.node_rank if opts.nnodes > 1 else None  # the nodes of one job may share out
        lock, launched = run_dir.RunDirLock(out, run_id, node).acquire(), False
        run_path = out / multinode.node_file("run.json", opts.node_rank, opts.nnodes)
        try:
            finished = run_history.finished_run(run_path, opts) if run_json else None
            if finished is not None:  # --resume of a run already at --steps: nothing to run
                return [finished]
            _check_checkpoints(out, len(plans), opts, plans)
            earlier = run_history.earlier_run(run_path) if run_json and opts.resume else None
            launched = True
            results = _launch(plans, opts, out, run_id, run_path if run_json else None, earlier)
            for result in results if opts.nnodes > 1 else []:
                nproc = plans[0].world_size // opts.nnodes
                result.notes.append(
                    f"node {opts.node_rank} of {opts.nnodes}: peak memory and bytes per rank are of "
                    f"ranks {opts.node_rank * nproc}..{(opts.node_rank + 1) * nproc - 1}"
                )
            if run_json:
                if earlier is not None:
                    run_history.continue_history(results[0], earlier)
                save(results[0], run_path)
            for result in results:
                diverged = run_history.divergence(result)
                if diverged:
                    raise RunError(f"{diverged}; {'run.json' if run_json else 'the result'} keeps every step's loss")
            return results
        finally:
            if launched:
                _remove_leftovers(out, plans, opts)
            lock.release(remove_dir=not launched)


def _launch(
    plans: list[Plan],
    opts: LaunchOptions,
    out: Path,
    run_id: str,
    run_path: Path | None = None,
    earlier: RunResult | None = None,
) -> list[RunResult]:
    """Start torchrun on this node's ranks and collect their results; with `run_path`, run.json
    is rewritten there after every step the ranks finish (executor/run_progress.py)."""
    paths = _write_plans(plans, out)
    nproc = plans[0].world_size // opts.nnodes
    ranks = list(range(opts.node_rank * nproc, (opts.node_rank + 1) * nproc))
    _clear_reports(out, len(plans), ranks)
    cmd = launch_command(plans[0], opts, plan_path=paths[0], extra_plans=paths[1:], run_id=run_id, out_dir=str(out))
    writer = None
    if run_path is not None:
        vdir = variant_dir(str(out), 0, len(plans))
        writer = RunJsonWriter(run_path, plans[0], vdir, ranks, run_id, earlier=earlier, device=device_kind())
    try:
        rc, output = _supervise(cmd, out, ranks, run_id, opts, writer.poll if writer else None)
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM or SIGHUP through _interrupt_signals
        signum = getattr(exc, "signum", signal.SIGINT)
        raise RunInterrupted(signum, _interrupted_message(out, len(plans), len(ranks), signum)) from None
    finally:
        if writer is not None:  # the last steps a failed or stopped run did
            writer.poll()
    return [
        _collect(plan, variant_dir(str(out), i, len(plans)), ranks, rc, opts, output, len(plans), run_id)
        for i, plan in enumerate(plans)
    ]


class _interrupt_signals:
    """SIGINT, SIGTERM and SIGHUP raise RunInterrupted, so every way of stopping the launcher stops
    the ranks too; a second signal while stopping (Ctrl-C pressed twice) is ignored rather than
    cutting the stop short and leaving ranks behind. A SIGINT the launcher was started ignoring (a
    background job of a non-interactive shell) stays ignored. Only the main thread can install
    handlers; elsewhere this does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __enter__(self):
        self.saved, self.fired = {}, False
        if threading.current_thread() is threading.main_thread():
            self.saved = {
                sig: signal.signal(sig, self._handle)
                for sig in self.SIGNALS
                if not (sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN)
            }
        return self

    def _handle(self, signum, frame):
        if not self.fired:
            self.fired = True
            raise RunInterrupted(signum, "")

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        return False


def _interrupted_message(out: Path, count: int, nranks: int, signum: int) -> str:
    """One line: which signal, that every rank is gone, and the newest complete checkpoint."""
    steps = [latest_step(variant_dir(str(out), i, count)) for i in range(count)]
    where = checkpoint_root(variant_dir(str(out), 0, count))
    kept = (
        f"the last complete checkpoint is step {steps[0]} in {where} (continue with --resume)"
        if steps[0]
        else "no checkpoint was completed"
    )
    return f"interrupted by {signal.Signals(signum).name}: all {nranks} ranks stopped; {kept}"


def _check_reshard(saved: Plan, plan: Plan, vdir: Path) -> None:
    """A checkpoint loads into another plan of the same model, except ZeRO-1's per-rank state."""
    if saved.model_name != plan.model_name or saved.model_config != plan.model_config:
        raise MeshplanError(
            f"--resume: the checkpoint in {checkpoint_root(vdir)} is of {saved.model_name} "
            f"{saved.model_config}, not {plan.model_name} {plan.model_config}; use another --out-dir"
        )
    if content_hash(saved) != content_hash(plan) and 1 in (saved.zero_stage, plan.zero_stage):
        raise MeshplanError(
            f"--resume: ZeRO-1 optimizer state in {checkpoint_root(vdir)} resumes only into the "
            "plan that wrote it; resume with that plan or start a new run"
        )


def _check_checkpoints(out: Path, count: int, opts: LaunchOptions, plans: list[Plan]) -> None:
    """Before any rank starts: --resume needs a complete checkpoint (manifest sizes and hashes
    checked) short of --steps, a damaged `latest` falls back to the newest complete one with a
    warning; a fresh run never deletes an earlier run's resumable checkpoint without --overwrite."""
    for i in range(count):
        vdir = variant_dir(str(out), i, count)
        root = checkpoint_root(vdir)
        if root.exists() and not root.is_dir():
            raise MeshplanError(
                f"--out-dir {out}: {root} is not the checkpoint directory (a file or a link); "
                "move it away or use another --out-dir"
            )
        done, warning = resume_point(vdir)
        if not opts.resume:
            _fresh_start(out, root, done, warning, opts.overwrite)
            continue
        if done == 0:
            raise MeshplanError(
                f"--resume: no complete checkpoint under {checkpoint_root(vdir)}"
                + (f" ({warning})" if warning else "")
                + "; run without --resume (and with --checkpoint-every K) first"
            )
        if done >= opts.steps:
            raise MeshplanError(
                f"--resume: the checkpoint in {checkpoint_root(vdir)} is at step {done}, "
                f"not before --steps {opts.steps}; raise --steps"
            )
        if saved_plan_path(vdir).exists():
            _check_reshard(load(Plan, saved_plan_path(vdir)), plans[i], vdir)
        if warning:
            print(f"meshplan run: warning: {warning}", file=sys.stderr, flush=True)


def multinode_host_check(endpoint: str) -> None:
    """--rdzv-endpoint's host resolves (else torchrun prints pages of c10d frames on every node)."""
    import socket

    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise MeshplanError(f"--rdzv-endpoint {endpoint}: expected HOST:PORT, e.g. node0:29500")
    try:
        socket.getaddrinfo(host.strip("[]"), int(port))
    except (OSError, UnicodeError) as exc:
        raise MeshplanError(
            f"--rdzv-endpoint {endpoint}: host {host!r} does not resolve ({exc}); give node 0's hostname or address"
        ) from None


def _check_offload_dir(plans: list[Plan], opts: LaunchOptions) -> None:
    """offload=nvme's folder is writable (a probe file), found before launch, not in every rank."""
    if not any(p.dp_methods.offload.name == "nvme" for p in plans):
        return
    where = (opts.env or {}).get("MESHPLAN_OFFLOAD_DIR") or os.environ.get("MESHPLAN_OFFLOAD_DIR")
    try:
        schema_check_output(where or str(Path(opts.out_dir) / "offload"), folder=True)
    except MeshplanError as exc:
        raise MeshplanError(f"--offload-dir: {exc}; give --offload-dir a writable folder") from None


def _fresh_start(out: Path, root: Path, done: int, warning: str | None, overwrite: bool) -> None:
    """A fresh run deletes an earlier run's checkpoints only with --overwrite, and says so."""
    held = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    if not held:
        return
    if not overwrite:
        what = (
            f"a resumable checkpoint at step {done}"
            if done
            else f"checkpoints none of which is complete ({warning or ', '.join(held[:3])})"
        )
        raise MeshplanError(
            f"--out-dir {out}: holds {what} ({root}); "
            + ("continue it with --resume, " if done else "")
            + "start afresh with --overwrite (deletes them), or use another --out-dir"
        )
    for child in root.iterdir():  # the entries, so a checkpoints/ link to another disk stays a link
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    print(f"meshplan run: --overwrite: deleted {root} ({', '.join(held)})", file=sys.stderr, flush=True)


def _remove_leftovers(out: Path, plans: list[Plan], opts: LaunchOptions) -> None:
    """However the run ended (a rank SIGKILLed mid-write, a full disk): no half-written status
    file of this node's ranks stays, nor their offload=nvme state files (a killed rank cannot
    remove its own; executor/methods/nvme_store.py)."""
    nproc = plans[0].world_size // opts.nnodes
    ranks = range(opts.node_rank * nproc, (opts.node_rank + 1) * nproc)
    env_dir = (opts.env or {}).get("MESHPLAN_OFFLOAD_DIR") or os.environ.get("MESHPLAN_OFFLOAD_DIR")
    for r in ranks:
        (out / "ranks" / f"rank{r}.status.tmp").unlink(missing_ok=True)
        for i in range(len(plans)):
            base = Path(env_dir) if env_dir else variant_dir(str(out), i, len(plans)) / "offload"
            shutil.rmtree(base / f"rank{r}", ignore_errors=True)
            if not env_dir and base.is_dir() and not any(base.iterdir()):
                base.rmdir()


def _write_plans(plans: list[Plan], out: Path) -> list[str]:
    if len(plans) == 1:
        save(plans[0], out / "plan.json")
        return [str(out / "plan.json")]
    paths = []
    for i, plan in enumerate(plans):
        save(plan, out / f"variant{i}" / "plan.json")
        paths.append(str(out / f"variant{i}" / "plan.json"))
    return paths


def _clear_reports(out: Path, count: int, ranks: list[int]) -> None:
    """Earlier reports of this node's ranks (another node's, in a shared out_dir, stay)."""
    for r in ranks:
        (out / "ranks" / f"rank{r}.status.json").unlink(missing_ok=True)
        for i in range(count):
            (variant_dir(str(out), i, count) / f"rank{r}.result.json").unlink(missing_ok=True)
            steps_path(variant_dir(str(out), i, count), r).unlink(missing_ok=True)


def _env(opts: LaunchOptions) -> dict:
    env = dict(os.environ, **LAUNCH_ENV)
    env.update(opts.env or {})
    return env


class _Output:
    """Copies torchrun's output to out_dir/launch.log (and the terminal unless quiet, with each
    framework warning once rather than once per rank: executor/output_filter.py), keeping
    the tail to find torchrun's "Root Cause" rank when a process dies."""

    def __init__(self, proc: subprocess.Popen, out: Path, quiet: bool, name: str = "launch.log"):
        self.tail: collections.deque[str] = collections.deque(maxlen=400)
        self.path = out / name
        self.log_error: OSError | None = None
        """Why launch.log could not be written (a full disk); the pump keeps draining torchrun."""
        try:
            self.log: TextIO | None = open(self.path, "w")
        except OSError as exc:
            self.log, self.log_error = None, exc
        self.quiet = quiet
        self.thread = threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True)
        self.thread.start()

    def _pump(self, stream) -> None:
        dedupe = WarningDedupe()  # the terminal shows each framework warning once, not per rank
        for line in stream:
            self.tail.append(line)
            self._write_log(line)
            if not self.quiet and dedupe.keep(line):
                try:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                except (OSError, ValueError):  # the terminal went away: launch.log still has it
                    self.quiet = True
        self._write_log(None)

    def _write_log(self, line: str | None) -> None:
        """Append a line (None: close); the first OSError stops the log, never the pump."""
        if self.log is None:
            return
        try:
            if line is None:
                self.log.close()
            else:
                self.log.write(line)
        except OSError as exc:
            self.log_error = exc
            with contextlib.suppress(OSError):
                self.log.close()
            self.log = None

    def where(self) -> str:
        """How to point a person at torchrun's output."""
        if self.log_error is None:
            return f"see {self.path}"
        return f"{self.path} could not be written ({os_error_text(self.log_error)})"

    def root_cause(self) -> tuple[int, str] | None:
        """(rank, exit code) of torchrun's first observed failure, if it printed one."""
        text = "".join(self.tail)
        block = text[text.rfind("Root Cause") :] if "Root Cause" in text else ""
        rank = re.search(r"rank\s*:\s*(\d+)", block)
        code = re.search(r"exitcode\s*:\s*(-?\d+)", block)
        return (int(rank.group(1)), code.group(1) if code else "?") if rank else None

    def failures(self) -> list[tuple[int, str]]:
        """(rank, exit code) of every failed rank in torchrun's last error summary ("Failures:"
        and "Root Cause"), in the order printed."""
        text = "".join(self.tail)
        start = max(text.rfind("Failures:"), 0) if "Failures:" in text else text.rfind("Root Cause")
        pairs = re.findall(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", text[max(start, 0) :], re.S)
        return [(int(r), c) for r, c in pairs] if start >= 0 else []


def _supervise(
    cmd: list[str], out: Path, ranks: list[int], run_id: str, opts: LaunchOptions, on_poll=None
) -> tuple[int, _Output]:
    """Run torchrun; kill it when no rank reported progress for timeout_s. Returns its exit code.
    However this ends (success, failure, hang, signal), no process of the run outlives it.
    `on_poll()` is called at every look at the ranks (run.json as the run goes)."""
    proc = subprocess.Popen(
        cmd,
        env=_env(opts),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: run_dir.set_parent_death_signal(signal.SIGTERM),
    )
    output = _Output(proc, out, opts.quiet, multinode.node_file("launch.log", opts.node_rank, opts.nnodes))
    last_change, last_seen = time.monotonic(), None
    try:
        while proc.poll() is None:
            time.sleep(0.2)
            if on_poll is not None:
                on_poll()
            seen = _status_mtimes(out, ranks, run_id)
            if seen != last_seen:
                last_change, last_seen = time.monotonic(), seen
            # before the first report, allow for process start-up (imports, rendezvous) on a busy host
            # (on several nodes torchrun's rendezvous waits up to timeout_s for the others first)
            limit_s = (
                opts.timeout_s if seen else max(opts.timeout_s, STARTUP_GRACE_S) + (opts.nnodes > 1) * opts.timeout_s
            )
            if time.monotonic() - last_change > limit_s:
                message = _hang_message(out, ranks, opts.timeout_s, run_id)  # before the kill ends the stops
                if opts.nnodes > 1:
                    message = (
                        multinode.hang_message(
                            read_statuses(out, ranks, run_id),
                            opts.node_rank,
                            opts.nnodes,
                            opts.rdzv_endpoint or "",  # checked present when nnodes > 1
                            opts.timeout_s,
                        )
                        or message
                    )
                _stop(proc, run_id, output)
                raise RunError(message)
        output.thread.join(timeout=10)
        return proc.returncode, output
    finally:
        _stop(proc, run_id, output)


def _stop(proc: subprocess.Popen, run_id: str, output: _Output) -> None:
    """End torchrun and every rank of this run (only this run's: they carry its --run-id), in
    bounded time: SIGTERM to torchrun (which stops its ranks), then SIGKILL to whatever of the
    run is left, such as a stopped rank or one stuck in a collective at shutdown."""
    if proc.poll() is None:
        output.quiet = True  # torchrun's traceback on SIGTERM goes to launch.log only
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    for _ in range(20):
        if not run_dir.kill_run(run_id, signal.SIGKILL):
            break
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _status_mtimes(out: Path, ranks: list[int], run_id: str) -> tuple:
    """The heartbeat: this run's status files and their modification times."""
    files = [out / "ranks" / f"rank{r}.status.json" for r in ranks]
    return tuple((f.name, f.stat().st_mtime_ns) for f in files if f.exists() and _read_json(f).get("run_id") == run_id)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def read_statuses(out: Path, ranks: list[int], run_id: str | None = None) -> dict[int, dict]:
    """Each rank's status; a file another run wrote counts as "not started"."""
    statuses = {}
    for r in ranks:
        status = _read_json(out / "ranks" / f"rank{r}.status.json")
        if not status or (run_id is not None and status.get("run_id") != run_id):
            status = {"rank": r, "state": "not started", "step": -1, "variant": 0, "time": 0}
        statuses[r] = status
    return statuses


def _hang_message(out: Path, ranks: list[int], timeout_s: float, run_id: str | None = None) -> str:
    st = read_statuses(out, ranks, run_id)
    stopped = [s for s in st.values() if s.get("pid") and run_dir.is_stopped(s["pid"])]
    if stopped:
        s = stopped[0]
        return (
            f"rank {s['rank']} is stopped (SIGSTOP/SIGTSTP, pid {s['pid']}) at step {s.get('step', -1)}: "
            f"no progress from any rank for {timeout_s:g} s; job killed"
        )
    behind = min(st.values(), key=lambda s: (s.get("variant", 0), s.get("step", -1), s.get("time", 0)))
    ahead = max(s.get("step", -1) for s in st.values())
    return (
        f"rank {behind['rank']} hung: no progress from any rank for {timeout_s:g} s; rank {behind['rank']} "
        f"last reported step {behind.get('step', -1)} while others reached step {ahead}; job killed"
    )


_SECONDARY = re.compile(r"closed by peer|[Tt]imed out|Connection reset|Broken pipe|aborted|watchdog")


def _failure_message(
    out: Path, ranks: list[int], rc: int, output: _Output, count: int = 1, run_id: str | None = None
) -> str:
    """Name the rank that failed first: its own exception, else the process torchrun saw die,
    else the rank that fell behind (peers only report broken or timed-out collectives)."""
    st = read_statuses(out, ranks, run_id)
    errors = sorted((s for s in st.values() if s.get("state") == "error"), key=lambda s: s.get("time", 0))
    primary = [s for s in errors if not _SECONDARY.search(s.get("error", ""))]

    def where(s: dict) -> str:
        return f" of plan variant {s.get('variant', 0)}" if count > 1 else ""

    if primary:
        s = primary[0]
        return f"rank {s['rank']} failed at step {s.get('step', -1)}{where(s)}: {s.get('error', '')}"
    cause = output.root_cause()
    if cause is None or cause[0] not in st or st[cause[0]].get("state") == "error":
        # torchrun's first observed failure may be a peer that died of the broken connection:
        # the rank that died without reporting an error, by a signal first, is the cause
        silent = [f for f in output.failures() if f[0] in st and st[f[0]].get("state") != "error"]
        silent.sort(key=lambda f: not f[1].startswith("-"))
        cause = silent[0] if silent else cause
    if cause is not None and cause[0] in st and st[cause[0]].get("state") != "error":
        s = st[cause[0]]
        return (
            f"rank {s['rank']} died (exit code {cause[1]}) after reporting step {s.get('step', -1)}{where(s)}; "
            f"torchrun stopped the other ranks; {output.where()}"
        )
    if errors:
        behind = min(st.values(), key=lambda s: (s.get("variant", 0), s.get("step", -1), s.get("time", 0)))
        return (
            f"rank {behind['rank']} stopped responding at step {behind.get('step', -1)}{where(behind)}; "
            f"its peers failed waiting for it ({errors[0].get('error', '')[:200]})"
        )
    return f"torchrun exited with {rc} before every rank reported; {output.where()}"


def _collect(
    plan: Plan,
    vdir: Path,
    ranks: list[int],
    rc: int,
    opts: LaunchOptions,
    output: _Output,
    count: int = 1,
    run_id: str = "",
) -> RunResult:
    """This run's result file of every rank (one another run wrote does not count)."""
    results = {}
    for r in ranks:
        result = _read_json(vdir / f"rank{r}.result.json")
        if result and result.get("run_id", "") == run_id:
            results[r] = result
    if len(results) != len(ranks):
        missing = [r for r in ranks if r not in results]
        message = _node_failure_message(ranks, opts, output, run_id) if opts.nnodes > 1 else None
        message = message or (
            _failure_message(Path(opts.out_dir), ranks, rc, output, count, run_id)
            + f" (no result from ranks {missing})"
        )
        raise RunError(_disk_full(Path(opts.out_dir), output, message) or message)
    return merge_results(plan, [results[r] for r in ranks], rc, opts, run_id)


_NO_SPACE = re.compile(r"No space left on device|Errno 28\b|Disk quota exceeded|the disk is full")


def _disk_full(out: Path, output: _Output, failure: str) -> str | None:
    """A failure that a full disk caused, said first: its last line must not be a rank's
    traceback pointing to a launch.log that could not be written."""
    free = shutil.disk_usage(out).free if out.is_dir() else None
    log_full = output.log_error is not None and disk_full(output.log_error)
    if not (log_full or _NO_SPACE.search(failure) or _NO_SPACE.search("".join(output.tail)) or (free or 2**16) < 2**16):
        return None
    return (
        f"the disk is full ({(free or 0) / 2**20:.1f} MiB free under {out}): {failure}; "
        "free space there or give --out-dir (and --offload-dir) on another disk"
    )


def _node_failure_message(ranks: list[int], opts: LaunchOptions, output: _Output, run_id: str) -> str | None:
    """Several nodes: the rendezvous failed, or this node's ranks only lost their peers elsewhere."""
    st = read_statuses(Path(opts.out_dir), ranks, run_id)
    if all(s.get("state") == "not started" for s in st.values()):
        return multinode.rendezvous_message(
            "".join(output.tail), opts.node_rank, opts.nnodes, opts.rdzv_endpoint or "", opts.timeout_s
        )
    return multinode.peer_failure_message(st, opts.node_rank, _SECONDARY.search)


def device_kind() -> str:
    """What the ranks ran on: "cuda" where this host has a GPU (worker._device), else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def merge_results(plan: Plan, per_rank: list[dict], rc: int, opts: LaunchOptions, run_id: str = "") -> RunResult:
    """RunResult from the ranks' reports: losses of the first rank, the job's time per step."""
    first = per_rank[0]
    notes = list(first.get("method_notes", []))  # rank 0's (the compression codecs' decisions agree)
    losses, diverged_at = run_history.finite_losses(first["losses"])
    if diverged_at is not None:
        notes.append(f"the loss diverged at step {first['start_step'] + diverged_at}: non-finite losses are null")
    elif any(r["losses"] != first["losses"] for r in per_rank):
        notes.append(
            "losses differ between ranks (max abs diff "
            f"{max(abs(a - b) for r in per_rank for a, b in zip(r['losses'], first['losses'])):.3g})"
        )
    if rc != 0:
        notes.append(f"torchrun exited with {rc} after every rank reported its result (shutdown crash ignored)")
    device = device_kind()
    if plan.precision == "bf16" and device == "cpu":
        notes.append("plan.precision bf16: ran in fp32 (bf16 autocast is used on GPU only)")
    step_times = job_step_times([r["step_times_s"] for r in per_rank])
    median_s = median_step_s(step_times, device)
    return RunResult(
        run_id=run_id,
        plan_hash=content_hash(plan),
        world_size=plan.world_size,
        steps=opts.steps,
        losses=losses,
        step_time_s=median_s,
        step_times_s=step_times,
        tokens_per_s=plan.global_batch_size * plan.seq_len / median_s if median_s > 0 else 0.0,
        peak_memory_bytes=max(r["peak_memory_bytes"] for r in per_rank),
        peak_memory_per_rank_bytes=[r["peak_memory_bytes"] for r in per_rank],
        device=device,
        backend="nccl" if device == "cuda" else "gloo",
        torch_version=torch.__version__,
        resumed_from_step=first["start_step"],
        notes=notes,
        **comm_bytes_fields(per_rank),
        **run_history.phase_fields([r.get("phases_s_by_step", []) for r in per_rank], device),
    )


def comm_bytes_fields(per_rank: list[dict]) -> dict:
    """RunResult's byte counts: per axis the max over ranks of each rank's mean per step after
    the first (the critical rank, as the cost model predicts), every rank's mean, rank 0's steps."""
    by_rank = [r.get("comm_bytes_per_step", {}) for r in per_rank]
    axes = sorted({axis for r in by_rank for axis in r})
    return {
        "comm_bytes_per_step": {a: max(r.get(a, 0) for r in by_rank) for a in axes},
        "comm_bytes_per_step_by_rank": by_rank,
        "comm_bytes_by_step": per_rank[0].get("comm_bytes_by_step", []),
    }
