"""meshplan.executor: apply a Plan with torch.distributed and launch it with torchrun.

- `apply(model, plan, mesh)` -> Parallelized (model parts, pipeline schedule, a step function)
- `run_plan(plan, LaunchOptions(steps=..., ...))` -> RunResult (and out_dir/run.json)
- `launch_command(plan, LaunchOptions(...))` -> the torchrun command line
- `check_plan(plan)` -> None, or MeshplanError before any process starts
Torch is imported lazily so that `import meshplan.executor` stays cheap for the CLI.
"""

from __future__ import annotations

__all__ = ["apply", "run_plan", "launch_command", "LaunchOptions", "check_plan", "build_mesh", "Parallelized"]


def __getattr__(name: str):
    if name in ("apply", "Parallelized"):
        from meshplan.executor import parallelize as _apply_mod

        return getattr(_apply_mod, name)
    if name in ("run_plan", "launch_command", "LaunchOptions"):
        from meshplan.executor import launch

        return getattr(launch, name)
    if name == "check_plan":
        from meshplan.executor.check import check_plan

        return check_plan
    if name == "build_mesh":
        from meshplan.executor.parallel_dims import build_mesh

        return build_mesh
    raise AttributeError(name)
