"""Valid Plan objects for executor tests, built directly (no planner): `make_plan(pp=2, tp=2, ...)`."""

from __future__ import annotations

from meshplan import dp_methods
from meshplan.executor.model import build_named_model
from meshplan.plan import DataParallelMethods, MethodChoice, Plan


def even_stages(layers: list[str], num_stages: int) -> list[list[str]]:
    """Contiguous, near-equal split of the layer list into `num_stages` stages."""
    base, extra = divmod(len(layers), num_stages)
    stages, start = [], 0
    for s in range(num_stages):
        size = base + (1 if s < extra else 0)
        stages.append(layers[start : start + size])
        start += size
    return stages


def make_plan(
    model: str = "gpt-tiny",
    *,
    pp: int = 1,
    dp: int = 1,
    dp_shard: int = 1,
    tp: int = 1,
    zero: int = 0,
    sp: bool = False,
    schedule: str = "1F1B",
    virtual: int = 1,
    microbatch: int = 2,
    microbatches: int = 1,
    recompute: str | dict | None = None,
    compression: str = "none",
    compression_params: dict | None = None,
    offload: str = "none",
    bucket_mb: int | None = None,
    config: dict | None = None,
    precision: str = "fp32",
    behaviours: dict | None = None,
    validate: bool = True,
) -> Plan:
    """A plan for `model` with the given degrees; dp = dp_replicate, dp_shard for ZeRO-2/3; the
    data-parallel methods by registry name (meshplan/dp_methods.py), parameters defaulted.
    validate=False builds a plan the feasibility rules refuse (for check_plan's tests); `behaviours`
    are runtime_behaviours the executor reads (fsdp_reduce_every_microbatch)."""
    net = build_named_model(model, dict(config or {}), "meta")
    layers = net.layer_names()
    if isinstance(recompute, str):
        recompute = {fqn: recompute for fqn in layers if fqn.startswith("layers.")}
    world = pp * dp * dp_shard * tp
    plan = Plan(
        model_name=model,
        model_config=dict(config or {}),
        cluster_name="local-cpu",
        world_size=world,
        pipeline_parallel_degree=pp,
        data_parallel_replicate_degree=dp,
        data_parallel_shard_degree=dp_shard,
        tensor_parallel_degree=tp,
        zero_stage=zero,
        sequence_parallel=sp,
        precision=precision,
        dp_methods=methods(compression, compression_params, offload, bucket_mb),
        global_batch_size=microbatch * microbatches * dp * dp_shard,
        microbatch_size=microbatch,
        num_microbatches=microbatches,
        seq_len=net.seq_len,
        pipeline_schedule=schedule,
        virtual_stages=virtual,
        layers=layers,
        stages=even_stages(layers, pp * virtual),
        recompute=dict(recompute or {}),
        runtime_behaviours=dict(behaviours or {}),
    )
    if validate:
        plan.validate()
    return plan


def methods(
    compression: str = "none",
    compression_params: dict | None = None,
    offload: str = "none",
    bucket_mb: int | None = None,
) -> DataParallelMethods:
    """DataParallelMethods with every parameter resolved (defaults filled in)."""

    def choice(axis: str, name: str, params: dict | None = None) -> MethodChoice:
        return MethodChoice(name=name, params=dp_methods.method(axis, name).resolve(params or {}, axis))

    schedule = {} if bucket_mb is None else {"bucket_mb": bucket_mb}
    return DataParallelMethods(
        compression=choice("compression", compression, compression_params),
        offload=choice("offload", offload),
        comm_schedule=choice("comm_schedule", "buckets", schedule),
    )


def token_dataset(num_samples: int = 64, vocab: int = 256, seq: int = 32):
    """A user dataset for `--data executor_plans:token_dataset`: (inputs, next-token targets)."""
    import torch

    tokens = torch.randint(0, vocab, (num_samples, seq + 1), generator=torch.Generator().manual_seed(7))
    return [(row[:-1], row[1:]) for row in tokens]
