"""Which checkpoint is complete, decided from files alone (torch-free; the launcher asks before
any rank starts, the ranks ask again when they load).

A step directory is complete when its manifest.json exists and every file it lists has the
listed size and sha256. Rank 0 writes the manifest after every rank saved (a barrier), then
`latest`, both atomically. `resume_point` trusts `latest` only if its step is complete, and
otherwise falls back to the newest complete step with a warning naming what was damaged.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from meshplan.schema import write_text_atomic

MANIFEST = "manifest.json"


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def step_dir(out_dir: str | Path, step: int) -> Path:
    return checkpoint_root(out_dir) / f"step_{step:06d}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(path: Path, step: int) -> None:
    """List every file of the step directory with its size and hash (after all ranks saved)."""
    files = {
        f.relative_to(path).as_posix(): {"bytes": f.stat().st_size, "sha256": _sha256(f)}
        for f in sorted(path.rglob("*"))
        if f.is_file() and f.name != MANIFEST
    }
    write_text_atomic(path / MANIFEST, json.dumps({"step": step, "files": files}, indent=1) + "\n")


def damage(path: Path) -> str | None:
    """None if the step directory is complete, else what is wrong with it."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{path.name} has no readable {MANIFEST} (the save did not finish)"
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            return f"{path.name}/{name} is missing"
        if f.stat().st_size != want.get("bytes"):
            return f"{path.name}/{name} is {f.stat().st_size} bytes, the manifest says {want.get('bytes')}"
        if _sha256(f) != want.get("sha256"):
            return f"{path.name}/{name} does not match its sha256 in the manifest"
    return None


def complete_steps(out_dir: str | Path) -> list[int]:
    root = checkpoint_root(out_dir)
    steps = []
    for d in sorted(root.glob("step_*")) if root.is_dir() else []:
        if d.name[5:].isdigit() and damage(d) is None:
            steps.append(int(d.name[5:]))
    return steps


def resume_point(out_dir: str | Path) -> tuple[int, str | None]:
    """(step to resume from, 0 if none; a warning line if `latest` could not be trusted)."""
    marker = checkpoint_root(out_dir) / "latest"
    if not marker.exists():
        return 0, None
    text = ""
    try:
        text = marker.read_text(errors="replace").strip()
        named = int(text)
        problem = damage(step_dir(out_dir, named)) if named > 0 else f"it names step {named}"
    except (OSError, ValueError):
        named, problem = None, f"checkpoints/latest is damaged ({text[:20]!r}, not a step number)"
    if problem is None and named is not None:
        return named, None
    older = [s for s in complete_steps(out_dir) if named is None or s < named]
    fallback = (
        f"falling back to step {older[-1]}, the newest complete checkpoint"
        if older
        else "no complete checkpoint is left"
    )
    return (older[-1] if older else 0), f"checkpoint in {checkpoint_root(out_dir)}: {problem}; {fallback}"
