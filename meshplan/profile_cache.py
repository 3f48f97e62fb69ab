"""On-disk cache of meta-device profiles, so that planning a zoo or HF model a second time needs
neither torch nor a capture (`meshplan plan --model gpt3-175b` ~1 s instead of ~4 s; benchmarks/
planner_speed.py --cli).

What is cached: the ModelProfile `meshplan plan/estimate/profile` builds on the meta device (FLOPs,
saved bytes, GEMM shapes, TP rules; nothing timed) for a zoo name or an `hf:` config. A user factory
(`file.py:factory`, `module:factory`) is never cached: its module imports code the key cannot see.

The key is a sha256 over the model spec, its `--set` values, the contents of a local HF
config.json, the versions of meshplan, torch and transformers (read from the installed
distributions, without importing them) and the size and mtime of every source file of the code
that builds and captures the model (meshplan/models, meshplan/profiler, the profile contract), so
an edit or an upgrade invalidates it. The profile carries the model's structure hash, which
`meshplan run` checks against the model it builds. Entries live in `MESHPLAN_CACHE_DIR`, else
`$XDG_CACHE_HOME/meshplan`, else `~/.cache/meshplan`, under `profiles/<meshplan version>/`; they
are written to a temporary file and renamed (safe under concurrent planners: the last writer wins
with an identical file). `MESHPLAN_PROFILE_CACHE=off` turns it off. A cache that cannot be read
or written is skipped silently: it only saves time.

Torch-free.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

import meshplan
from meshplan.model_profile import ModelProfile

_SOURCES = ("models", "profiler")
"""Package folders (under the installed meshplan namespace) whose code shapes a profile."""


def enabled() -> bool:
    return os.environ.get("MESHPLAN_PROFILE_CACHE", "on").lower() not in ("off", "0", "no", "false")


def cache_dir() -> Path:
    root = os.environ.get("MESHPLAN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "meshplan"
    )
    return Path(root) / "profiles" / meshplan.__version__


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


def _code_stamp() -> list:
    """(path, size, mtime_ns) of every source file that builds or captures a model."""
    import meshplan.model_profile as contract

    files = [Path(contract.__file__)]
    for name in _SOURCES:
        spec = importlib.util.find_spec(f"meshplan.{name}")  # finds, does not import (torch)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            files += sorted(Path(folder).rglob("*.py"))
    out = []
    for f in files:
        st = f.stat()
        out.append((str(f), st.st_size, st.st_mtime_ns))
    return out


def _config_text(model: str) -> str:
    """The contents of a local HF config (`hf:path/config.json` or a folder holding one)."""
    path = Path(model.removeprefix("hf:"))
    if path.is_dir():
        path = path / "config.json"
    return path.read_text() if path.is_file() else ""


def key(model: str, overrides: dict[str, Any]) -> str | None:
    """The cache key of a meta-device profile of `model`, or None when it is not cacheable."""
    if not model.startswith("hf:") and ":" in model:  # a user factory: its imports are unseen
        return None
    parts = {
        "model": model,
        "overrides": sorted((k, repr(v)) for k, v in overrides.items()),
        "config": _config_text(model) if model.startswith("hf:") else "",
        "versions": [meshplan.__version__, _version("torch"), _version("transformers")],
        "code": _code_stamp(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def load(model: str, overrides: dict[str, Any]) -> ModelProfile | None:
    """The cached profile, or None (off, not cacheable, absent, unreadable or stale)."""
    if not enabled():
        return None
    try:
        k = key(model, overrides)
        if k is None:
            return None
        path = cache_dir() / f"{k}.json"
        if not path.is_file():
            return None
        from meshplan import schema

        return schema.from_dict(ModelProfile, json.loads(path.read_text()), "cached profile")
    except Exception:  # noqa: BLE001 - a cache only saves time; anything wrong with it means a miss
        return None


def store(model: str, overrides: dict[str, Any], profile: ModelProfile) -> None:
    """Keep `profile` for the next planner (atomically; skipped when it cannot be written)."""
    if not enabled():
        return
    try:
        k = key(model, overrides)
        if k is None:
            return
        from meshplan import schema

        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        schema.write_text_atomic(folder / f"{k}.json", schema.dumps(profile))
    except Exception:  # noqa: BLE001 - see load
        return
