"""ByteScheduler, Crossbow, DABMD and Wavelet as their papers define them, measured against the
baseline each paper beats, beside the planner's prediction.

    python -m benchmarks.dp_paper_methods [--repeats 3] [--steps 8] [--out F.json] [--markdown]

gpt h256 x 4 blocks on 2 gloo ranks of this CPU (profiled as 2 ranks share it, links measured by
profile-links on 2 ranks), SGD + momentum, no clipping. The host is shared, so every comparison
is a side-by-side ratio: each repeat launches the method and its baseline back to back (one
launch, two variants), and the tables give the median over repeats of the per-repeat ratio.
- ByteScheduler against DDP (the registry default and a small chunk): measured and predicted
  step, both as a ratio to DDP, and whether they fall on the same side of it;
- Crossbow: samples per second per rank for k = 1, 2, 4 learners, concurrent (threads) and one
  after another (MESHPLAN_CROSSBOW_SEQUENTIAL=1), beside the planner's throughput;
- DABMD against DDP with rank 1 slowed 3x (MESHPLAN_SLOW_RANK): step time, samples per second,
  loss after the run and loss drop per wall-clock second, beside planner/methods/sync.py's
  straggler_trade on the estimate's compute and sync;
- Wavelet: waves=2 on one emulated device (two ranks pinned to one core), its summed memory
  timeline's peak and throughput against one wave of the plan in the same budget, beside
  estimate --waves 2 and --waves 1 (activation peak and samples per second).
Entry points: `run_bench(repeats, steps) -> dict`, `markdown(result) -> str`,
`bench_section(quick, say)` for benchmarks/run.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NUM_RANKS = 2
CONFIG = {"layers": 4, "hidden": 256, "heads": 4, "vocab": 256, "seq": 64}
MICROBATCH, MICROBATCHES = 4, 2
SLOW = "1:3"
BS_VARIANTS = [("bytescheduler", {}), ("bytescheduler:chunk_mb=0.25,credit_mb=1", {"chunk_mb": 0.25, "credit_mb": 1.0})]
LEARNERS = (1, 2, 4)


def _plan(n: int, methods: dict, microbatch: int = MICROBATCH, microbatches: int = MICROBATCHES):
    sys.path.insert(0, str(ROOT / "tests"))
    from executor_plans import make_plan

    from meshplan import dp_methods
    from meshplan.plan import MethodChoice

    plan = make_plan("gpt", config=CONFIG, dp=n, microbatch=microbatch, microbatches=microbatches)
    for axis, (name, params) in methods.items():
        resolved = dp_methods.method(axis, name).resolve(params, axis)
        setattr(plan.dp_methods, axis, MethodChoice(name=name, params=resolved))
    plan.validate()
    return plan


def _predict(plan, profile, cluster):
    from meshplan.planner import PlanRequest, estimate

    req = PlanRequest(
        num_gpus=plan.world_size,
        global_batch=plan.global_batch_size,
        precision="fp32",
        tp=1,
        pp=1,
        dp=plan.world_size,
        microbatch=plan.microbatch_size,
        zero=plan.zero_stage,
        methods={a: (c.name, dict(c.params)) for a, c in plan.dp_methods.items()},
    )
    return estimate(profile, cluster, req).prediction


def _launch(plans, steps: int, out: Path, env: dict | None = None):
    from meshplan.executor.launch import LaunchOptions, run_plans

    opts = LaunchOptions(steps=steps, out_dir=str(out), quiet=True, timeout_s=600, optimizer="sgd", lr=0.05, env=env)
    return run_plans(plans, opts)


def _median_step(result) -> float:
    times = result.step_times_s[2:] if len(result.step_times_s) > 2 else result.step_times_s
    return statistics.median(times)


def _side(ratio: float, tie: float = 0.01) -> str:
    return "=" if abs(ratio - 1) <= tie else ("faster" if ratio < 1 else "slower")


def bytescheduler(profile, cluster, repeats: int, steps: int, out: Path, say) -> list[dict]:
    ddp = _plan(NUM_RANKS, {})
    variants = [_plan(NUM_RANKS, {"comm_schedule": ("bytescheduler", p)}) for _, p in BS_VARIANTS]
    ratios: dict[int, list[float]] = {i: [] for i in range(len(variants))}
    steps_s: dict[int, list[float]] = {i: [] for i in range(-1, len(variants))}
    for r in range(repeats):
        got = _launch([ddp, *variants], steps, out / f"bs{r}")
        base = _median_step(got[0])
        steps_s[-1].append(base)
        for i, res in enumerate(got[1:]):
            steps_s[i].append(_median_step(res))
            ratios[i].append(_median_step(res) / base)
        say(f"  bytescheduler repeat {r + 1}/{repeats}: ratios {[round(v[-1], 3) for v in ratios.values()]}")
    pred_ddp = _predict(ddp, profile, cluster).step_time_s
    rows = [{"method": "ddp", "measured_step_s": statistics.median(steps_s[-1]), "predicted_step_s": pred_ddp}]
    for i, (label, _) in enumerate(BS_VARIANTS):
        pred = _predict(variants[i], profile, cluster).step_time_s
        measured, predicted = statistics.median(ratios[i]), pred / pred_ddp
        rows.append(
            {
                "method": label,
                "measured_step_s": statistics.median(steps_s[i]),
                "predicted_step_s": pred,
                "measured_vs_ddp": measured,
                "predicted_vs_ddp": predicted,
                "ratios": ratios[i],
                "same_side": _side(measured) == _side(predicted),
            }
        )
    return rows


def crossbow(profile, cluster, repeats: int, steps: int, out: Path, say) -> list[dict]:
    plans = [_plan(NUM_RANKS, {"sync": ("crossbow", {"learners": k})}, microbatch=4, microbatches=1) for k in LEARNERS]
    per_rank = plans[0].global_batch_size / NUM_RANKS
    got: dict[tuple[str, int], list[float]] = {}
    for r in range(repeats):
        for mode in ("concurrent", "sequential"):
            env = {"MESHPLAN_CROSSBOW_SEQUENTIAL": "1" if mode == "sequential" else "0"}
            for k, res in zip(LEARNERS, _launch(plans, steps, out / f"cb{r}{mode}", env)):
                got.setdefault((mode, k), []).append(per_rank / _median_step(res))
        say(f"  crossbow repeat {r + 1}/{repeats}")
    rows = []
    for k, plan in zip(LEARNERS, plans):
        pred = _predict(plan, profile, cluster)
        conc, seq = statistics.median(got[("concurrent", k)]), statistics.median(got[("sequential", k)])
        ratio = statistics.median(a / b for a, b in zip(got[("concurrent", k)], got[("sequential", k)]))
        rows.append(
            {
                "learners": k,
                "concurrent_samples_per_s": conc,
                "sequential_samples_per_s": seq,
                "concurrent_vs_sequential": ratio,
                "predicted_samples_per_s": per_rank / pred.step_time_s,
            }
        )
    return rows


def dabmd(profile, cluster, repeats: int, steps: int, out: Path, say) -> dict:
    from meshplan.planner.methods.sync import straggler_trade

    mb, m = 2, 4  # the local batch of the other sections, in finer microbatches (the budget's unit)
    ddp = _plan(NUM_RANKS, {}, microbatch=mb, microbatches=m)
    (alone,) = _launch([ddp], max(4, steps // 2), out / "dab_calibrate")
    fast_s = _median_step(alone)
    budget_ms = round(0.5 * fast_s * 1e3, 1)  # half a fast step: binding on every node, the slow one most
    say(f"  dabmd: a fast DDP step {fast_s * 1e3:.1f} ms; budget {budget_ms} ms")
    pred_ddp = _predict(ddp, profile, cluster)
    compute = pred_ddp.breakdown["compute"] + pred_ddp.breakdown["recompute"]
    dab = _plan(NUM_RANKS, {"sync": ("dabmd", {"budget_ms": budget_ms})}, microbatch=mb, microbatches=m)
    pred_dab = _predict(dab, profile, cluster)
    factor = float(SLOW.split(":")[1])
    trade = straggler_trade(
        compute,
        m,
        mb * m,
        factor,
        budget_ms / 1e3,
        1,
        pred_ddp.breakdown["dp_comm"],
        pred_dab.breakdown["dp_comm"],
        pred_ddp.breakdown["optimizer"],
        NUM_RANKS,
    )
    stats = out / "dabmd_stats"
    rows: dict[str, list[dict]] = {"ddp": [], "dabmd": []}
    for r in range(repeats):
        env = {"MESHPLAN_SLOW_RANK": SLOW, "MESHPLAN_SYNC_STATS_DIR": str(stats / str(r))}
        for name, res in zip(("ddp", "dabmd"), _launch([ddp, dab], steps, out / f"dab{r}", env)):
            wall = sum(res.step_times_s)
            rows[name].append(
                {
                    "step_s": _median_step(res),
                    "loss": res.losses[-1],
                    "drop_per_s": (res.losses[0] - res.losses[-1]) / wall,
                }
            )
        say(
            f"  dabmd repeat {r + 1}/{repeats}: step ratio {rows['dabmd'][-1]['step_s'] / rows['ddp'][-1]['step_s']:.3f}"
        )
    samples = []
    for path in sorted(stats.glob("*/sync_stats.dabmd.*.json")):
        samples += [s["samples"] for s in json.loads(path.read_text())[1:]]
    per_round = sum(samples) / len(samples) * NUM_RANKS if samples else 0.0

    def med(name, key):
        return statistics.median(x[key] for x in rows[name])

    ratio = statistics.median(d["step_s"] / b["step_s"] for d, b in zip(rows["dabmd"], rows["ddp"]))
    return {
        "budget_ms": budget_ms,
        "slow": SLOW,
        "ddp": {k: med("ddp", k) for k in ("step_s", "loss", "drop_per_s")},
        "dabmd": {k: med("dabmd", k) for k in ("step_s", "loss", "drop_per_s")},
        "measured_step_ratio": ratio,
        "dabmd_samples_per_round": per_round,
        "ddp_samples_per_step": mb * m * NUM_RANKS,
        "fast_ddp_step_s": fast_s,
        "predicted": trade,
        "predicted_step_ratio": trade["dabmd_step_s"] / trade["ddp_step_s"],
    }


def wavelet(profile, cluster, steps: int, out: Path, say) -> dict:
    from meshplan.executor import waves_launch
    from meshplan.executor.launch import LaunchOptions

    plan = _plan(1, {}, microbatch=8, microbatches=1)
    opts = LaunchOptions(steps=steps, out_dir=str(out / "waves"), quiet=True, timeout_s=600, optimizer="sgd", lr=0.05)
    report = waves_launch.run(plan, opts)
    (device,) = report["devices"]
    one = report["one_wave"]
    two_plan = _plan(1, {"waves": ("2", {})}, microbatch=8, microbatches=1)
    p1, p2 = _predict(plan, profile, cluster), _predict(two_plan, profile, cluster)
    samples = plan.global_batch_size
    say(f"  wavelet: two waves {device['samples_per_s']:.1f} samples/s, one {one['samples_per_s_per_device']:.1f}")
    return {
        "measured": {
            "two_waves_samples_per_s": device["samples_per_s"],
            "one_wave_samples_per_s": one["samples_per_s_per_device"],
            "two_waves_summed_dynamic_peak_bytes": device["summed_dynamic_peak_bytes"],
            "wave_dynamic_peaks_bytes": device["wave_dynamic_peaks_bytes"],
            "one_wave_dynamic_peak_bytes": one["devices"][0]["dynamic_peak_bytes"],
            "tock_offset": device["tock_offset_s"],
            "cross_wave_averages": device["cross_wave_averages"],
        },
        "predicted": {
            "two_waves_samples_per_s": samples / p2.step_time_s,
            "one_wave_samples_per_s": samples / p1.step_time_s,
            "two_waves_activation_bytes": p2.stage_memory[0].activations_bytes,
            "one_wave_activation_bytes": p1.stage_memory[0].activations_bytes,
        },
    }


def _profile(microbatches: list[int]):
    from meshplan.profiler import profile_model

    return profile_model(
        "gpt", dict(CONFIG), device="cpu", microbatch_sizes=microbatches, concurrent=NUM_RANKS, in_place=False
    )


def run_bench(repeats: int = 3, steps: int = 8, say=print, out: str | None = None) -> dict:
    from meshplan.profiler.links import profile_links

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_papers_", dir=out) as tmp:
        work = Path(tmp)
        cluster = profile_links(NUM_RANKS, max_bytes=4 * 2**20, repeats=3)
        say(f"  links on {NUM_RANKS} ranks: {cluster.source}")
        profile = _profile([1, 2, 4, 8])  # every microbatch the runs use (Crossbow: 4 / k; Wavelet: 8, 4)
        result = {
            "config": CONFIG,
            "ranks": NUM_RANKS,
            "repeats": repeats,
            "steps": steps,
            "bytescheduler": bytescheduler(profile, cluster, repeats, steps, work, say),
            "crossbow": crossbow(profile, cluster, repeats, steps, work, say),
            "dabmd": dabmd(profile, cluster, repeats, steps, work, say),
            "wavelet": wavelet(profile, cluster, max(steps, 12), work, say),
        }
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["load_avg_1min"] = os.getloadavg()[0]
    return result


def bench_section(quick: bool, say) -> dict:
    return run_bench(repeats=1 if quick else 3, steps=6, say=say)


def _mib(x: float) -> str:
    return f"{x / 2**20:.1f}"


def markdown(r: dict) -> str:
    c = r["config"]
    lines = [
        f"gpt h{c['hidden']} x {c['layers']} blocks (seq {c['seq']}), {r['ranks']} gloo ranks of this shared "
        f"2-core host, SGD, {r['steps']} steps per launch, {r['repeats']} interleaved repeats (method and "
        f"baseline back to back); ratios are medians of the per-repeat ratios. Whole run {r['seconds']} s, "
        f"load average after it {r['load_avg_1min']:.1f}. Timings on this host are noisy: read the ratios "
        "and their side of 1, not the absolute times.",
        "",
        "**ByteScheduler against DDP** (Peng et al., SOSP 2019): the scheduler thread, priority queue and "
        "credit; the next forward waits for the last chunk (its per-layer start is not built), which the "
        "planner prices, with one negotiation latency.",
        "",
        "| method | measured s/step | predicted s/step | measured / DDP | predicted / DDP | same side of DDP |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in r["bytescheduler"]:
        if row["method"] == "ddp":
            lines.append(f"| ddp | {row['measured_step_s']:.4f} | {row['predicted_step_s']:.4f} | 1 | 1 | |")
            continue
        lines.append(
            f"| {row['method']} | {row['measured_step_s']:.4f} | {row['predicted_step_s']:.4f} | "
            f"{row['measured_vs_ddp']:.3f} | {row['predicted_vs_ddp']:.3f} | {'yes' if row['same_side'] else 'no'} |"
        )
    lines += [
        "",
        "**Crossbow: throughput against k on one rank** (Koliousis et al., VLDB 2019): samples per second "
        "per rank; the learners in threads of their own, or one after another.",
        "",
        "| learners k | concurrent | sequential | concurrent / sequential | predicted |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in r["crossbow"]:
        lines.append(
            f"| {row['learners']} | {row['concurrent_samples_per_s']:.1f} | {row['sequential_samples_per_s']:.1f} | "
            f"{row['concurrent_vs_sequential']:.3f} | {row['predicted_samples_per_s']:.1f} |"
        )
    d = r["dabmd"]
    p = d["predicted"]
    lines += [
        "",
        f"**DABMD against DDP with rank {d['slow'].split(':')[0]} slowed {d['slow'].split(':')[1]}x** "
        f"(Eshraghi and Liang, ICML 2020; 4 microbatches of 2 a step; budget {d['budget_ms']} ms = half a "
        "fast DDP step measured first without the straggler; prediction: planner/methods/sync.py "
        "straggler_trade on the estimate's compute and sync).",
        "",
        "| | DDP | DABMD | DABMD / DDP |",
        "|---|---:|---:|---:|",
        f"| measured s/step | {d['ddp']['step_s']:.4f} | {d['dabmd']['step_s']:.4f} | {d['measured_step_ratio']:.3f} |",
        f"| predicted s/step | {p['ddp_step_s']:.4f} | {p['dabmd_step_s']:.4f} | {d['predicted_step_ratio']:.3f} |",
        f"| samples per step (measured) | {d['ddp_samples_per_step']} | {d['dabmd_samples_per_round']:.1f} | |",
        f"| samples per step (predicted) | {d['ddp_samples_per_step']} | {p['dabmd_samples_per_round']:.1f} | |",
        f"| loss after the run | {d['ddp']['loss']:.4f} | {d['dabmd']['loss']:.4f} | |",
        f"| loss drop per wall-clock second | {d['ddp']['drop_per_s']:.4f} | {d['dabmd']['drop_per_s']:.4f} | |",
    ]
    w, wp = r["wavelet"]["measured"], r["wavelet"]["predicted"]
    lines += [
        "",
        "**Wavelet: two waves against one on one device** (Wang et al., MLSys 2021): two ranks pinned to "
        "one core, microbatch 4 each, the tock half an iteration late, against one rank of microbatch 8. "
        "Memory is the resident set above each process's floor (glibc's mmap threshold at 64 KiB), summed "
        "over the pair on a common clock; predicted: estimate's activation bytes.",
        "",
        "| | two waves | one wave | two / one |",
        "|---|---:|---:|---:|",
        f"| measured samples/s | {w['two_waves_samples_per_s']:.1f} | {w['one_wave_samples_per_s']:.1f} | "
        f"{w['two_waves_samples_per_s'] / w['one_wave_samples_per_s']:.3f} |",
        f"| predicted samples/s | {wp['two_waves_samples_per_s']:.1f} | {wp['one_wave_samples_per_s']:.1f} | "
        f"{wp['two_waves_samples_per_s'] / wp['one_wave_samples_per_s']:.3f} |",
        f"| measured memory peak above floor MiB | {_mib(w['two_waves_summed_dynamic_peak_bytes'])} (waves alone "
        f"{', '.join(_mib(x) for x in w['wave_dynamic_peaks_bytes'])}) | {_mib(w['one_wave_dynamic_peak_bytes'])} | "
        f"{w['two_waves_summed_dynamic_peak_bytes'] / max(1, w['one_wave_dynamic_peak_bytes']):.3f} |",
        f"| predicted activation MiB | {_mib(wp['two_waves_activation_bytes'])} | "
        f"{_mib(wp['one_wave_activation_bytes'])} | "
        f"{wp['two_waves_activation_bytes'] / max(1, wp['one_wave_activation_bytes']):.3f} |",
        "",
        f"Tock offset in steady state: {w['tock_offset']:.2f} of a step (0.5 = half an iteration; two "
        f"processes on one core drift from it); cross-wave model averages {w['cross_wave_averages']}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--markdown", action="store_true", help="print the markdown section")
    args = ap.parse_args(argv)
    result = run_bench(args.repeats, args.steps)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
