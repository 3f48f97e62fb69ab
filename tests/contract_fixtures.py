"""Hand-built valid contracts for the contract and CLI tests."""

from __future__ import annotations

from meshplan.model_profile import LayerProfile, ModelProfile, TPRule
from meshplan.plan import Plan, Prediction, Rejection, SearchSummary, StageMemory
from meshplan.presets import cluster_preset

LAYERS = ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"]


def make_plan(**overrides) -> Plan:
    fields = dict(
        model_name="gpt-tiny",
        cluster_name="local-cpu",
        world_size=4,
        pipeline_parallel_degree=2,
        data_parallel_replicate_degree=2,
        tensor_parallel_degree=1,
        global_batch_size=16,
        microbatch_size=2,
        num_microbatches=4,
        seq_len=32,
        pipeline_schedule="1F1B",
        layers=list(LAYERS),
        stages=[LAYERS[:3], LAYERS[3:]],
        recompute={"layers.0": "full"},
        precision="fp32",
        prediction=Prediction(
            step_time_s=0.5,
            breakdown={"compute": 0.4, "bubble": 0.1},
            stage_memory=[
                StageMemory(
                    stage=0,
                    params_bytes=1e6,
                    grads_bytes=1e6,
                    optimizer_bytes=2e6,
                    activations_bytes=3e6,
                    buffers_bytes=1e5,
                    total_bytes=7.1e6,
                    capacity_bytes=4e9,
                )
            ],
            peak_memory_bytes=7.1e6,
            mfu=0.1,
            hfu=0.12,
        ),
    )
    fields.update(overrides)
    return Plan(**fields)


def make_searched_plan() -> Plan:
    plan = make_plan()
    plan.search = SearchSummary(
        search_time_s=0.01,
        num_candidates=10,
        num_evaluated=8,
        num_rejected=2,
        alternatives=[
            make_plan(
                pipeline_parallel_degree=1, data_parallel_replicate_degree=4, num_microbatches=2, stages=[list(LAYERS)]
            )
        ],
        rejected=[Rejection(family="tp=8", reason="heads 4 not divisible by 8")],
    )
    return plan


def make_profile() -> ModelProfile:
    layers = [
        LayerProfile(
            name=name,
            kind="block" if name.startswith("layers") else name,
            num_params=1000,
            param_bytes={"float32": 4000},
            forward_flops=1e6,
            backward_flops=2e6,
            activation_bytes=1e4,
            input_bytes=256,
            output_bytes=256,
            tp=TPRule(column=["attn.wq"], row=["attn.wo"], divisors={"heads": 4}),
        )
        for name in LAYERS
    ]
    return ModelProfile(
        model_name="gpt-tiny",
        seq_len=32,
        num_params=6000,
        forward_flops_per_sample=6e6,
        num_layers=4,
        hidden=64,
        heads=4,
        vocab=256,
        layers=layers,
    )


def make_cluster():
    return cluster_preset("a100-80g", 16)
