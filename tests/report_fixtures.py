"""Hand-built Plans with full Prediction / SearchSummary for the report and export tests.

Numbers are made up but self-consistent (degrees multiply to the world size, global batch =
micro x accumulation x dp, stage memory totals are the sum of their parts).
"""

from __future__ import annotations

import dataclasses

from meshplan import dp_methods
from meshplan.plan import (
    DataParallelMethods,
    MethodChoice,
    Plan,
    Prediction,
    Provenance,
    Rejection,
    SearchSummary,
    StageMemory,
)
from meshplan.run_result import RunResult
from meshplan.schema import content_hash

GIB = 1024**3


def gpt_layers(num_blocks: int) -> list[str]:
    return ["embed"] + [f"layers.{i}" for i in range(num_blocks)] + ["head"]


def split(layers: list[str], sizes: list[int]) -> list[list[str]]:
    out, start = [], 0
    for size in sizes:
        out.append(layers[start : start + size])
        start += size
    assert start == len(layers)
    return out


def stage_memory(pp: int, capacity_bytes: float, act_gib: float = 20.0) -> list[StageMemory]:
    rows = []
    for s in range(pp):
        parts = dict(
            params_bytes=2.0 * GIB,
            grads_bytes=2.0 * GIB,
            optimizer_bytes=6.0 * GIB,
            activations_bytes=act_gib * GIB * (pp - s) / pp,
            buffers_bytes=1.5 * GIB,
        )
        rows.append(StageMemory(stage=s, **parts, total_bytes=sum(parts.values()), capacity_bytes=capacity_bytes))
    return rows


def prediction(
    step_s: float,
    pp: int,
    m: int,
    capacity_bytes: float = 80e9,
    act_gib: float = 20.0,
    binding: str = "memory on stage 0 (activations of 4 in-flight microbatches)",
) -> Prediction:
    breakdown = {
        "compute": 0.70 * step_s,
        "recompute": 0.10 * step_s,
        "bubble": 0.08 * step_s,
        "tp_comm": 0.05 * step_s,
        "pp_comm": 0.02 * step_s,
        "dp_comm": 0.03 * step_s,
        "optimizer": 0.02 * step_s,
    }
    mem = stage_memory(pp, capacity_bytes, act_gib)
    per_mb_s = (breakdown["compute"] + breakdown["recompute"] + breakdown["tp_comm"]) / m
    return Prediction(
        step_time_s=step_s,
        breakdown=breakdown,
        stage_memory=mem,
        peak_memory_bytes=max(x.total_bytes for x in mem),
        mfu=0.412,
        hfu=0.463,
        model_tflops_per_gpu=128.5,
        hardware_tflops_per_gpu=144.4,
        tokens_per_s_per_gpu=512.25,
        binding_constraint=binding,
        stage_times_s=[per_mb_s * (1.0 + 0.05 * s) for s in range(pp)],
    )


def gpt_plan(
    *,
    pp: int = 4,
    dp_replicate: int = 2,
    dp_shard: int = 1,
    tp: int = 2,
    micro: int = 2,
    num_microbatches: int = 8,
    schedule: str = "1F1B",
    virtual: int = 1,
    zero: int = 1,
    blocks: int = 8,
    step_s: float = 2.5,
    recompute: str = "selective",
) -> Plan:
    """A GPT pipeline plan without search summary (an alternative)."""
    return _finish(
        _gpt_plan(
            pp=pp,
            dp_replicate=dp_replicate,
            dp_shard=dp_shard,
            tp=tp,
            micro=micro,
            num_microbatches=num_microbatches,
            schedule=schedule,
            virtual=virtual,
            zero=zero,
            blocks=blocks,
            step_s=step_s,
            recompute=recompute,
        )
    )


def _gpt_plan(
    *, pp, dp_replicate, dp_shard, tp, micro, num_microbatches, schedule, virtual, zero, blocks, step_s, recompute
) -> Plan:
    layers = gpt_layers(blocks)
    n_stages = pp * virtual
    base, extra = divmod(len(layers), n_stages)
    sizes = [base + (1 if i < extra else 0) for i in range(n_stages)]
    world = pp * dp_replicate * dp_shard * tp
    return Plan(
        model_name="gpt-test",
        model_config={"layers": blocks, "hidden": 1024, "heads": 16},
        cluster_name="a100-80g",
        world_size=world,
        pipeline_parallel_degree=pp,
        data_parallel_replicate_degree=dp_replicate,
        data_parallel_shard_degree=dp_shard,
        tensor_parallel_degree=tp,
        zero_stage=zero,
        sequence_parallel=tp > 1,
        global_batch_size=micro * num_microbatches * dp_replicate * dp_shard,
        microbatch_size=micro,
        num_microbatches=num_microbatches,
        seq_len=2048,
        pipeline_schedule=schedule,
        virtual_stages=virtual,
        layers=layers,
        stages=split(layers, sizes),
        recompute={f: recompute for f in layers if f.startswith("layers.")} if recompute != "none" else {},
        prediction=prediction(step_s, pp, num_microbatches, act_gib=10.0 + 5.0 * micro / (1 + zero)),
        provenance=Provenance(
            profile_hash="0123456789abcdef", cluster_hash="fedcba9876543210", meshplan_version="0.1.0"
        ),
    )


def _finish(plan: Plan) -> Plan:
    """Throughput and FLOPs consistent with the step time (tokens per step / step time / GPUs)."""
    pred = plan.prediction
    tokens = plan.global_batch_size * plan.seq_len
    pred.tokens_per_s_per_gpu = tokens / pred.step_time_s / plan.world_size
    pred.model_tflops_per_gpu = pred.tokens_per_s_per_gpu * 6 * 350e6 / 1e12
    pred.mfu = pred.model_tflops_per_gpu / 312
    pred.hfu = pred.mfu * 8 / 6
    return plan


def searched_plan(**kwargs) -> Plan:
    """The best plan with three alternatives and rejected families."""
    plan = gpt_plan(**kwargs)
    alts = [
        gpt_plan(pp=4, dp_replicate=1, dp_shard=2, tp=2, zero=3, step_s=2.8),
        gpt_plan(pp=2, dp_replicate=4, tp=2, num_microbatches=4, micro=4, step_s=3.1, recompute="full"),
        gpt_plan(pp=4, dp_replicate=2, tp=2, schedule="GPipe", step_s=3.3),
    ]
    rejected = [
        Rejection(family="tp=32", reason="tp=32 exceeds 8 devices per node", count=12),
        Rejection(family="pp=1 tp=2 zero=0", reason="OOM by 12.3 GiB on stage 0", count=40),
        Rejection(family="microbatch=16", reason="heads 16 not divisible by tp=32", count=3),
    ]
    plan.search = SearchSummary(
        search_time_s=0.123,
        num_candidates=480,
        num_evaluated=200,
        num_rejected=55,
        alternatives=alts,
        rejected=rejected,
    )
    return plan


def flat_plan() -> Plan:
    """No pipeline: FSDP (ZeRO-3) over 8 ranks with CPU offload (fp16 compression needs ZeRO-0/1)."""
    plan = gpt_plan(pp=1, dp_replicate=1, dp_shard=8, tp=1, zero=3, micro=4, num_microbatches=2, recompute="full")
    return dataclasses.replace(plan, dp_methods=dp_choice(offload="cpu"))


def uneven_plan() -> Plan:
    """Interleaved 1F1B with uneven stages and mixed per-layer recompute."""
    plan = gpt_plan(
        pp=2,
        dp_replicate=2,
        tp=2,
        num_microbatches=4,
        schedule="Interleaved1F1B",
        virtual=2,
        blocks=12,
        recompute="none",
    )
    layers = plan.layers
    plan.stages = split(layers, [5, 3, 3, 3])
    plan.recompute = {"layers.0": "full", "layers.5": "selective", "layers.6": "full"}
    # PowerSGD needs DDP, which holds no TP parameters: an export-only plan (not runnable, and
    # Plan.validate refuses it), kept to test that every export says what it cannot express
    plan.dp_methods = dp_choice(compression="powersgd")
    return plan


def dp_choice(**names: str) -> DataParallelMethods:
    """DataParallelMethods with the given method per axis, parameters at their defaults."""
    out = DataParallelMethods()
    for axis, name in names.items():
        setattr(out, axis, MethodChoice(name=name, params=dp_methods.method(axis, name).resolve({}, axis)))
    return out


def run_for(plan: Plan, steps: int = 6) -> RunResult:
    pred = plan.prediction
    losses = [5.6 - 0.31 * i + 0.02 * (i % 2) for i in range(steps)]
    return RunResult(
        plan_hash=content_hash(plan),
        world_size=plan.world_size,
        steps=steps,
        losses=losses,
        step_time_s=pred.step_time_s * 1.18,
        step_times_s=[pred.step_time_s * (1.5 if i == 0 else 1.18) for i in range(steps)],
        tokens_per_s=plan.global_batch_size * plan.seq_len / (pred.step_time_s * 1.18),
        peak_memory_bytes=int(pred.peak_memory_bytes * 0.93),
        peak_memory_per_rank_bytes=[int(pred.peak_memory_bytes * 0.93)] * plan.world_size,
        device="cpu",
        backend="gloo",
        torch_version="2.13.0",
    )
