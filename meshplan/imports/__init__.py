"""`meshplan estimate --import PATH` / `meshplan plan --import PATH`: a user's existing training config read
back as meshplan options.

`read_config(path)` recognises a DeepSpeed JSON, an accelerate YAML, a torchtitan config (0.3's Python
config module or 0.2's TOML), an llm-foundry training YAML or a Megatron argument script (the ones meshplan writes and hand-written
ones) and returns `Imported`: option values named as `meshplan estimate`'s flags (tp, pp, dp, microbatch,
global_batch, recompute, zero, precision, model, ...) and a note per thing the file does not say. The CLI
makes them the parser's defaults, so a flag on the command line overrides the file.
"""

from __future__ import annotations

from pathlib import Path

from meshplan.errors import MeshplanError
from meshplan.imports.common import Imported


def read_config(path: str, world: int | None = None) -> Imported:
    """The options of the config at `path`, by its format; `world` (--num-gpus) where the file has no launch line."""
    p, function = Path(path), None
    if not p.is_file() and ":" in path:  # FILE:FUNCTION, a torchtitan config_registry function (its --config)
        head, _, function = path.rpartition(":")
        p = Path(head)
    if not p.is_file():
        raise MeshplanError(
            f"--import {path}: no such file; give a DeepSpeed JSON, accelerate YAML, torchtitan config, llm-foundry "
            "YAML or Megatron script"
        )
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise MeshplanError(f"--import {path}: cannot read it as text ({exc})") from exc
    from meshplan.imports import accelerate, deepspeed, llm_foundry, megatron, torchtitan

    if function is not None:
        if not (torchtitan.recognises(p, text) and p.suffix.lower() == ".py"):
            raise MeshplanError(f"--import {path}: :{function} names a function of a torchtitan 0.3 config module only")
        return torchtitan.read(p, text, world, function)
    for reader in (deepspeed, accelerate, llm_foundry, torchtitan, megatron):
        if reader.recognises(p, text):
            return reader.read(p, text, world)
    raise MeshplanError(
        f"--import {path}: not a DeepSpeed JSON (train_batch_size), accelerate YAML (distributed_type), torchtitan "
        "config ([parallelism] or Trainer.Config), llm-foundry YAML (model.d_model, global_train_batch_size) or "
        "Megatron script (--tensor-model-parallel-size ...)"
    )


__all__ = ["Imported", "read_config"]
