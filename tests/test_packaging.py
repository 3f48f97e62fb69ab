"""The wheel a user would install: built from a clean copy of the sources, installed into a fresh
venv, and `meshplan plan` run from outside the repository.

No download: the wheel is built without build isolation (this venv's setuptools), installed with
--no-deps, and the fresh venv sees this venv's site-packages (torch pinned by constraints.txt,
rich) through a path file placed after its own, so the `meshplan` it imports is the wheel's.
`pip check` then fails if a declared dependency is missing or at a conflicting version."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "reports", "runs", "tmp", ".pytest_cache"
)


def _run(cmd: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    """(the wheel, the build's output) from a copy of the tree without build leftovers."""
    src = tmp_path_factory.mktemp("src") / "meshplan"
    shutil.copytree(REPO, src, ignore=SKIP)
    out = tmp_path_factory.mktemp("dist")
    done = _run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", out, "."], cwd=src
    )
    (whl,) = out.glob("meshplan-*.whl")
    return whl, done.stdout + done.stderr


def test_the_build_prints_no_setuptools_warning(wheel):
    _, log = wheel
    warnings = [line.strip() for line in log.splitlines() if "Warning:" in line or "deprecated" in line.lower()]
    assert warnings == []


def test_the_wheel_ships_every_package_and_the_data_tables(wheel):
    names = set(zipfile.ZipFile(wheel[0]).namelist())
    for path in (
        "meshplan/cli.py",
        "meshplan/planner/search/branch_bound.py",
        "meshplan/models/zoo/__init__.py",
        "meshplan/profiler/api.py",
        "meshplan/executor/launch.py",
        "meshplan/data/hardware.csv",
        "meshplan/data/published-runs.csv",
    ):
        assert path in names, path
    assert not any(n.startswith(("tests/", "benchmarks/", "reports/")) for n in names)


def test_the_wheel_installs_in_a_fresh_venv_and_plans(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    own = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path).stdout.strip())
    # this venv's packages (torch, rich) after the fresh venv's own: no torch download
    (own / "zz_meshplan_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            py,
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
            wheel[0],
        ],
        tmp_path,
        env,
    )
    _run([sys.executable, "-m", "pip", "--python", py, "check"], tmp_path, env)
    where = _run([py, "-c", "import meshplan; print(meshplan.__file__)"], tmp_path, env).stdout.strip()
    assert Path(where).is_relative_to(own), f"imported {where}, not the wheel in {own}"
    out = _run(
        [
            env_dir / "bin" / "meshplan",
            "plan",
            "--model",
            "gpt-tiny",
            "--num-gpus",
            "2",
            "--global-batch",
            "4",
            "--json",
        ],
        tmp_path,
        env,
    ).stdout
    plan = json.loads(out)
    assert plan["step_time_s"] > 0 and plan["peak_memory_bytes"] > 0
