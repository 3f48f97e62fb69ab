"""What Megatron-LM's own argument checks (megatron/training/arguments.py validate_args at core_v0.16.1,
which is not on the package index) require of an exported megatron_args.sh, restated from that code:
each function raises AssertionError with Megatron's message when the export breaks the rule."""

from __future__ import annotations

import re
import shlex


def parse_script(text: str) -> tuple[dict[str, str | bool], dict[str, str]]:
    """(flags, environment) of an exported megatron_args.sh: MESHPLAN_ARGS=( ... ) and its export/unset lines."""
    body = text.split("MESHPLAN_ARGS=(", 1)[1].split("\n)", 1)[0]
    tokens = shlex.split(body)
    args: dict[str, str | bool] = {}
    for i, tok in enumerate(tokens):
        if tok.startswith("--"):
            nxt = tokens[i + 1] if i + 1 < len(tokens) else "--"
            args[tok] = True if nxt.startswith("--") else nxt
    env = dict(re.findall(r"^export (\w+)=(\S+)", text, re.M))
    return args, env


def _int(args: dict, flag: str, default: int | None = None) -> int | None:
    return int(args[flag]) if flag in args else default


def virtual_stages(args: dict) -> int | None:
    """args.virtual_pipeline_model_parallel_size as validate_args derives it (None: not interleaved)."""
    pp = _int(args, "--pipeline-model-parallel-size", 1)
    given = [f for f in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                         "--pipeline-model-parallel-layout") if f in args]  # fmt: skip
    assert len(given) <= 1, "No more than one of the following arguments can be set at the same time: " + ", ".join(
        given
    )
    if "--pipeline-model-parallel-layout" in args:
        stages = len(str(args["--pipeline-model-parallel-layout"]).split("|"))
        assert stages % pp == 0, "The length of pipeline_model_parallel_layout must be divisible by pp"
        v = stages // pp
    elif "--num-virtual-stages-per-pipeline-rank" in args:
        v = _int(args, "--num-virtual-stages-per-pipeline-rank")
    elif "--num-layers-per-virtual-pipeline-stage" in args:
        assert "--decoder-first-pipeline-num-layers" not in args and "--decoder-last-pipeline-num-layers" not in args
        layers = (
            _int(args, "--num-layers")
            + ("--account-for-embedding-in-pipeline-split" in args)
            + ("--account-for-loss-in-pipeline-split" in args)
        )
        assert layers % pp == 0, "number of layers of the model must be divisible pipeline model parallel size"
        per = _int(args, "--num-layers-per-virtual-pipeline-stage")
        assert (layers // pp) % per == 0, (
            "number of layers per pipeline stage must be divisible number of layers per virtual pipeline stage"
        )
        v = layers // pp // per
    else:
        return None
    if v is not None and v > 1:
        # overlap_p2p_comm is on by default (--no-overlap-p2p-communication turns it off)
        assert pp > (2 if "--no-overlap-p2p-communication" in args else 1), "interleaved schedule needs pp > 1"
    return v if v and v > 1 else None


def fsdp2(args: dict, env: dict) -> None:
    """--use-torch-fsdp2's requirements."""
    if "--use-torch-fsdp2" not in args:
        return
    assert _int(args, "--pipeline-model-parallel-size", 1) == 1, (
        "--use-torch-fsdp2 is not supported with pipeline parallelism"
    )
    assert "--use-distributed-optimizer" not in args, (
        "--use-torch-fsdp2 is not supported with MCore's distributed optimizer"
    )
    assert "--no-gradient-accumulation-fusion" in args, (
        "--use-torch-fsdp2 is not supported with gradient accumulation fusion"
    )
    assert args.get("--ckpt-format", "torch_dist") in ("torch_dist", "torch_dcp"), (
        "--use-torch-fsdp2 requires --ckpt-format torch_dist or torch_dcp"
    )
    assert "--untie-embeddings-and-output-weights" in args, (
        "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights"
    )
    assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1", (
        "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one"
    )


def device_connections(args: dict, env: dict) -> None:
    """Before Blackwell, tensor or context parallelism without FSDP needs CUDA_DEVICE_MAX_CONNECTIONS=1."""
    parallel = _int(args, "--tensor-model-parallel-size", 1) > 1 or _int(args, "--context-parallel-size", 1) > 1
    if parallel and "--use-torch-fsdp2" not in args:
        assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1", (
            "Using tensor model parallelism or context parallelism require setting the environment variable "
            "CUDA_DEVICE_MAX_CONNECTIONS to 1"
        )


def batch(args: dict, world_size: int) -> int:
    """Megatron's gradient accumulation: global / (micro x dp), dp = world / (tp x pp x cp); must divide."""
    tp, pp = _int(args, "--tensor-model-parallel-size", 1), _int(args, "--pipeline-model-parallel-size", 1)
    dp = world_size // (tp * pp * _int(args, "--context-parallel-size", 1))
    micro, global_batch = _int(args, "--micro-batch-size"), _int(args, "--global-batch-size")
    assert global_batch % (micro * dp) == 0, (
        f"global batch size ({global_batch}) is not divisible by micro batch size ({micro}) times data parallel size ({dp})"
    )
    return global_batch // (micro * dp)


def overlap_param_gather(args: dict) -> None:
    if "--overlap-param-gather" in args:
        assert "--use-distributed-optimizer" in args, (
            "--overlap-param-gather only supported with distributed optimizer or megatron fsdp"
        )
        assert "--overlap-grad-reduce" in args, "Must use --overlap-param-gather with --overlap-grad-reduce"


def validate(text: str, world_size: int) -> dict:
    """Every rule above; what Megatron derives (virtual stages, accumulation)."""
    args, env = parse_script(text)
    fsdp2(args, env)
    device_connections(args, env)
    overlap_param_gather(args)
    return {
        "virtual_stages": virtual_stages(args) or 1,
        "accumulation": batch(args, world_size),
        "args": args,
        "env": env,
    }
