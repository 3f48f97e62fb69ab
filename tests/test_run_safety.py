"""Runs that cannot lose or mix up data: one run per directory, signals that stop
every rank, ranks that die or stop named correctly, and no process of a run left behind.

Every test here launches gpt-tiny on 2 gloo ranks for a few seconds; the launcher runs as
`python -m meshplan run` in its own session so the test can signal it like a shell would."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from executor_plans import make_plan

from meshplan.cli import main
from meshplan.errors import RunError
from meshplan.executor import run_plan
from meshplan.executor.checkpoint import latest_step
from meshplan.executor.reference import reference_losses
from meshplan.schema import save

pytestmark = pytest.mark.slow
SGD = dict(optimizer="sgd", lr=0.5, grad_clip=1.0)


def processes_of(out_dir: Path) -> list[str]:
    """Command lines of live processes that name out_dir (torchrun and its ranks do)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(out_dir) in cmd and state != "Z" and entry.name != str(os.getpid()):
            found.append(f"{entry.name}: {cmd[:160]}")
    return found


def wait_for(cond, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _sigint_as_in_a_terminal() -> None:
    """The launcher gets SIGINT's default disposition, as a command typed at a terminal does: a
    test process run as a background job of a non-interactive shell (`.ci/run &`) inherits SIGINT
    ignored, which the launcher rightly keeps ignoring (_interrupt_signals)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_cli_run(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    plan_path, out = tmp_path / "plan.json", tmp_path / "run"
    save(make_plan(dp=2), plan_path)
    cmd = [sys.executable, "-m", "meshplan", "run", str(plan_path), "--out-dir", str(out), "--quiet", *extra]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_sigint_as_in_a_terminal,
        # faulthandler: finish() aborts a launcher that outlives its time, and every thread's stack is printed
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).parent), PYTHONFAULTHANDLER="1"),
    )
    return proc, out


def lock_holder(out: Path) -> dict:
    try:
        return json.loads((out / ".meshplan.lock").read_text() or "{}")
    except (OSError, ValueError):
        return {}


def finish(proc: subprocess.Popen, timeout_s: float = 60) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGABRT)  # with PYTHONFAULTHANDLER set: where each thread of the launcher is
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()  # with what the timed-out communicate() had already read
        raise AssertionError(f"launcher still running after {timeout_s} s: {err[-6000:]}") from None
    return proc.returncode, out, err


def test_second_run_into_the_same_dir_is_refused_and_cleanup_spares_other_runs(tmp_path, capsys):
    """Run B into run A's --out-dir refuses at once naming A's pid; A completes with its own
    results (run id in run.json and every rank's result file); A's cleanup leaves a process
    that looks like another run's rank alone."""
    decoy = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(300)",
            "meshplan.executor.worker",
            "--run-id",
            "someone-else",
            "--out-dir",
            str(tmp_path / "run"),
        ]
    )
    try:
        proc, out = start_cli_run(tmp_path, "--steps", "40", "--checkpoint-every", "20", "--timeout", "120")
        holder = wait_for(lambda: lock_holder(out).get("pid"), 60, "run A's lock")
        start = time.monotonic()
        assert main(["run", str(tmp_path / "plan.json"), "--out-dir", str(out), "--steps", "4", "--quiet"]) == 2
        assert time.monotonic() - start < 10
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "in use by run" in err and f"(pid {holder})" in err, err
        rc, _, err = finish(proc, 240)
        assert rc == 0, err
        run = json.loads((out / "run.json").read_text())
        assert run["run_id"] == lock_holder(out)["run_id"] and len(run["losses"]) == 40
        for rank in (0, 1):
            assert json.loads((out / f"rank{rank}.result.json").read_text())["run_id"] == run["run_id"]
        assert decoy.poll() is None, "the run's cleanup killed another run's process"
    finally:
        decoy.kill()
        decoy.wait()
    assert processes_of(out) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signal_stops_every_rank_and_keeps_the_last_checkpoint(tmp_path, sig):
    """The launcher stopped by SIGTERM/SIGHUP/SIGINT ends every rank within seconds, exits
    128 + signal with one line naming the surviving checkpoint, prints no torchrun traceback; the
    checkpoint resumes (SIGTERM: onto the single-process trajectory)."""
    proc, out = start_cli_run(tmp_path, "--steps", "100000", "--checkpoint-every", "5", "--timeout", "120")
    wait_for(lambda: latest_step(out) >= 5 or proc.poll() is not None, 120, "the first checkpoint")
    assert proc.poll() is None, proc.communicate()[1]
    start = time.monotonic()
    proc.send_signal(sig)
    rc, stdout, stderr = finish(proc, 60)
    assert time.monotonic() - start < 20
    assert rc == 128 + sig, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stdout + stderr, stdout + stderr
    kept = latest_step(out)
    assert lines[0].startswith(
        f"meshplan run: interrupted by {signal.Signals(sig).name}: all 2 ranks stopped; "
        f"the last complete checkpoint is step {kept}"
    ), lines[0]
    assert kept >= 5 and kept % 5 == 0
    assert processes_of(out) == []
    if sig == signal.SIGTERM:
        plan = make_plan(dp=2)
        resumed = run_plan(plan, steps=kept + 3, out_dir=str(out), resume=True, quiet=True, timeout_s=120)
        ref = reference_losses(plan, steps=kept + 3)
        assert resumed.resumed_from_step == kept
        # steps 1..kept from the interrupted launch's run.json (kept as it went), then the resumed ones
        assert len(resumed.losses) == kept + 3
        assert max(abs(a - b) / b for a, b in zip(resumed.losses, ref)) <= 1e-5


def test_a_second_signal_while_stopping_is_ignored():
    """Inside the launcher's signal handling the first SIGINT raises RunInterrupted (exit 130); a
    second one while the ranks are being stopped (Ctrl-C pressed twice) is ignored instead of
    cutting the stop short; on leaving, SIGINT is Python's KeyboardInterrupt again."""
    from meshplan.errors import RunInterrupted
    from meshplan.executor.launch import _interrupt_signals

    caught: list[BaseException] = []
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (see above)
    try:
        with _interrupt_signals():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler raises before this ends
            finally:  # the stop: a second Ctrl-C arrives here
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
    except KeyboardInterrupt as exc:  # caught here, not by pytest, which would end the session
        caught.append(exc)
    finally:
        restored = signal.signal(signal.SIGINT, inherited)
    (first,) = caught
    assert isinstance(first, RunInterrupted), repr(first)
    assert first.signum == signal.SIGINT and first.exit_code == 130
    assert restored is signal.default_int_handler


def test_a_sigint_the_launcher_was_started_ignoring_stays_ignored():
    """A launcher run as a background job of a non-interactive shell inherits SIGINT ignored, as
    every process of that job does; its signal handling leaves that as it found it."""
    from meshplan.executor.launch import _interrupt_signals

    inherited = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with _interrupt_signals():
            os.kill(os.getpid(), signal.SIGINT)  # ignored: nothing raised
            time.sleep(0.2)
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_killed_launcher_takes_every_rank_with_it(tmp_path):
    """SIGKILL cannot be handled: torchrun and the ranks go with their parent anyway."""
    proc, out = start_cli_run(tmp_path, "--steps", "100000", "--timeout", "120")
    wait_for(
        lambda: len(list((out / "ranks").glob("*.status.json"))) == 2 if (out / "ranks").exists() else False,
        120,
        "both ranks running",
    )
    proc.kill()
    proc.wait()
    wait_for(lambda: processes_of(out) == [], 30, "no process of the run")


def _signal_rank_when_running(out: Path, rank: int, sig: int, min_step: int) -> threading.Thread:
    def act():
        path = out / "ranks" / f"rank{rank}.status.json"
        end = time.monotonic() + 120
        while time.monotonic() < end:
            try:
                status = json.loads(path.read_text())
            except (OSError, ValueError):
                status = {}
            if status.get("step", -1) >= min_step:
                os.kill(status["pid"], sig)
                return
            time.sleep(0.1)

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "sig, match",
    [
        (signal.SIGSTOP, r"^rank 1 is stopped \(SIGSTOP/SIGTSTP, pid \d+\) at step \d+"),
        (signal.SIGKILL, r"^rank 1 died \(exit code -9\) after reporting step \d+"),
    ],
)
def test_stopped_or_killed_rank_is_named(tmp_path, sig, match):
    out = tmp_path / "run"
    watcher = _signal_rank_when_running(out, 1, sig, min_step=3)
    start = time.monotonic()
    with pytest.raises(RunError, match=match):
        run_plan(make_plan(dp=2), steps=100000, out_dir=str(out), quiet=True, timeout_s=10, **SGD)
    watcher.join()
    assert time.monotonic() - start < 120
    assert processes_of(out) == []


def test_damaged_checkpoint_falls_back_and_a_fresh_run_keeps_it(tmp_path, capfd):
    """A fresh run never deletes an earlier run's resumable checkpoint (refused before launch);
    a truncated shard of the newest checkpoint is found before any rank starts and the resume
    falls back to the newest complete one with one warning line, onto the single-process
    trajectory; a garbage `latest` falls back the same way."""
    from meshplan.errors import MeshplanError
    from meshplan.executor.checkpoint_manifest import resume_point

    plan, out = make_plan(dp=2), tmp_path / "run"
    run_plan(plan, steps=4, out_dir=str(out), checkpoint_every=2, quiet=True, timeout_s=120, **SGD)
    assert latest_step(out) == 4
    with pytest.raises(MeshplanError, match=r"holds a resumable checkpoint at step 4 .* --resume.* --overwrite"):
        run_plan(plan, steps=4, out_dir=str(out), quiet=True, **SGD)
    assert latest_step(out) == 4 and json.loads((out / "ranks" / "rank0.status.json").read_text())["state"] == "done"
    shard = max((out / "checkpoints" / "step_000004").glob("*.distcp"), key=lambda f: f.stat().st_size)
    shard.write_bytes(shard.read_bytes()[:-10])
    (out / "checkpoints" / "latest").write_text("garbage\0")
    step, warning = resume_point(out)
    assert step == 2 and "checkpoints/latest is damaged" in warning and "falling back to step 2" in warning
    (out / "checkpoints" / "latest").write_text("4\n")
    capfd.readouterr()
    resumed = run_plan(
        plan, steps=5, out_dir=str(out), checkpoint_every=2, resume=True, quiet=True, timeout_s=120, **SGD
    )
    err = [line for line in capfd.readouterr().err.splitlines() if "meshplan run: warning" in line]
    assert len(err) == 1 and f"{shard.name} is" in err[0] and "falling back to step 2" in err[0], err
    assert resumed.resumed_from_step == 2 and resumed.losses_from_step == 0 and len(resumed.losses) == 5
    ref = reference_losses(plan, steps=5, **SGD)  # steps 1-2 kept from the first run.json
    assert max(abs(a - b) / b for a, b in zip(resumed.losses, ref)) <= 1e-5
    assert latest_step(out) == 4  # step 4 saved again, complete this time
    assert processes_of(out) == []


# ------------------------------------------------------------------ launched faults, one row each
# (plan kwargs, run_plan kwargs, environment, expected RunError text or None, check of the out-dir
# afterwards). Every row launches gpt-tiny on 2 gloo ranks for a few steps.
def _nan_run_json_kept(out: Path) -> None:
    run = json.loads((out / "run.json").read_text())  # strict JSON: no NaN token
    assert run["losses"][0] is not None and run["losses"][-1] is None and len(run["losses"]) == 3
    assert any("diverged" in note for note in run["notes"])


def _nothing_left_of_killed_ranks(out: Path) -> None:
    assert not list((out / "ranks").glob("*.tmp"))
    assert not (out / "offload").exists(), list((out / "offload").rglob("*"))


FAULTS = [
    (
        "nan-loss",
        {},
        dict(steps=3, lr=1e30, grad_clip=0.0),
        {},
        r"the loss diverged: step 2's loss",
        _nan_run_json_kept,
    ),
    (
        "nvme-rank-killed",
        dict(offload="nvme"),
        dict(steps=4),
        {"MESHPLAN_FAULT": "1:2:exit"},
        r"rank 1 died",
        _nothing_left_of_killed_ranks,
    ),
]


@pytest.mark.parametrize("plan_kw, run_kw, env, error, check", [r[1:] for r in FAULTS], ids=[r[0] for r in FAULTS])
def test_run_fault_keeps_results_and_leaves_nothing(tmp_path, monkeypatch, plan_kw, run_kw, env, error, check):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "run"
    kwargs = {**SGD, **run_kw}
    with pytest.raises(RunError, match=error) if error else contextlib.nullcontext():
        run_plan(make_plan(dp=2, **plan_kw), out_dir=str(out), quiet=True, timeout_s=60, **kwargs)
    check(out)
    assert processes_of(out) == []


def test_readme_resume_pair_continues_run_json(tmp_path, capsys):
    """--steps is the run's total: an interrupted run (3 of 4 steps, checkpoint at 2) resumed with
    --steps 4 keeps steps 1-2 of the first run.json and appends 3-4, on the single-process
    trajectory; resuming a finished run has nothing to run (exit 0, run.json unchanged)."""
    plan_path, out = tmp_path / "plan.json", tmp_path / "run"
    plan = make_plan(dp=2)
    save(plan, plan_path)
    base = ["run", str(plan_path), "--out-dir", str(out), "--optimizer", "sgd", "--quiet"]
    assert main([*base, "--steps", "3", "--checkpoint-every", "2"]) == 0
    first = json.loads((out / "run.json").read_text())["losses"]
    assert main([*base, "--steps", "4", "--resume", "--checkpoint-every", "2"]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["resumed_from_step"] == 2 and run["losses_from_step"] == 0 and run["losses"][:2] == first[:2]
    ref = reference_losses(plan, steps=4, optimizer="sgd", lr=3e-4, grad_clip=1.0)
    assert max(abs(a - b) / b for a, b in zip(run["losses"], ref)) <= 1e-5
    text = (out / "run.json").read_text()
    capsys.readouterr()
    assert main([*base, "--steps", "4", "--resume"]) == 0
    assert "nothing to run" in capsys.readouterr().err and (out / "run.json").read_text() == text


def _tmpfs_cli(tmp_path: Path, size: str, fill: bool, *args: str) -> subprocess.CompletedProcess:
    """`meshplan run ... --out-dir fs/run` with fs a private tmpfs of `size` (a user and mount
    namespace, so no root is needed and nothing stays mounted); fill=True fills it first."""
    fs = tmp_path / "fs"
    fs.mkdir()
    filler = f"head -c {size} /dev/zero > {fs}/filler 2>/dev/null;" if fill else ""
    script = (
        f"mount -t tmpfs -o size={size} tmpfs {fs} || exit 99; {filler} "
        f"exec {sys.executable} -m meshplan run {tmp_path / 'plan.json'} --out-dir {fs}/run --quiet {' '.join(args)}; "
    )
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no unprivileged user and mount namespaces (unshare -rm) to make a small disk")
    save(make_plan(dp=2), tmp_path / "plan.json")
    inspect = f"; ls -a {fs}/run/ranks {fs}/run 2>/dev/null"
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"({script}); echo rc=$?{inspect}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).parent)),
    )
    if "rc=99" in proc.stdout:
        pytest.skip("cannot mount a tmpfs here")
    return proc


@pytest.mark.parametrize(
    "size, fill, args, rc, needle",
    [
        ("2m", False, ("--steps", "4", "--checkpoint-every", "2"), 4, "the disk is full"),  # at the checkpoint
        ("64k", True, ("--steps", "2"), 2, "cannot write .meshplan.lock: the disk is full"),  # at start
    ],
)
def test_full_disk_is_said_in_the_last_line(tmp_path, size, fill, args, rc, needle):
    proc = _tmpfs_cli(tmp_path, size, fill, *args)
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert f"rc={rc}" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert needle in err[-1] and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert ".tmp" not in proc.stdout, proc.stdout
