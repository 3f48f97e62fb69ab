"""A torchtitan config read back: 0.2's TOML job config, or a 0.3 Python config module (its config_registry
function: `config.<section>.<key> = value` assignments and ParallelismConfig(...)/TrainingConfig(...) calls),
the model from its llama3 flavour, the world from the torchrun line where the file or its launcher has one."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.imports.common import Imported, meshplan_header

FLAVORS = {  # torchtitan/models/llama3 flavour -> meshplan's closed-form Llama of the same shape
    "8B": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256),
    "70B": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256),
    "405B": dict(layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256),
}


def recognises(path: Path, text: str) -> bool:
    if path.suffix.lower() == ".toml":
        return "[parallelism]" in text or "[training]" in text
    return path.suffix.lower() == ".py" and (
        "Trainer.Config" in text or "config.parallelism." in text or "ParallelismConfig(" in text
    )


def _config_function(tree: ast.Module, text: str, path: Path, function: str | None) -> list[ast.FunctionDef]:
    """The config_registry function `--config` names (FILE:FUNCTION, else the file's or its launcher's `--config
    NAME`, else the module's only function), after the module's functions it builds on (`config = base()`)."""
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    launcher = path.parent / "run_torchtitan.sh"
    named = re.search(r"--config[ =](\w+)", text + (launcher.read_text() if launcher.is_file() else ""))
    candidates = [n for n in functions if n != "model_spec"]
    name = function or (named[1] if named else candidates[0] if len(candidates) == 1 else None)
    if not functions:
        return []
    if name not in functions:
        raise MeshplanError(
            f"--import {path}: {'no function ' + repr(name) if name else 'several config functions'} in the module "
            f"({', '.join(candidates)}); name one as --import {path}:FUNCTION (torchtitan's --config)"
        )
    chain, seen = [], set()

    def visit(fn: ast.FunctionDef) -> None:
        seen.add(fn.name)
        for node in ast.walk(fn):  # the local functions it calls come first: it overrides what they set
            callee = ast.unparse(node.func) if isinstance(node, ast.Call) else ""
            if callee in functions and callee not in seen and callee != "model_spec":
                visit(functions[callee])
        chain.append(fn)

    visit(functions[name])
    return chain


def _python_sections(text: str, path: Path, function: str | None = None) -> tuple[dict[str, dict], dict[str, Any]]:
    """(sections, extras) of a 0.3 config module's config function: literal assignments and config-class
    keyword arguments, in the order they run."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise MeshplanError(f"--import {path}: not valid Python ({exc.msg}, line {exc.lineno})") from exc
    chain = _config_function(tree, text, path, function)
    body = [*chain, *(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "model_spec")]
    source = "\n".join(ast.get_source_segment(text, fn) or "" for fn in body) if chain else text
    sections: dict[str, dict] = {"parallelism": {}, "training": {}}
    extras: dict[str, Any] = {}
    calls = {"ParallelismConfig": "parallelism", "TrainingConfig": "training"}
    statements = [stmt for fn in chain for stmt in fn.body] if chain else tree.body
    for node in (n for stmt in statements for n in ast.walk(stmt)):  # in the order they run: later ones win
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute):
            target = ast.unparse(node.targets[0]).split(".")
            if len(target) == 3 and target[1] in sections:
                try:
                    sections[target[1]][target[2]] = ast.literal_eval(node.value)
                except ValueError:
                    pass
            elif target[-1] == "activation_checkpoint":
                extras["ac"] = ast.unparse(node.value)
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func).split(".")[-1]
            if name in calls:
                for kw in node.keywords:
                    try:
                        sections[calls[name]][kw.arg] = ast.literal_eval(kw.value)
                    except ValueError:
                        pass
            for kw in node.keywords:
                if kw.arg == "activation_checkpoint":
                    extras["ac"] = ast.unparse(kw.value)
            if name == "CompileConfig":
                extras["compile"] = any(kw.arg == "enable" and ast.unparse(kw.value) == "True" for kw in node.keywords)
    flavors = re.findall(r"model_registry\(\s*['\"](\w+)['\"]", source) or re.findall(r"llama3_(\d+b)\(\)", source)
    extras["flavor"] = flavors[-1].upper() if flavors else None
    extras["fp8"] = "Float8LinearConverter.Config(" in source
    return sections, extras


def _recompute(ac: str | None, values: dict[str, Any], notes: list[str]) -> None:
    text = (ac or "none").lower()
    if "full" in text:
        values["recompute"] = "full"
    elif text.startswith("selective") or "selectiveac" in text:
        option = re.search(r"selective_ac_option['\"]?\s*[:=]\s*['\"]?(\w+)", ac or "")
        if option and option[1].isdigit():
            notes.append(
                f"selective_ac_option {option[1]} (every {option[1]}-th block fully): predicted as full on every block"
            )
            values["recompute"] = "full"
        else:
            values["recompute"] = "selective"
    else:
        values["recompute"] = "none" if text in ("none", "") else "full"


TORCHTITAN_LAYERS = {"tok_embeddings": "embed", "norm": "head", "output": "head", "lm_head": "head"}
"""torchtitan's Llama module names of meshplan's embed and head layers (the final norm and the output
projection together are meshplan's head; 0.2 names it output, 0.3 lm_head); a block keeps its name."""


def stage_layers(parts: list[list[str]]) -> str:
    """--stage-layers of module_fqns_per_model_part: how many of the profile's layers each part holds."""
    return ",".join(str(len({TORCHTITAN_LAYERS.get(fqn, fqn) for fqn in part})) for part in parts)


def read(path: Path, text: str, world: int | None = None, function: str | None = None) -> Imported:
    values: dict[str, Any] = {}
    notes: list[str] = []
    meshplan_header(text, values)
    if world:
        values.setdefault("num_gpus", world)
    if path.suffix.lower() == ".toml":
        data = tomllib.loads(text)
        sections = {"parallelism": data.get("parallelism", {}), "training": data.get("training", {})}
        ac = data.get("activation_checkpoint", {})
        ac_text = ac.get("mode", "none") + (
            f" selective_ac_option={ac['selective_ac_option']}" if "selective_ac_option" in ac else ""
        )
        model = data.get("model", {})
        flavor = model.get("flavor") if model.get("name") == "llama3" else None
        fp8 = any("float8" in c for c in model.get("converters", []))
        compiled = bool(data.get("compile", {}).get("enable")) or bool(sections["training"].get("compile"))
    else:
        sections, extras = _python_sections(text, path, function)
        ac_text, flavor, fp8, compiled = extras.get("ac"), extras["flavor"], extras["fp8"], extras.get("compile", False)
    par, tr = sections["parallelism"], sections["training"]
    launcher = path.parent / "run_torchtitan.sh"
    launch = text + (launcher.read_text() if launcher.is_file() else "")
    nodes, per_node = re.search(r"--nnodes[ =](\d+)", launch), re.search(r"--nproc[-_]per[-_]node[ =](\d+)", launch)
    ngpu = re.search(r"NGPU=(\d+)", launch)
    world = int(nodes[1]) * int(per_node[1]) if nodes and per_node else int(ngpu[1]) if ngpu else values.get("num_gpus")
    tp, pp, cp = (int(par.get(f"{k}_parallel_degree", 1)) for k in ("tensor", "pipeline", "context"))
    dpr, dps = int(par.get("data_parallel_replicate_degree", 1)), int(par.get("data_parallel_shard_degree", -1))
    if dps == -1:  # torchtitan: the ranks left over
        if world is None:
            raise MeshplanError(f"--import {path}: data_parallel_shard_degree -1 needs the world size: give --num-gpus")
        dps = world // (dpr * tp * pp * cp)
    values.update(tp=tp, pp=pp, cp=cp, dp=dpr * dps, num_gpus=world or dpr * dps * tp * pp * cp)
    if dps > 1:
        values["dp_shard"] = dps
    reshard = par.get("fsdp_reshard_after_forward", "default")
    values["zero"] = 0 if dps == 1 else 2 if reshard == "never" or (reshard == "default" and pp > 1) else 3
    values["sequence_parallel"] = tp > 1 and bool(par.get("enable_sequence_parallel", True))
    local = int(tr.get("local_batch_size", 8))
    global_batch = int(tr.get("global_batch_size", -1))
    if global_batch < 0:
        global_batch = local * dpr * dps
    values["global_batch"] = global_batch
    if pp > 1:
        values["microbatch"] = int(par.get("pipeline_parallel_microbatch_size", 1))
        schedule = str(par.get("pipeline_parallel_schedule", "1F1B"))
        values["schedule"] = (
            "interleaved"
            if "Interleaved" in schedule or "Looped" in schedule
            else "1f1b"
            if schedule == "1F1B"
            else "gpipe"
        )
        parts = par.get("module_fqns_per_model_part")
        if values["schedule"] == "interleaved":
            values["virtual_stages"] = len(parts) // pp if parts else 2
        if parts:  # the boundaries torchtitan runs, priced as they are (else its even split: the balanced one)
            values["stage_layers"] = stage_layers(parts)
    else:
        values.update(microbatch=local, schedule="1f1b")
    if "seq_len" in tr:
        values["seq"] = int(tr["seq_len"])
    if tr.get("enable_cpu_offload"):
        values["offload"] = "cpu"
    values["precision"] = "fp8" if fp8 else "fp32" if tr.get("mixed_precision_param") == "float32" else "bf16"
    _recompute(ac_text, values, notes)
    if compiled:
        values["elementwise"] = "compiled"
    if flavor in FLAVORS and "model" not in values:
        values["model"] = "analytic:llama"
        shape = {**FLAVORS[flavor], "seq": values.get("seq", 8192)}
        values["overrides"] = [f"{k}={v}" for k, v in shape.items()]
    values.setdefault("runtime", "torchtitan")
    return Imported(format="torchtitan", values=values, notes=notes)
