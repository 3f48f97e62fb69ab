"""A Megatron-LM argument script (pretrain_gpt.py flags, megatron/training/arguments.py names) read back."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.imports.common import Imported, degrees, meshplan_header

SIGNS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size", "--num-layers")


def recognises(path: Path, text: str) -> bool:
    return sum(flag in text for flag in SIGNS) >= 2


ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=([^(\s].*|)$")
REFERENCE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)")
ARITHMETIC = re.compile(r"\$\(\(([\d\s+*/()-]+)\)\)")


def expand(text: str) -> str:
    """The script with its plain shell variables substituted, as launch scripts write them (GPUS_PER_NODE=8,
    TP=${TP:-2}, WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES)), then --nnodes $NUM_NODES ...): each assignment in
    order, a reference to an unset variable takes its default or stays as written."""
    known: dict[str, str] = {}

    def sub(line: str) -> str:
        def one(m: re.Match) -> str:
            name = m[1] or m[3]
            return known.get(name, m[2] if m[2] is not None else m[0])

        return ARITHMETIC.sub(arithmetic, REFERENCE.sub(one, line))

    def arithmetic(m: re.Match) -> str:  # integers and + - * / ( ) only (ARITHMETIC); no powers
        if "**" in m[1]:
            return m[0]
        try:
            return str(int(eval(m[1], {"__builtins__": {}})))
        except (ArithmeticError, SyntaxError):
            return m[0]

    out = []
    for line in text.splitlines():
        line = sub(line)
        hit = ASSIGNMENT.match(line)
        if hit:
            value = hit[2].split(" #", 1)[0].strip()
            known[hit[1]] = shlex.split(value)[0] if value and value[0] in "'\"" else value
        out.append(line)
    return "\n".join(out)


def flags(text: str) -> dict[str, str | bool]:
    """Every --flag [value] in the script (continuation lines joined, comments dropped)."""
    body = re.sub(r"\\\n", " ", text)
    tokens: list[str] = []
    for line in body.splitlines():
        line = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        try:
            words = shlex.split(line.replace("(", " ").replace(")", " "))
        except ValueError:
            continue
        for word in words:  # "--fp8-format hybrid" quoted as one array element is a flag and its value
            tokens += word.split() if word.startswith("--") else [word]
    out: dict[str, str | bool] = {}
    for i, tok in enumerate(tokens):
        if tok.startswith("--"):
            name, eq, value = tok.partition("=")
            nxt = tokens[i + 1] if i + 1 < len(tokens) else "--"
            out[name] = value if eq else (True if nxt.startswith("--") or nxt.startswith("$") else nxt)
    return out


def _int(args: dict, flag: str, default: int | None = None) -> int | None:
    value = args.get(flag)
    if value is None or value is True:
        return default
    try:
        return int(str(value))
    except ValueError as exc:
        raise MeshplanError(f"--import: {flag} {value!r} is not a number (shell variables cannot be read)") from exc


def _virtual(args: dict, pp: int) -> int:
    if "--num-virtual-stages-per-pipeline-rank" in args:
        return _int(args, "--num-virtual-stages-per-pipeline-rank", 1) or 1
    if "--pipeline-model-parallel-layout" in args:
        return max(1, len(str(args["--pipeline-model-parallel-layout"]).split("|")) // pp)
    if "--num-layers-per-virtual-pipeline-stage" in args:  # arguments.py: layers / pp / per stage
        return (
            (_int(args, "--num-layers", 1) or 1)
            // pp
            // (_int(args, "--num-layers-per-virtual-pipeline-stage", 1) or 1)
        )
    return 1


def _model(args: dict, values: dict[str, Any]) -> None:
    layers, hidden, heads = (_int(args, f) for f in ("--num-layers", "--hidden-size", "--num-attention-heads"))
    if values.get("model") or layers is None or hidden is None or heads is None:
        return
    shape: dict[str, Any] = {"layers": layers, "hidden": hidden, "heads": heads}
    for key, flag in (("vocab", "--vocab-size"), ("seq", "--seq-length"), ("ffn_hidden", "--ffn-hidden-size")):
        if flag in args:
            shape[key] = _int(args, flag)
    llama = "--swiglu" in args or args.get("--normalization") == "RMSNorm"
    if llama:
        shape["kv_heads"] = _int(args, "--num-query-groups", heads) if "--group-query-attention" in args else heads
        shape.setdefault("ffn_hidden", 4 * hidden)
    values["model"] = "analytic:llama" if llama else "analytic:gpt"
    values["overrides"] = [f"{k}={v}" for k, v in shape.items()]


def _stage_layers(args: dict, pp: int, v: int, notes: list[str]) -> str | None:
    """--stage-layers of Megatron's uneven pipeline flags (the profile's layers per stage, the embedding
    and the head one each): --pipeline-model-parallel-layout ("Et*3|t*4|...|t*3L"), the decoder's first
    and last stage counts, or embedding and loss counted in an even split; None: blocks split evenly."""
    blocks = _int(args, "--num-layers")
    if pp <= 1 or blocks is None:
        return None
    layout = args.get("--pipeline-model-parallel-layout")
    if isinstance(layout, str):
        counts = []
        for part in layout.split("|"):
            hit = re.fullmatch(r"(E?)(?:t(?:\*(\d+))?)?(L?)", part.strip())
            if hit is None:
                notes.append(
                    f"--pipeline-model-parallel-layout {layout}: beyond E, t*N and L; predicted as an even split"
                )
                return None
            block_count = int(hit[2]) if hit[2] else (1 if "t" in part else 0)
            counts.append(bool(hit[1]) + block_count + bool(hit[3]))
        return ",".join(map(str, counts))
    if "--account-for-embedding-in-pipeline-split" in args and "--account-for-loss-in-pipeline-split" in args:
        stages, total = pp * v, blocks + 2
        return ",".join([str(total // stages)] * stages) if total % stages == 0 else None
    first, last = _int(args, "--decoder-first-pipeline-num-layers"), _int(args, "--decoder-last-pipeline-num-layers")
    if v > 1 or (first is None and last is None):
        return None
    middle_stages = pp - (first is not None) - (last is not None)
    rest = blocks - (first or 0) - (last or 0)
    if middle_stages < 0 or (middle_stages and rest % middle_stages) or (not middle_stages and rest):
        return None  # Megatron refuses it (arguments.py); priced as an even split
    counts = [rest // middle_stages] * middle_stages if middle_stages else []
    counts = ([first] if first is not None else []) + counts + ([last] if last is not None else [])
    counts[0] += 1  # the embedding
    counts[-1] += 1  # the head
    return ",".join(map(str, counts))


def read(path: Path, text: str, world: int | None = None) -> Imported:
    text = expand(text)
    args = flags(text)
    values: dict[str, Any] = {}
    notes: list[str] = []
    meshplan_header(text, values)
    if world:
        values.setdefault("num_gpus", world)
    tp, pp, cp = (
        _int(args, f, 1) or 1
        for f in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size")
    )
    values.update(tp=tp, pp=pp, cp=cp)
    v = _virtual(args, pp)
    values["schedule"] = "interleaved" if v > 1 else "1f1b"
    if v > 1:
        values["virtual_stages"] = v
    stage_layers = _stage_layers(args, pp, v, notes)
    if stage_layers:
        values["stage_layers"] = stage_layers
    values["sequence_parallel"] = "--sequence-parallel" in args and tp > 1
    micro, global_batch = _int(args, "--micro-batch-size", 1), _int(args, "--global-batch-size")
    values["microbatch"] = micro
    if global_batch:
        values["global_batch"] = global_batch
    if "--seq-length" in args:
        values["seq"] = _int(args, "--seq-length")
    nodes = re.search(r"--nnodes[ =](\d+)", text)
    per_node = re.search(r"--nproc[-_]per[-_]node[ =](\d+)", text)
    launched = int(nodes[1]) * int(per_node[1]) if nodes and per_node else None
    world = world or launched or values.get("num_gpus")  # --num-gpus, else the launch line, else the header
    if world is None:
        raise MeshplanError(
            f"--import {path}: no world size (a torchrun line with numeric --nnodes and --nproc-per-node): give --num-gpus"
        )
    values["num_gpus"] = world
    degrees(values, world, str(path))
    granularity = args.get("--recompute-granularity")
    values["recompute"] = {"selective": "selective", "full": "full"}.get(str(granularity), "none")
    if granularity == "full":
        method = args.get("--recompute-method", "uniform")
        if method == "uniform":
            values["recompute_num_layers"] = _int(args, "--recompute-num-layers", 1)
        elif method == "block":  # the first N blocks of each pipeline stage (model chunk), none on the rest
            values["recompute_blocks"] = _int(args, "--recompute-num-layers", 1)
        else:
            notes.append(f"--recompute-method {method}: predicted as full recompute of every block")
    if "--use-torch-fsdp2" in args:
        values["zero"] = 3
        if "dp" in values:
            values["dp_shard"] = values["dp"]
    else:
        values["zero"] = 1 if "--use-distributed-optimizer" in args else 0
        instances = _int(args, "--num-distributed-optimizer-instances", 1) or 1
        if values["zero"] and instances > 1:
            notes.append(
                f"--num-distributed-optimizer-instances {instances} (optimizer states sharded within each of {instances} "
                "data-parallel subgroups): meshplan's ZeRO-1 shards over the whole group; predicted that way"
            )
    if "--optimizer-cpu-offload" in args:
        values["offload"] = "cpu"
    values["precision"] = (
        "fp8" if "--fp8-format" in args else "bf16" if "--bf16" in args or "--fp16" in args else "fp32"
    )
    if "--fp16" in args:
        notes.append("--fp16: predicted as bf16 (the same bytes and tensor-core rate)")
    values.setdefault("runtime", "megatron-core")
    _model(args, values)
    return Imported(format="megatron", values=values, notes=notes)
