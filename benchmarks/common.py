"""Metrics and machine facts shared by the benchmark sections (pure Python, no torch at import).

- mape: mean absolute percentage error, mean(|pred - meas| / meas).
- kendall_tau: Kendall's tau-b (Kendall 1945; ties in either ranking handled), the agreement
  of two rankings: 1 = same order, -1 = reversed, 0 = unrelated.
- top1_regret: measured time of the plan the model ranks first / best measured time.
- spread: max / min - 1 over repeated measurements of one thing.
"""

from __future__ import annotations

import math
import os
import platform
import statistics


def mape(predicted: list[float], measured: list[float]) -> float:
    """Mean |pred - meas| / meas over the pairs (measured values must be > 0)."""
    assert len(predicted) == len(measured) and measured, "one prediction per measurement"
    return statistics.fmean(abs(p - m) / m for p, m in zip(predicted, measured))


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b between two score lists (O(n^2); grids are small)."""
    assert len(a) == len(b) and len(a) >= 2, "need two lists of the same length >= 2"
    concordant = discordant = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = _sign(a[i] - a[j]), _sign(b[i] - b[j])
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif da == db:
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + ties_a) * (concordant + discordant + ties_b))
    return (concordant - discordant) / denom if denom else 0.0


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def top1_regret(predicted: list[float], measured: list[float]) -> float:
    """Measured time of argmin(predicted) / min(measured): 1.0 when the model picks the best."""
    choice = min(range(len(predicted)), key=lambda i: (predicted[i], i))
    return measured[choice] / min(measured)


def spread(values: list[float]) -> float:
    """max / min - 1 (0 for a single value)."""
    return max(values) / min(values) - 1 if values and min(values) > 0 else 0.0


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def git_state(repo: str = ".") -> dict:
    """The commit the run used and the tracked files that differed from it (others edit the tree)."""
    import subprocess

    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, timeout=30)
        return proc.stdout.rstrip() if proc.returncode == 0 else ""

    modified = [ln[3:] for ln in git("status", "--porcelain", "--untracked-files=no").splitlines()]
    return {"commit": git("rev-parse", "--short", "HEAD"), "modified": modified}


def machine_info() -> dict:
    """What the numbers were measured on: CPU, cores, memory, OS, load at the time."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            names = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        memory_gib = float("nan")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_gib, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else [],
    }


def run_at_rate(cmd: list[str], rate: str, timeout_s: float, out_flag: str = "--out") -> dict:
    """Run `cmd` (a benchmark's inner half, which writes its JSON result to the path given after
    `out_flag`) inside a slow-link namespace at `rate` (benchmarks/slow_link.py), or directly when
    rate is "none"; its result, or {"rate", "error"} when it failed."""
    import json
    import subprocess
    import sys
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [*cmd, out_flag, out.name]
        if rate != "none":
            limit = ["--timeout-s", str(timeout_s + 60)]
            cmd = [sys.executable, "-m", "benchmarks.slow_link", "--rate", rate, *limit, "--", *cmd]
        rc = subprocess.run(cmd, cwd=root).returncode
        if rc != 0:
            return {"rate": rate, "error": f"exit {rc}"}
        return json.load(open(out.name))
