"""Replica synchronisation methods, measured vs predicted against DDP (issue #16).

    python -m benchmarks.slow_link --rate 1gbit -- python -m benchmarks.sync_methods [--steps 12] [--out F.json]
    python -m benchmarks.sync_methods              # the same on the plain loopback

gpt-tiny on 4 gloo ranks, SGD + momentum, a fixed 64-sample token dataset: for DDP and every sync
method, the median step time (after the first two steps) and the loss after --steps steps, beside
the cost model's step time and bytes per step (estimate() on the local-cpu preset at the same
degrees; it does not know the slow link's rate, so read the predicted column as ratios); then
master aggregation against DDP at 2, 3 and 4 ranks, and the model's prediction of both for
gpt-tiny replicas on 8 to 1024 A100s (a100-80g preset).
Bounded: one launch per world size, --timeout-s per launch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from meshplan import dp_methods
from meshplan.plan import MethodChoice

METHODS = [
    ("allreduce", {}),
    ("master", {}),
    ("local-sgd", {"period": 4}),
    ("local-sgd", {"period": 4, "group_size": 2, "group_period": 2}),
    ("crossbow", {"learners": 2}),
    ("dabmd", {}),
    ("gossip", {}),
    ("gossip", {"low_precision": True}),
    ("async", {}),
]


def _plan(name, params, n):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from executor_plans import make_plan

    plan = make_plan(dp=n, microbatch=1, microbatches=4)
    plan.dp_methods.sync = MethodChoice(name=name, params=dp_methods.method("sync", name).resolve(params, "sync"))
    plan.validate()
    return plan


def _predict(plan) -> tuple[float, dict]:
    from meshplan.planner import PlanRequest, estimate
    from meshplan.presets import local_cpu
    from meshplan.profiler import profile_model

    profile = profile_model("gpt-tiny", {}, device="meta")
    c = plan.dp_methods.sync
    req = PlanRequest(
        num_gpus=plan.world_size,
        global_batch=plan.global_batch_size,
        precision="fp32",
        dp=plan.world_size,
        tp=1,
        pp=1,
        microbatch=1,
        zero=0,
        methods={"sync": (c.name, dict(c.params))},
    )
    pred = estimate(profile, local_cpu(plan.world_size), req).prediction
    return pred.step_time_s, pred.comm_bytes_per_step


def _run(plans, steps, timeout_s):
    from meshplan.executor.launch import LaunchOptions, run_plans

    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
    with tempfile.TemporaryDirectory() as out:
        return run_plans(
            plans,
            LaunchOptions(
                steps=steps,
                out_dir=out,
                quiet=True,
                timeout_s=timeout_s,
                optimizer="sgd",
                lr=0.2,
                grad_clip=0.0,
                data="executor_plans:token_dataset",
                env={"PYTHONPATH": tests},
            ),
        )


def _label(name, params) -> str:
    return name + "".join(f":{k}={v}" for k, v in params.items())


def methods_table(steps: int, timeout_s: float) -> list[dict]:
    plans = [_plan(n, p, 4) for n, p in METHODS]
    rows = []
    for (name, params), plan, result in zip(METHODS, plans, _run(plans, steps, timeout_s)):
        pred_s, pred_bytes = _predict(plan)
        rows.append(
            {
                "method": _label(name, params),
                "measured_step_s": statistics.median(result.step_times_s[2:]),
                "predicted_step_s": pred_s,
                "measured_bytes": result.comm_bytes_per_step,
                "predicted_bytes": pred_bytes,
                "loss_last": result.losses[-1],
            }
        )
    return rows


def master_scaling(steps: int, timeout_s: float) -> list[dict]:
    rows = []
    for n in (2, 3, 4):
        plans = [_plan("allreduce", {}, n), _plan("master", {}, n)]
        ddp, master = _run(plans, steps, timeout_s)
        rows.append(
            {
                "workers": n,
                "ddp_step_s": statistics.median(ddp.step_times_s[2:]),
                "master_step_s": statistics.median(master.step_times_s[2:]),
                "predicted_ddp_s": _predict(plans[0])[0],
                "predicted_master_s": _predict(plans[1])[0],
            }
        )
    return rows


def master_prediction_to_1024() -> list[dict]:
    """The model's DDP vs master step time for gpt-tiny replicas on A100 nodes, 8 to 1024 GPUs."""
    from meshplan.planner import PlanRequest, estimate
    from meshplan.presets import cluster_preset
    from meshplan.profiler import profile_model

    profile = profile_model("gpt-tiny", {}, device="meta")
    rows = []
    for n in (8, 64, 256, 1024):
        out = {"workers": n}
        for sync in ("allreduce", "master"):
            req = PlanRequest(
                num_gpus=n,
                global_batch=8 * n,
                precision="bf16",
                dp=n,
                tp=1,
                pp=1,
                microbatch=8,
                zero=0,
                methods={"sync": (sync, dp_methods.defaults_of("sync", sync))},
            )
            out[f"{sync}_s"] = estimate(profile, cluster_preset("a100-80g", n), req).prediction.step_time_s
        rows.append(out)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sync_methods")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--timeout-s", type=float, default=300)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    result = {
        "methods": methods_table(args.steps, args.timeout_s),
        "master_scaling": master_scaling(args.steps, args.timeout_s),
    }
    try:
        result["master_prediction"] = master_prediction_to_1024()
    except Exception as exc:  # a preset name this checkout does not have
        result["master_prediction_error"] = str(exc)
    text = json.dumps(result, indent=1)
    if args.out:
        open(args.out, "w").write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
