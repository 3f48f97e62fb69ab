"""Replica synchronisation methods, measured vs predicted against DDP.

    python -m benchmarks.sync_methods [--rate 1gbit] [--steps 13] [--out F.json] [--markdown]
    from benchmarks import sync_methods as s; print(s.markdown(s.run_bench(steps=13, rate="1gbit")))

gpt-tiny on 4 gloo ranks, SGD + momentum (lr 0.2, no clipping), 4 microbatches of 1 sample per
rank, the fixed 64-sample token dataset (tests/executor_plans.py). Inside a fresh slow-link
namespace of --rate (benchmarks/slow_link.py; "none" = the plain loopback) the links are
measured (`meshplan profile-links --nproc 4`), then DDP and every sync method run in one 4-rank
launch, DDP and master in one 2-rank and one 3-rank launch. Outside, gpt-tiny is profiled on
this CPU as each launch's ranks share it (microbatch 1; 4, 3 and 2 ranks: RANKS_SHARE), once right
before the launches and once right after (the host's load moves over the minutes they take), and each run is
predicted by estimate() on the ClusterSpec measured in the namespace with each CPU profile, the
mean of the two, so prediction and measurement see the same wire and the CPU under the load the
runs saw (`predict` re-prices a saved `block`). Per method: median step time after the first two steps, the
prediction, both as a ratio to DDP's, counted and predicted bytes per step and rank, the loss
after --steps steps and its ratio to DDP's. Master aggregation against DDP at 2, 3 and 4 ranks
(the 4-rank rows are the methods launch's). Then the model's prediction of both for gpt-tiny
replicas on 8 to 1024 A100s (the a100-80g preset: NVLink in a node, InfiniBand across).
Bounded: --timeout-s for the namespace (profile-links + three launches).
Entry points: `run_bench(steps, rate) -> dict`, `markdown(result) -> str`, and
`bench_section(quick, say)` for benchmarks/run.py (quick: the plain loopback, 5 steps).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from benchmarks.common import run_at_rate
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
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
SCALING = (2, 3)
RANKS_SHARE = "each launch priced with profiles timed as its own number of ranks share the CPU"
"""The 2- and 3-rank launches of master against DDP share the 2 cores differently from the 4-rank
one (2 ranks: a core each; 4: half a core each); a profile timed with 3 busy neighbours priced
their layers twice as slow as they ran (DDP at 2 workers 28.9 ms measured, 65.5 predicted)."""
"""Worker counts of the extra DDP / master launches (4 is the methods launch)."""
TO_1024 = (8, 64, 256, 1024)


def _label(name, params) -> str:
    return name + "".join(f":{k}={v}" for k, v in params.items())


def _plan(name, params, n):
    sys.path.insert(0, TESTS)
    from executor_plans import make_plan

    plan = make_plan(dp=n, microbatch=1, microbatches=4)
    plan.dp_methods.sync = MethodChoice(name=name, params=dp_methods.method("sync", name).resolve(params, "sync"))
    plan.validate()
    return plan


def _predict(plan, cluster, profile) -> tuple[float, dict]:
    from meshplan.planner import PlanRequest, estimate

    c = plan.dp_methods.sync
    req = PlanRequest(
        num_gpus=plan.world_size,
        global_batch=plan.global_batch_size,
        precision="fp32",
        dp=plan.world_size,
        tp=1,
        pp=1,
        microbatch=plan.microbatch_size,
        zero=0,
        methods={"sync": (c.name, dict(c.params))},
    )
    pred = estimate(profile, cluster, req).prediction
    return pred.step_time_s, pred.comm_bytes_per_step


def _launch(plans, steps: int, timeout_s: float, out: str):
    from meshplan.executor.launch import LaunchOptions, run_plans

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
            env={"PYTHONPATH": TESTS, "OMP_NUM_THREADS": "1"},
        ),
    )


def _measured(name: str, params: dict, n: int, result) -> dict:
    return {
        "method": _label(name, params),
        "name": name,
        "params": params,
        "workers": n,
        "measured_step_s": statistics.median(result.step_times_s[2:]),
        "measured_bytes": result.comm_bytes_per_step.get("dp_replicate", 0),
        "loss_last": result.losses[-1],
    }


def _merge(runs: list[list[dict]]) -> list[dict]:
    """One row per plan from the interleaved repeats: the median of the repeats' median step times
    (each repeat's value kept), bytes and loss from the first (they do not depend on the host)."""
    out = []
    for rows in zip(*runs):
        row = dict(rows[0])
        row["measured_step_s_repeats"] = [r["measured_step_s"] for r in rows]
        row["measured_step_s"] = statistics.median(row["measured_step_s_repeats"])
        out.append(row)
    return out


def inner(rate: str, steps: int, timeout_s: float, repeats: int = 1) -> dict:
    """Inside the namespace (or on the plain loopback): the links, then the three launches,
    `repeats` times in turn (interleaved: every plan once per repeat); measurements only
    (predicted afterwards, outside: `predict`)."""
    from benchmarks.compression_slow_link import _profile_links

    start = time.perf_counter()
    share = timeout_s / (2 * repeats)
    runs: list[list[dict]] = []
    scaling_runs: list[list[list[dict]]] = [[] for _ in SCALING]
    with tempfile.TemporaryDirectory() as tmp:
        links = os.path.join(tmp, "links.json")
        _profile_links(links, rate, timeout_s)
        links_s = time.perf_counter() - start
        for rep in range(repeats):
            results = _launch([_plan(n, p, 4) for n, p in METHODS], steps, share, os.path.join(tmp, f"ws4-{rep}"))
            runs.append([_measured(n, p, 4, r) for (n, p), r in zip(METHODS, results)])
            for k, n in enumerate(SCALING):
                pair = [("allreduce", {}), ("master", {})]
                got = _launch([_plan(m, p, n) for m, p in pair], steps, share / 2, os.path.join(tmp, f"ws{n}-{rep}"))
                scaling_runs[k].append([_measured(m, p, n, r) for (m, p), r in zip(pair, got)])
        with open(links) as f:
            links_json = f.read()
    scaling = [_merge(r) for r in scaling_runs]
    return {
        "rate": rate,
        "methods": _merge(runs),
        "scaling": scaling,
        "links_json": links_json,
        "links_s": links_s,
        "repeats": repeats,
    }


def predict(block: dict, profile_path: str | list[str] | dict[int, list[str]]) -> dict:
    """Every measured row beside estimate() on the links measured with it and the CPU profile;
    with several profiles (taken before and after the launches) the mean of their predictions,
    each kept in `predicted_step_s_profiles`; with {workers: paths}, each row priced with the
    profiles taken as that many ranks share the CPU (4's where its count has none)."""
    from meshplan.model_profile import ModelProfile
    from meshplan.presets import load_cluster
    from meshplan.schema import load

    by_workers = profile_path if isinstance(profile_path, dict) else {4: profile_path}
    loaded = {
        n: [load(ModelProfile, path, "profile") for path in ([paths] if isinstance(paths, str) else paths)]
        for n, paths in by_workers.items()
    }
    with tempfile.TemporaryDirectory() as tmp:
        links = os.path.join(tmp, "links.json")
        with open(links, "w") as f:
            f.write(block["links_json"])
        for row in block["methods"] + [r for pair in block["scaling"] for r in pair]:
            plan = _plan(row["name"], row["params"], row["workers"])
            cluster = load_cluster(links, row["workers"])
            profiles = loaded.get(row["workers"]) or loaded[max(loaded)]
            predicted = [_predict(plan, cluster, profile) for profile in profiles]
            row["predicted_step_s_profiles"] = [step for step, _ in predicted]
            row["predicted_step_s"] = statistics.fmean(row["predicted_step_s_profiles"])
            row["predicted_bytes"] = predicted[0][1].get("dp_replicate", 0)
    rows = block["methods"]
    scaling = [(pair[0]["workers"], *pair) for pair in block["scaling"]] + [(4, rows[0], rows[1])]
    return {
        "rate": block["rate"],
        "methods": _against_ddp(rows),
        "master_scaling": [{"workers": n, "ddp": d, "master": m} for n, d, m in scaling],
        "links_s": block["links_s"],
    }


def _against_ddp(rows: list[dict]) -> list[dict]:
    ddp = rows[0]
    for r in rows:
        r["measured_vs_ddp"] = r["measured_step_s"] / ddp["measured_step_s"]
        r["predicted_vs_ddp"] = r["predicted_step_s"] / ddp["predicted_step_s"]
        r["error_pct"] = 100 * (r["predicted_step_s"] - r["measured_step_s"]) / r["measured_step_s"]
        r["loss_vs_ddp"] = r["loss_last"] / ddp["loss_last"]
        if r is not ddp:  # the predicted ordering against DDP (faster / slower) holds
            r["ordering_holds"] = (r["predicted_vs_ddp"] < 1) == (r["measured_vs_ddp"] < 1)
    return rows


def outer(rate: str, steps: int, timeout_s: float, repeats: int = 1) -> dict:
    """Run `inner`, inside a slow-link namespace unless rate is "none"."""
    cmd = [sys.executable, "-m", "benchmarks.sync_methods", "--inner", rate, "--steps", str(steps)]
    return run_at_rate([*cmd, "--timeout-s", str(timeout_s), "--repeats", str(repeats)], rate, timeout_s)


def profile_cpu(path: str, ranks: int = 4) -> float:
    """gpt-tiny profiled on this CPU as `ranks` ranks share it (microbatch 1, ranks - 1 busy
    neighbours), written to `path`; returns the seconds it took."""
    from meshplan.profiler import profile_model
    from meshplan.schema import dumps, write_text_atomic

    start = time.perf_counter()
    profile = profile_model("gpt-tiny", {}, device="cpu", microbatch_sizes=[1], concurrent=ranks, in_place=False)
    write_text_atomic(path, dumps(profile))
    return time.perf_counter() - start


def master_prediction_to_1024() -> list[dict]:
    """The model's DDP vs master step time for gpt-tiny replicas on A100 nodes, 8 to 1024 GPUs."""
    from meshplan.planner import PlanRequest, estimate
    from meshplan.presets import cluster_preset
    from meshplan.profiler import profile_model

    profile = profile_model("gpt-tiny", {}, device="meta")
    rows = []
    for n in TO_1024:
        out: dict = {"workers": n}
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
            pred = estimate(profile, cluster_preset("a100-80g", n), req).prediction
            out[f"{sync}_s"] = pred.step_time_s
            out[f"{sync}_dp_comm_s"] = pred.breakdown["dp_comm"]
        rows.append(out)
    return rows


def run_bench(steps: int = 13, rate: str = "1gbit", timeout_s: float = 600, say=print, repeats: int = 1) -> dict:
    """The benchmark (module docstring); wall seconds in `runtime_s`. `block` keeps the raw
    measurements (predict(block, profile) again to re-price them)."""
    start = time.perf_counter()
    load_start = os.getloadavg()
    counts = (4, *SCALING)  # each launch's ranks share the 2 cores: a profile per count (RANKS_SHARE)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {n: [os.path.join(tmp, f"{when}{n}.json") for when in ("before", "after")] for n in counts}
        say(f"  profiling gpt-tiny on this CPU as {', '.join(map(str, counts))} ranks share it, before the launches")
        profile_s = sum(profile_cpu(paths[n][0], n) for n in counts)
        load_profiled = os.getloadavg()
        say(
            f"  rate {rate}: profile-links, {len(METHODS)} plans x {steps} steps on 4 ranks, master on 2 and 3, "
            f"{repeats} interleaved repeat(s)"
        )
        block = outer(rate, steps, timeout_s * repeats, repeats)
        measured_s = time.perf_counter() - start - profile_s
        result: dict = {"steps": steps, "block": block, "measured_s": measured_s, "repeats": repeats}
        result["load_avg"] = {
            "start": list(load_start),
            "after_profile": list(load_profiled),
            "after_measuring": list(os.getloadavg()),
        }
        say("  profiling gpt-tiny again, after the launches")
        result["profile_s"] = profile_s + sum(profile_cpu(paths[n][1], n) for n in counts)
        result["profiles"] = (
            "before and after the launches, each as the launch's ranks share the CPU; each prediction the mean of the two"
        )
        result["run"] = block if "error" in block else predict(json.loads(json.dumps(block)), paths)
    result["master_prediction"] = master_prediction_to_1024()
    result["runtime_s"] = time.perf_counter() - start
    return result


def bench_section(quick: bool, say) -> dict:
    """benchmarks/run.py's section: the plain loopback and 5 steps when quick, else 1 Gbit/s and 13."""
    return run_bench(5 if quick else 13, "none" if quick else "1gbit", say=say, repeats=1 if quick else 3)


def _ms(s: float) -> str:
    return f"{1e3 * s:.1f}"


def markdown(result: dict) -> str:
    """The result as markdown: the methods against DDP, master against DDP as N grows, the model to 1024."""
    block = result["run"]
    load = result.get("load_avg")
    head = (
        f"{result['steps']} steps per plan at rate {block['rate']}; whole run {result.get('runtime_s', 0):.0f} s "
        f"(CPU profile {result.get('profile_s', 0):.0f} s). Predicted: estimate() on the links measured in "
        "the namespace, with the CPU profile"
        + (f" ({result['profiles']})." if result.get("profiles") else ".")
        + (
            f" Measured: the median of {result['repeats']} interleaved repeats (every plan once per repeat)."
            if result.get("repeats", 1) > 1
            else ""
        )
        + (
            f" 1-min load average {load['start'][0]:.1f} at the start, {load['after_measuring'][0]:.1f} after "
            "measuring (2 cores)."
            if load
            else ""
        )
    )
    if "error" in block:
        return f"{head}\n\nthe run failed: {block['error']}"
    rows = block["methods"]
    held = sum(r["ordering_holds"] for r in rows[1:])
    mape = statistics.fmean(abs(r["error_pct"]) for r in rows)
    base = rows[0]["measured_step_s"] - rows[0]["predicted_step_s"]
    extra = ", ".join(
        f"{r['method']} {1e3 * (r['measured_step_s'] - r['predicted_step_s'] - base):+.0f}" for r in rows[1:]
    )
    lines = [
        head,
        f"\nStep-time MAPE {mape:.0f}%; predicted faster/slower than DDP holds for {held}/{len(rows) - 1}. "
        f"Where the gap sits: DDP's own (measured - predicted: the layers and the dense all-reduce, in every row) "
        f"{1e3 * base:+.0f} ms ({base / rows[0]['measured_step_s']:+.0%} of its step); each method's gap beyond "
        f"it, in ms (its own exchange and step): {extra}.\n",
        "| method | measured ms | predicted ms | measured / DDP | predicted / DDP | bytes/step/rank (measured, predicted) | loss | loss / DDP |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        same = "=" if r["measured_bytes"] == r["predicted_bytes"] else f"{r['predicted_bytes']:,}"
        lines.append(
            f"| {r['method']} | {_ms(r['measured_step_s'])} | {_ms(r['predicted_step_s'])} | "
            f"{r['measured_vs_ddp']:.2f} | {r['predicted_vs_ddp']:.2f} | {r['measured_bytes']:,} {same} | "
            f"{r['loss_last']:.4f} | {r['loss_vs_ddp']:.4f} |"
        )
    lines += [
        "\nMaster aggregation against DDP as N grows (ms per step):\n",
        "| workers | DDP measured | master measured | master / DDP measured | DDP predicted | master predicted | master / DDP predicted |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in block["master_scaling"]:
        d, m = s["ddp"], s["master"]
        lines.append(
            f"| {s['workers']} | {_ms(d['measured_step_s'])} | {_ms(m['measured_step_s'])} | "
            f"{m['measured_step_s'] / d['measured_step_s']:.2f} | {_ms(d['predicted_step_s'])} | "
            f"{_ms(m['predicted_step_s'])} | {m['predicted_step_s'] / d['predicted_step_s']:.2f} |"
        )
    lines += [
        "\nThe model's prediction for gpt-tiny replicas on a100-80g nodes (ms per step; sync = the exposed "
        "data-parallel term):\n",
        "| workers | DDP | master | master / DDP | DDP sync | master sync |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for p in result["master_prediction"]:
        lines.append(
            f"| {p['workers']} | {_ms(p['allreduce_s'])} | {_ms(p['master_s'])} | "
            f"{p['master_s'] / p['allreduce_s']:.1f} | {_ms(p['allreduce_dp_comm_s'])} | {_ms(p['master_dp_comm_s'])} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sync_methods")
    ap.add_argument("--rate", default="1gbit", help="tc rate of the slow-link namespace; none = plain loopback")
    ap.add_argument(
        "--steps", type=int, default=13, help="1 + a multiple of 4: whole local-SGD periods after the first step"
    )
    ap.add_argument("--timeout-s", type=float, default=600, help="the namespace: profile-links + the launches")
    ap.add_argument("--out", default="")
    ap.add_argument("--markdown", action="store_true", help="print the tables instead of the JSON")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats of every launch (the median is kept)")
    ap.add_argument("--inner", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inner:
        result = inner(args.inner, args.steps, args.timeout_s, args.repeats)
    else:
        result = run_bench(args.steps, args.rate, args.timeout_s, repeats=args.repeats)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(markdown(result) if args.markdown and not args.inner else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
