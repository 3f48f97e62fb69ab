"""What every config reader returns, and the facts meshplan's own exports add to a file."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from meshplan.errors import MeshplanError


@dataclass(kw_only=True)
class Imported:
    """Options read from a config file, named as `meshplan estimate`'s option dests."""

    format: str
    """deepspeed, accelerate, torchtitan, llm-foundry or megatron."""
    values: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """What the file does not say and what meshplan assumes instead (printed as warnings)."""

    KNOBS = (
        "tp", "pp", "dp", "cp", "microbatch", "schedule", "virtual_stages", "stage_layers", "recompute",
        "recompute_num_layers", "recompute_blocks",
        "zero", "sequence_parallel", "dp_shard", "offload",
    )  # fmt: skip
    """The values a search is free to change (`plan --import` searches them; `estimate` pins them)."""

    def knobs(self) -> dict[str, Any]:
        return {k: v for k, v in self.values.items() if k in self.KNOBS}

    def fixed(self) -> dict[str, Any]:
        """Model, cluster, batch, precision and runtime: what the user's job is, whatever its split."""
        return {k: v for k, v in self.values.items() if k not in self.KNOBS}


HEADER = re.compile(r"meshplan plan -> [^:]+: (\S+) on (\d+) x (\S+)")
ESTIMATE_LINE = re.compile(r"meshplan estimate --import \S+ (.*)$", re.M)


def meshplan_header(text: str, values: dict[str, Any]) -> None:
    """An export of meshplan's own names the model, world and cluster in its first line, and the runtime and
    behaviours of the prediction in its `meshplan estimate --import` line: taken where the file says them."""
    hit = HEADER.search(text)
    if hit:
        model, world, cluster = hit.groups()
        values.setdefault("num_gpus", int(world))
        values.setdefault("cluster", cluster)
        if not model.startswith("analytic:"):  # a zoo or file model; analytic shapes come from the flags
            values.setdefault("model", model)
    line = ESTIMATE_LINE.search(text)
    if line:
        tokens = shlex.split(line.group(1))
        for i, tok in enumerate(tokens):
            if not tok.startswith("--"):
                continue
            name = tok[2:].replace("-", "_")
            rest = tokens[i + 1 :]
            given = [t for t in rest[: next((j for j, t in enumerate(rest) if t.startswith("--")), len(rest))]]
            if name == "set":
                values.setdefault("overrides", given)
            elif name.startswith("no_") and not given:
                values.setdefault(name[3:], False)
            else:
                values.setdefault(name, True if not given else _number(given[0]))


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def need(values: dict[str, Any], key: str, path: str, why: str) -> Any:
    if key not in values:
        raise MeshplanError(f"--import {path}: {why}")
    return values[key]


def degrees(values: dict[str, Any], world: int | None, path: str) -> None:
    """dp from the world size and the model-parallel degrees (tp x pp x cp), when the file gives the world."""
    if world is None or "dp" in values:
        return
    model_parallel = values.get("tp", 1) * values.get("pp", 1) * values.get("cp", 1)
    if world % model_parallel:
        raise MeshplanError(
            f"--import {path}: the world of {world} ranks is not a multiple of tp x pp x cp = {model_parallel}"
        )
    values["dp"] = world // model_parallel
    values.setdefault("num_gpus", world)
