"""Gradient compression on slow links, measured vs predicted against DDP.

    python -m benchmarks.compression_slow_link [--rates 1gbit,100mbit,none] [--steps 8] [--out F.json]
    from benchmarks import compression_slow_link as c; c.markdown(c.run_bench(("none", "100mbit"), 8))

gpt-tiny on 4 gloo ranks (SGD + momentum, lr 0.2, a learnable token pattern: `pattern_dataset`),
DDP and each compressor at one or two settings, at each rate: inside a fresh slow-link namespace
(benchmarks/slow_link.py; "none" = the plain loopback) it first measures the links there with
`meshplan profile-links --nproc 4` and then runs every plan in one launch, so the prediction
(estimate() on that measured ClusterSpec) and the measurement see the same wire. The model is
profiled on this CPU right before each rate's launch and right after it
(`profile_model(device="cpu", concurrent=4)`: layer timings with 3 busy neighbours, and the
compressors' codecs timed by profiler/codecs.py; PROFILES), and each prediction is the mean of
the two. Each row is
predicted four ways: "meta" (layer compute from FLOPs, codecs modelled: the planner without a
timed profile), "meta+codecs" (layers from FLOPs, the codecs measured: what timing the codecs
alone changes), "cpu" (the CPU profile's layer timings, codecs modelled) and "cpu+codecs" (the
CPU profile as it is). Per row: median step time after the first
two steps, the predictions, counted and predicted bytes per step and rank, loss after --steps
steps and its ratio to DDP's. Per rate and prediction: the mean absolute percentage error and
whether each method's predicted ordering against DDP (faster / slower) holds. Bounded:
--timeout-s per rate (profile-links + one launch).
Entry points: `run_bench(rates, steps) -> dict`, `markdown(result) -> str`, and
`bench_section(quick, say)` for benchmarks/run.py (quick: loopback only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks.common import run_at_rate

METHODS = [
    ("none", {}),
    ("fp16", {}),
    ("powersgd", {"rank": 2}),
    ("accordion", {"window": 3}),
    ("topk", {"density": 0.01}),
    ("topk", {"density": 0.001}),
    ("accordion_topk", {"window": 3}),
    ("qsgd", {"bits": 4}),
    ("nuqsgd", {"bits": 4}),
    ("alq", {"bits": 3, "refit_every": 4}),
    ("amq", {"bits": 3, "refit_every": 4}),
]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINK_BYTES = {"none": 4 << 20, "1gbit": 4 << 20, "100mbit": 1 << 20}


def pattern_dataset(num_samples: int = 64, vocab: int = 256, seq: int = 32):
    """A learnable next-token task: each row counts up by its own stride (mod vocab)."""
    import torch

    gen = torch.Generator().manual_seed(11)
    start = torch.randint(0, vocab, (num_samples, 1), generator=gen)
    stride = torch.randint(1, 4, (num_samples, 1), generator=gen)
    tokens = (start + stride * torch.arange(seq + 1)) % vocab
    return [(row[:-1], row[1:]) for row in tokens]


def _plans():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from executor_plans import make_plan

    return [make_plan(dp=4, microbatch=4, compression=n, compression_params=p) for n, p in METHODS]


PREDICTIONS = ("meta", "meta+codecs", "cpu", "cpu+codecs")
"""How each row is predicted (module docstring)."""
PROFILES = "before and after each rate's launch; each prediction the mean of the two"
"""The host's load moves over the minutes a rate takes: the CPU profile is taken right before
each rate's launch and right after it (the next rate's \"before\"), so the calibration brackets
the load the runs saw instead of one moment of it."""


def _profiles(profile_path: str) -> dict:
    """The four profiles the predictions read (module docstring)."""
    from meshplan.model_profile import ModelProfile
    from meshplan.profiler import profile_model
    from meshplan.schema import load

    timed = load(ModelProfile, profile_path, "profile")
    layers_only = load(ModelProfile, profile_path, "profile")
    layers_only.codec_timings = {}
    meta, meta_codecs = (profile_model("gpt-tiny", {}, device="meta") for _ in range(2))
    meta_codecs.device, meta_codecs.codec_timings = "cpu", timed.codec_timings  # no layer timings: FLOPs
    return {"meta": meta, "meta+codecs": meta_codecs, "cpu": layers_only, "cpu+codecs": timed}


def _predict(plan, cluster, profile) -> tuple[float, dict]:
    from meshplan.planner import PlanRequest, estimate

    c = plan.dp_methods.compression
    req = PlanRequest(
        num_gpus=4,
        global_batch=plan.global_batch_size,
        precision="fp32",
        dp=4,
        tp=1,
        pp=1,
        microbatch=plan.microbatch_size,
        zero=0,
        methods={"compression": (c.name, dict(c.params))},
    )
    pred = estimate(profile, cluster, req).prediction
    return pred.step_time_s, pred.comm_bytes_per_step


def _profile_links(links: str, rate: str, timeout_s: float) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "meshplan",
            "profile-links",
            "--nproc",
            "4",
            "--max-bytes",
            str(MAX_LINK_BYTES.get(rate, 1 << 20)),
            "-o",
            links,
            "--quiet",
        ],
        check=True,
        timeout=timeout_s / 2,
        stdout=subprocess.DEVNULL,
    )


def inner(rate: str, steps: int, timeout_s: float, profile_path: str) -> dict:
    """Inside the namespace (or on the plain loopback): links, then every plan in one launch."""
    from meshplan.executor.launch import LaunchOptions, run_plans
    from meshplan.presets import load_cluster

    with tempfile.TemporaryDirectory() as tmp:
        links = os.path.join(tmp, "links.json")
        _profile_links(links, rate, timeout_s)
        plans = _plans()
        results = run_plans(
            plans,
            LaunchOptions(
                steps=steps,
                out_dir=os.path.join(tmp, "run"),
                quiet=True,
                timeout_s=timeout_s / 2,
                optimizer="sgd",
                lr=0.2,
                grad_clip=1.0,
                data="benchmarks.compression_slow_link:pattern_dataset",
                env={"PYTHONPATH": ROOT},
            ),
        )
        cluster = load_cluster(links, 4)
        sets = [_profiles(path) for path in profile_path.split(",")]  # PROFILES: before and after
        rows = []
        for (name, params), plan, result in zip(METHODS, plans, results):
            each = [{k: _predict(plan, cluster, profiles[k]) for k in PREDICTIONS} for profiles in sets]
            predicted = each[0]
            rows.append(
                {
                    "method": name + "".join(f":{k}={v}" for k, v in params.items()),
                    "measured_step_s": statistics.median(result.step_times_s[2:]),
                    "measured_mean_step_s": statistics.fmean(result.step_times_s[2:]),
                    "predicted_step_s": {k: statistics.fmean(e[k][0] for e in each) for k in PREDICTIONS},
                    "predicted_step_s_profiles": [e["cpu+codecs"][0] for e in each],
                    "measured_bytes": result.comm_bytes_per_step.get("dp_replicate", 0),
                    "predicted_bytes": predicted["cpu+codecs"][1].get("dp_replicate", 0),
                    "loss_last": result.losses[-1],
                    "notes": [n for n in result.notes if "accordion" in n],
                }
            )
        links_json = open(links).read()
    return {
        "rate": rate,
        "rows": summarise(rows),
        "links": json.loads(links_json).get("collectives", []),
        "links_json": links_json,
    }


def reprice(block: dict, profile_paths: str) -> None:
    """Predict a measured rate's rows again (in place) with the profiles at `profile_paths`
    (comma-separated: the mean of their predictions), on the links measured with it."""
    from meshplan.presets import load_cluster

    with tempfile.TemporaryDirectory() as tmp:
        links = os.path.join(tmp, "links.json")
        with open(links, "w") as f:
            f.write(block["links_json"])
        cluster = load_cluster(links, 4)
        sets = [_profiles(path) for path in profile_paths.split(",")]
        for row, plan in zip(block["rows"], _plans()):
            each = [{k: _predict(plan, cluster, profiles[k]) for k in PREDICTIONS} for profiles in sets]
            row["predicted_step_s"] = {k: statistics.fmean(e[k][0] for e in each) for k in PREDICTIONS}
            row["predicted_step_s_profiles"] = [e["cpu+codecs"][0] for e in each]
    summarise(block["rows"])


def summarise(rows: list[dict]) -> list[dict]:
    ddp = rows[0]
    for r in rows:
        m = r["measured_step_s"]
        r["error_pct"] = {k: 100 * (p - m) / m for k, p in r["predicted_step_s"].items()}
        r["loss_vs_ddp"] = r["loss_last"] / ddp["loss_last"]
        if r is not ddp:
            r["ordering_holds"] = {
                k: (p < ddp["predicted_step_s"][k]) == (m < ddp["measured_step_s"])
                for k, p in r["predicted_step_s"].items()
            }
    return rows


def outer(rate: str, steps: int, timeout_s: float, profile_path: str) -> dict:
    """Run `inner` for one rate, inside a slow-link namespace unless rate is "none"."""
    cmd = [sys.executable, "-m", "benchmarks.compression_slow_link", "--inner", rate, "--steps", str(steps)]
    return run_at_rate([*cmd, "--timeout-s", str(timeout_s), "--profile", profile_path], rate, timeout_s)


def profile_cpu(path: str) -> float:
    """gpt-tiny profiled on this CPU as 4 ranks share it (microbatch 4, 3 busy neighbours, codecs
    timed), written to `path`; returns the seconds it took."""
    import time

    from meshplan.profiler import profile_model
    from meshplan.schema import dumps, write_text_atomic

    start = time.perf_counter()
    profile = profile_model("gpt-tiny", {}, device="cpu", microbatch_sizes=[4], concurrent=4, in_place=False)
    write_text_atomic(path, dumps(profile))
    return time.perf_counter() - start


def run_bench(rates=("none", "100mbit", "1gbit"), steps: int = 8, timeout_s: float = 600, say=print) -> dict:
    """The benchmark (module docstring): a profile before each rate and one after the last, each
    rate predicted with the two around it (PROFILES); wall seconds in `runtime_s`."""
    import time

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f"profile{i}.json") for i in range(len(rates) + 1)]
        say("  profiling gpt-tiny on this CPU (4 ranks' share, codecs timed)")
        profile_s = profile_cpu(paths[0])
        loads = [os.getloadavg()[0]]
        blocks = []
        for i, rate in enumerate(rates):
            say(f"  rate {rate}: profile-links, then {len(METHODS)} plans x {steps} steps")
            block = outer(rate, steps, timeout_s, paths[i])  # measures; priced below
            say("  profiling gpt-tiny on this CPU again")
            profile_s += profile_cpu(paths[i + 1])
            loads.append(os.getloadavg()[0])
            if "error" not in block:
                reprice(block, f"{paths[i]},{paths[i + 1]}")
            blocks.append(block)
    return {
        "steps": steps,
        "rates": blocks,
        "profile_s": profile_s,
        "profiles": PROFILES,
        "profile_loads_avg_1min": loads,
        "runtime_s": time.perf_counter() - start,
    }


def bench_section(quick: bool, say) -> dict:
    """benchmarks/run.py's section: the plain loopback only when quick, else all three rates."""
    return run_bench(("none",) if quick else ("none", "100mbit", "1gbit"), 6 if quick else 8, say=say)


def _mape(rows: list[dict], key: str) -> float:
    return statistics.fmean(abs(r["error_pct"][key]) for r in rows)


def markdown(result: dict) -> str:
    """The result as markdown: per rate, MAPE and ordering per prediction, then one table."""
    lines = [
        f"{result['steps']} steps per plan; whole run {result.get('runtime_s', 0):.0f} s (CPU profile "
        f"{result.get('profile_s', 0):.0f} s"
        + (
            f", taken {result['profiles']}; 1-min load average after each "
            + ", ".join(f"{x:.1f}" for x in result.get("profile_loads_avg_1min", []))
            if result.get("profiles")
            else ""
        )
        + "). Predicted step time: meta = layers from FLOPs, codecs "
        "modelled; meta+codecs = codecs measured; cpu = CPU layer timings, codecs modelled; "
        "cpu+codecs = both measured."
    ]
    for block in result["rates"]:
        if "error" in block:
            lines.append(f"\n{block['rate']}: {block['error']}")
            continue
        rows = block["rows"]
        summary = "; ".join(
            f"{k} MAPE {_mape(rows, k):.0f}%, ordering {sum(r['ordering_holds'][k] for r in rows[1:])}/{len(rows) - 1}"
            for k in PREDICTIONS
        )
        lines += [
            f"\n{block['rate']}: {summary}\n",
            "| method | measured s | "
            + " | ".join(f"{k} s" for k in PREDICTIONS)
            + " | bytes/step/rank | loss / DDP |",
            "|---|" + "---:|" * (len(PREDICTIONS) + 3),
        ]
        for r in rows:
            same = "=" if r["measured_bytes"] == r["predicted_bytes"] else f"(predicted {r['predicted_bytes']:,})"
            predicted = " | ".join(f"{r['predicted_step_s'][k]:.3f}" for k in PREDICTIONS)
            lines.append(
                f"| {r['method']} | {r['measured_step_s']:.3f} | {predicted} | {r['measured_bytes']:,} {same} | "
                f"{r['loss_vs_ddp']:.3f} |"
            )
        lines.append("\n" + gap_line(rows, "cpu+codecs"))
    return "\n".join(lines)


def gap_line(rows: list[dict], key: str) -> str:
    """Which term misses: DDP's own gap (layers + the dense all-reduce, which every row shares)
    and each method's gap beyond it (its codec compute and its own exchange)."""
    ddp = rows[0]
    base = ddp["measured_step_s"] - ddp["predicted_step_s"][key]
    extra = ", ".join(
        f"{r['method']} {1e3 * (r['measured_step_s'] - r['predicted_step_s'][key] - base):+.0f}" for r in rows[1:]
    )
    return (
        f"Where the {key} gap sits: DDP's own (layers + dense all-reduce, in every row) "
        f"{1e3 * base:+.0f} ms ({base / ddp['measured_step_s']:+.0%} of its step); each method's gap beyond "
        f"it, in ms (its codec compute and its own exchange): {extra}."
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compression_slow_link")
    ap.add_argument("--rates", default="1gbit,100mbit,none", help="tc rates; none = plain loopback")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout-s", type=float, default=600, help="per rate: profile-links + the launch")
    ap.add_argument("--out", default="")
    ap.add_argument("--inner", default="", help=argparse.SUPPRESS)
    ap.add_argument("--profile", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inner:
        result = inner(args.inner, args.steps, args.timeout_s, args.profile)
    else:
        result = run_bench(tuple(args.rates.split(",")), args.steps, args.timeout_s)
        print(markdown(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
