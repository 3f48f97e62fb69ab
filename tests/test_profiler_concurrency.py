"""Busy neighbours (profiler/concurrency.py): repeated profiles in one long-lived process, and
failures that explain themselves (exit code and output of the worker, or the missing guard)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from meshplan.errors import RunError
from meshplan.profiler.concurrency import BusyNeighbours
from meshplan.profiler.runner import InputSpec

EMBED_INPUT = InputSpec((32,), "torch.int64", first=True)
"""gpt-tiny's per-sample input to `embed` (seq 32 token ids)."""

BENCHMARK_LIKE = textwrap.dedent('''
    """What benchmarks.run does between rounds, in one process; a forked child collects garbage at
    once (os.register_at_fork) instead of by chance, as a worker did in the benchmark's round 3."""
    import gc
    import os

    os.environ["OMP_NUM_THREADS"] = "1"


    def leave_gloo_garbage():
        """What wrapper_timing's one-rank group can leave: an unreachable ProcessGroupGloo whose
        gloo threads still run in this process."""
        import torch.distributed as dist

        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        cycle = [dist.group.WORLD]
        cycle.append(cycle)
        dist.destroy_process_group()


    if __name__ == "__main__":
        import torch
        from meshplan.profiler import concurrency, profile_model
        from meshplan.profiler.links import profile_links

        concurrency.START_TIMEOUT_S = 30.0  # a hung worker fails the test in 30 s, not 120
        os.register_at_fork(after_in_child=gc.collect)
        torch.set_num_threads(2)
        torch.ones(256, 256) @ torch.ones(256, 256)  # torch's intra-op threads: native ones
        torch.set_num_threads(1)  # they stay alive, idle (timing with 2 would be slow here, not wrong)
        profile_links(2, max_bytes=4096, collectives=("all_reduce",), repeats=1)  # a torchrun gloo job
        for i in range(2):
            gc.disable()
            leave_gloo_garbage()
            print("native threads", len(os.listdir("/proc/self/task")), flush=True)
            profile = profile_model("gpt-tiny", {"layers": 1}, device="cpu", concurrent=2, in_place=False)
            gc.enable()
            print("profiled", i, "concurrent", profile.concurrent, flush=True)
''')

UNGUARDED = textwrap.dedent("""
    import os

    os.environ["OMP_NUM_THREADS"] = "1"
    from meshplan.profiler import profile_model

    profile_model("gpt-tiny", {"layers": 1}, device="cpu", concurrent=2, in_place=False)
""")


def _run_script(tmp_path, text: str, timeout_s: float) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(text)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=timeout_s, cwd=tmp_path
    )


def test_a_worker_that_fails_reports_its_exit_code_and_output():
    with BusyNeighbours(1, "gpt-tiny", {"bogus": 1}, "cpu") as busy:
        with pytest.raises(
            RunError,
            match=r"meshplan-busy-0 died \(exit code 1\) while starting embed.*"
            r"gpt has no 'bogus'",
        ):
            busy.run("embed", 1, EMBED_INPUT)


def test_a_worker_killed_by_a_signal_is_named():
    with BusyNeighbours(1, "gpt-tiny", None, "cpu") as busy:
        os.kill(busy.procs[0].pid, signal.SIGKILL)
        busy.procs[0].join(timeout=30)
        with pytest.raises(RunError, match="killed by SIGKILL"):
            busy.run("embed", 1, EMBED_INPUT)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts native threads in /proc")
def test_repeated_profiles_survive_native_threads_and_gloo_garbage_in_the_parent(tmp_path):
    """The benchmark's failure: workers forked from a parent holding gloo garbage and threads
    aborted (std::system_error) or hung when their garbage collector ran; it must not matter."""
    result = _run_script(tmp_path, BENCHMARK_LIKE, timeout_s=240)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    threads = [int(line.split()[-1]) for line in lines if line.startswith("native threads")]
    assert len(threads) == 2 and min(threads) > 1, lines  # the parent really had native threads
    assert [line for line in lines if line.startswith("profiled")] == [
        "profiled 0 concurrent 2",
        "profiled 1 concurrent 2",
    ]


@pytest.mark.slow
def test_a_script_without_main_guard_gets_the_one_line_fix(tmp_path):
    result = _run_script(tmp_path, UNGUARDED, timeout_s=240)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("meshplan.errors.MeshplanError: --concurrent 2: busy worker meshplan-busy-0 exited")
    assert "`if __name__ == '__main__':` guard" in last
