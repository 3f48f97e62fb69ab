"""`meshplan export plan.json --to TARGET`: the plan as another trainer's configuration.

Every target states, inside its output, what of the plan it cannot express (a WARNING comment
line) instead of dropping it silently; degrees and the batch arithmetic (global = micro x
accumulation x data-parallel degree) are always carried over.
"""

from __future__ import annotations

from collections.abc import Callable

from meshplan.errors import MeshplanError
from meshplan.plan import Plan


def _targets() -> dict[str, Callable[..., dict[str, str]]]:
    from meshplan.report.export_accelerate import export_accelerate
    from meshplan.report.export_deepspeed import export_deepspeed
    from meshplan.report.export_megatron import export_megatron
    from meshplan.report.export_torchtitan import export_torchtitan

    return {
        "torchtitan": export_torchtitan,
        "megatron": export_megatron,
        "deepspeed": export_deepspeed,
        "accelerate": export_accelerate,
    }


EXPORT_TARGETS = ("torchtitan", "megatron", "deepspeed", "accelerate")


def export_plan(plan: Plan, target: str, version: str | None = None) -> dict[str, str]:
    """Filename -> file content for `target` (one of EXPORT_TARGETS); `version` picks a release of the target
    where its config format changed (torchtitan: "0.3", the default, or "0.2")."""
    key = target.strip().lower().replace("-", "").replace("_", "")
    aliases = {"megatronlm": "megatron", "titan": "torchtitan", "ds": "deepspeed"}
    key = aliases.get(key, key)
    targets = _targets()
    if key not in targets:
        raise MeshplanError(f"--to {target!r} is not an export target; use one of {', '.join(EXPORT_TARGETS)}")
    if version is not None and key != "torchtitan":
        raise MeshplanError(f"--target-version {version}: only the torchtitan export has versions (0.3, 0.2)")
    return targets[key](plan, version) if key == "torchtitan" else targets[key](plan)
