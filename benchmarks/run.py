"""`python -m benchmarks.run --out reports [--quick]`: every measured claim of meshplan in one run.

Writes OUT/benchmarks.json (keys: local_accuracy, baselines, planner_speed, memory,
executor_overhead, gpu, machine, torch_version, ...) and OUT/benchmarks.md (benchmarks.report).
Sections: 1 local accuracy and plan quality, 2 baselines, 3 planner speed, 4 memory,
5 executor overhead, 6 GPU check (only where CUDA is present), 7-9 the data-parallel methods
(compression and replica synchronisation on slow links, offload and scheduling), 10 the bytes
on the wire as the kernel's interface counters see them (benchmarks/kernel_bytes.py). A section that
fails is recorded with its error and the others still run. `--sections a,b` runs a subset and keeps
the rest from the earlier OUT/benchmarks.json, each marked with the run that measured it. `--quick` is the CI-sized version (one repetition, a
6-plan grid, a short link sweep, the planner-speed and overhead quick modes).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks import baselines, memory_accuracy
from benchmarks import calibration as bracket
from benchmarks import local_accuracy as la
from benchmarks.common import git_state, machine_info, mape
from benchmarks.diagnostics import diagnose
from meshplan.errors import MeshplanError

TARGETS = {"mape": 0.10, "kendall_tau": 0.8, "top1_regret": 1.05}
"""The targets for section 1."""
LAUNCH_CHUNKS = 2
"""Section 1 runs each model's plans in this many consecutive launches per round and times the
layers again between them (benchmarks/calibration.py)."""


def _say(quiet: bool):
    return (lambda *_: None) if quiet else (lambda text: print(text, file=sys.stderr, flush=True))


def _predict_model(model: str, profile, cluster, grid: list, say) -> tuple[list, list]:
    """[(name, Plan)] for the grid, the Megatron heuristic and the planner's search; skipped."""
    megatron = baselines.megatron_pins(profile, cluster, la.NUM_RANKS, la.GLOBAL_BATCH)
    named, skipped = la.predict_grid(profile, cluster, grid + [("megatron", megatron)])
    named.append(("planner-search", baselines.planner_choice(profile, cluster)))
    say(f"  {model}: {len(named)} plans predicted ({len(skipped)} skipped)")
    return named, skipped


def _bracketed(model: str, before, plans: list, cluster, calibration: dict, info: dict, say, mid=()) -> list:
    """The launch's plans priced from `before`, the profiles `mid` taken between the launch's
    chunks and a profile taken right after the launch, combined (benchmarks/calibration.py);
    `info` gets the launch's drift, after and each mid profile over before, of the layer times
    and of the in-place TP overheads. A plan whose pins do not reproduce its own prediction from
    `before`, or a failed profile after, keeps its one-profile prediction (said in `info`)."""
    from meshplan.planner import estimate

    try:
        after = la.calibrate_model(model, calibration, say, when="after")
    except MeshplanError as exc:
        info["bracket_error"] = str(exc)
        say(f"  {model}: no profile after the launch ({exc}); its plans keep the profile before")
        return [plan for _, plan in plans]
    info["drift"] = bracket.layer_drift(before, after)
    if mid:
        info["mid_drift"] = [bracket.layer_drift(before, m) for m in mid]
    tp_drift = [bracket.tp_overhead_drift(before, p) for p in (after, *mid)]
    if all(d is not None for d in tp_drift):
        info["tp_drift"], info["tp_mid_drift"] = tp_drift[0], tp_drift[1:]
    both = bracket.combine_profiles([before, *mid, after])
    priced, kept = [], []
    for name, plan in plans:
        try:
            pins = la.pins_of(plan)
            again = estimate(before, cluster, la.request(pins)).prediction.step_time_s
            if abs(again / plan.prediction.step_time_s - 1) > 1e-6:
                raise ValueError(f"its pins price it at {again:.6f} s, not {plan.prediction.step_time_s:.6f} s")
            priced.append(estimate(both, cluster, la.request(pins)))
        except (MeshplanError, ValueError) as exc:
            kept.append(f"{name}: {exc}")
            priced.append(plan)
    if kept:
        info["kept_one_profile"] = kept
    return priced


def _retimer(model: str, calibration: dict, mid: list, say):
    """between(k) for la.measure_round: the model profiled again, appended to `mid`; a failed
    profile is said and skipped (the plans keep the profiles around the launch)."""

    def between(_chunk: int) -> None:
        try:
            mid.append(la.retime_model(model, calibration, say))
        except MeshplanError as exc:
            say(f"  {model}: no profile between the launch's chunks ({exc})")

    return between


FULL_ROUNDS = 5
"""Calibration rounds of the full (not --quick) local section; --rounds sets another count."""


def local_sections(quick: bool, say, rounds: int | None = None) -> tuple[dict, dict, dict]:
    """Sections 1, 2 and 4, which share the rounds of calibration, prediction and measurement.
    Per round: the links once, then per model its profile, predictions and launch back to back.
    `rounds` (the full grid only) replaces FULL_ROUNDS: each round is one calibration, so one round
    is the single-calibration measurement the targets are stated for."""
    grid = [g for g in la.GRID if g[0] in la.QUICK_GRID] if quick else la.GRID
    repeats, steps = (1, 4) if quick else (rounds or FULL_ROUNDS, 8)  # steps per pass; two passes per plan
    pairs: dict[str, dict[str, list]] = {}
    calibrations, launches = [], []
    failed_rounds, skipped = [], {}
    with tempfile.TemporaryDirectory(prefix="meshplan-bench-") as tmp:
        for rep in range(repeats):
            say(f"  round {rep + 1}/{repeats}: calibrate, predict, measure")
            try:
                cluster, calibration = la.calibrate_links(quick, say)
            except MeshplanError as exc:  # one bad calibration (a busy shared host) costs one round
                failed_rounds.append({"round": rep, "error": str(exc)})
                say(f"  round {rep + 1} skipped: {exc}")
                continue
            calibrations.append(calibration)
            for model in la.MODELS:
                try:
                    profile = la.calibrate_model(model, calibration, say)
                    plans, skipped[model] = _predict_model(model, profile, cluster, grid, say)
                except MeshplanError as exc:
                    failed_rounds.append({"round": rep, "model": model, "error": str(exc)})
                    say(f"  round {rep + 1}, {model} skipped: {exc}")
                    continue
                mid: list = []
                results, info = la.measure_round(
                    model, plans, rep, steps, Path(tmp), say, LAUNCH_CHUNKS, _retimer(model, calibration, mid, say)
                )
                priced = _bracketed(model, profile, plans, cluster, calibration, info, say, mid)
                launches.append(info)
                for (name, plan), repriced, result in zip(plans, priced, results):
                    pairs.setdefault(model, {}).setdefault(name, []).append((repriced, result, plan))
    if not pairs:
        raise MeshplanError(f"every round failed: {failed_rounds}")
    models, rows_by_model, speedups = {}, {}, {}
    for model, by_name in pairs.items():
        rows = [la.plan_row(name, plan_results) for name, plan_results in by_name.items()]
        summary = la.summarize(rows)
        speedups[model] = baselines.speedups(rows, summary["choice"])
        models[model] = {
            **summary,
            "baseline_speedups": speedups[model],
            "skipped": skipped.get(model, []),
            "rows": rows,
        }
        rows_by_model[model] = rows
    local = _overall(models)
    local.update(
        models=models,
        calibration=calibrations[0],
        calibrations=calibrations,
        targets=TARGETS,
        failed_rounds=failed_rounds,
        launches=launches,
        repeats=repeats,
        global_batch=la.GLOBAL_BATCH,
        num_ranks=la.NUM_RANKS,
    )
    return local, {**baselines.combine(speedups), "by_model": speedups}, memory_accuracy.summarize(rows_by_model)


def _overall(models: dict) -> dict:
    """Pooled MAPE (and the one-profile MAPE, `mape_before`); Kendall tau averaged over models;
    top-1 regret the worst model's."""
    rows = [r for m in models.values() for r in m["rows"] if "measured_s" in r]
    return {
        "mape": mape([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]),
        **la.mape_before(rows),
        "kendall_tau": statistics.fmean(m["kendall_tau"] for m in models.values()),
        "top1_regret": max(m["top1_regret"] for m in models.values()),
        "num_plans": len(rows),
    }


def gpu_section(say) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {
            "available": False,
            "note": "no GPU was available in this run; benchmarks/gpu_check.py is the "
            "prepared script (python -m benchmarks.gpu_check --out DIR)",
        }
    from benchmarks import gpu_check

    say("  CUDA present: running benchmarks.gpu_check")
    return {"available": True, **gpu_check.run(quick=False)}


def _section(name: str, fn, say, results: dict, timings: dict):
    start = time.perf_counter()
    say(f"[{name}]")
    try:
        value = fn()
    except Exception as exc:  # a broken section is reported, the others still run
        value = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        say(f"  {name} failed: {value['error']}")
    timings[name] = round(time.perf_counter() - start, 1)
    return value


LOCAL = ("local_accuracy", "baselines", "memory", "diagnostics")
"""The result keys section `local` writes (its rounds measure all four together)."""

METHOD_SECTIONS = {
    "compression": "benchmarks.compression_slow_link",
    "sync": "benchmarks.sync_methods",
    "offload": "benchmarks.offload",
    "kernel_bytes": "benchmarks.kernel_bytes",
    "papers": "benchmarks.dp_paper_methods",
    "deepspeed_bytes": "benchmarks.deepspeed_bytes",
}
"""Data-parallel method benchmarks (issues 15-17): module whose `bench_section(quick, say)` returns
the section's results. They run on 4 gloo ranks, the slow-link ones inside throttled namespaces."""

SECTIONS = ("local", "planner_speed", "executor_overhead", "gpu", *METHOD_SECTIONS)


def _local(quick: bool, say, results: dict, timings: dict, rounds: int | None = None) -> None:
    local = _section("local", lambda: local_sections(quick, say, rounds), say, results, timings)
    if isinstance(local, tuple):
        results["local_accuracy"], results["baselines"], results["memory"] = local
        results["diagnostics"] = diagnose(results["local_accuracy"], results["memory"])
    else:  # the error, recorded under every key the section owns
        results["local_accuracy"] = results["baselines"] = results["memory"] = local
        results.pop("diagnostics", None)


def _keep(name: str, previous: dict | None, results: dict, runs: dict) -> None:
    """A section not run this time: its results as the earlier run measured them, and that run
    named in `runs` (when the earlier file did not name one already)."""
    keys = LOCAL if name == "local" else (name,)
    if not previous:
        return
    results.update({key: previous[key] for key in keys if key in previous})
    if keys[0] in previous:
        runs.setdefault(
            name, {"started_utc": previous.get("started_utc"), "commit": previous.get("git", {}).get("commit")}
        )


def run_all(
    quick: bool, say, sections: tuple[str, ...] = SECTIONS, previous: dict | None = None, rounds: int | None = None
) -> dict:
    """Run `sections`; with `previous` (an earlier results dict), the sections not run are kept
    from it, each with the start time and commit of the run that measured it (`section_runs`).
    `rounds`: calibration rounds of the full local section (local_sections)."""
    import torch

    from benchmarks import executor_overhead, planner_speed

    timings: dict[str, float] = {}
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    results = {
        "quick": quick,
        "machine": machine_info(),
        "torch_version": torch.__version__,
        "git": git_state(),
        "started_utc": started,
    }
    runners = {
        "planner_speed": lambda: planner_speed.run(quick),
        "executor_overhead": lambda: executor_overhead.run(quick),
        "gpu": lambda: gpu_section(say),
        **{
            name: lambda name=name: importlib.import_module(METHOD_SECTIONS[name]).bench_section(quick, say)
            for name in METHOD_SECTIONS
        },
    }
    runs = dict((previous or {}).get("section_runs", {}))
    for name in SECTIONS:
        if name not in sections:
            _keep(name, previous, results, runs)
            continue
        if name == "local":
            _local(quick, say, results, timings, rounds)
        else:
            results[name] = _section(name, runners[name], say, results, timings)
        runs[name] = {"started_utc": started, "commit": results["git"].get("commit"), "quick": quick}
    results["section_times_s"] = {**(previous or {}).get("section_times_s", {}), **timings}
    results["section_runs"] = runs
    results["machine"]["load_average_end"] = machine_info()["load_average"]
    return results


def _clean(value):
    """JSON-safe: NaN/inf become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write(results: dict, out: Path) -> None:
    from benchmarks.report import markdown
    from meshplan.schema import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "benchmarks.json", json.dumps(_clean(results), indent=2) + "\n")
    write_text_atomic(out / "benchmarks.md", markdown(_clean(results)))


def _sections(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        raise SystemExit(f"--sections {text!r}: unknown section {unknown}; choose from {', '.join(SECTIONS)}")
    return names


def _rounds(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of rounds; e.g. --rounds 1")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="reports", help="folder for benchmarks.json and benchmarks.md")
    ap.add_argument("--quick", action="store_true", help="CI-sized run (a few minutes)")
    ap.add_argument(
        "--sections",
        type=_sections,
        default=SECTIONS,
        help=f"comma-separated subset of {','.join(SECTIONS)} (default all); the others are kept "
        "from OUT/benchmarks.json, each marked with the run that measured it",
    )
    ap.add_argument(
        "--rounds",
        type=_rounds,
        default=None,
        help=f"calibration rounds of the full local section (default {FULL_ROUNDS}; each round calibrates once "
        "and launches every plan of both models)",
    )
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.rounds is not None and args.quick:
        raise SystemExit("--rounds applies to the full local section; drop --quick (which runs one round of 6 plans)")
    say = _say(args.quiet)
    previous = None
    old = Path(args.out) / "benchmarks.json"
    if args.sections != SECTIONS and old.exists():
        previous = json.loads(old.read_text())
    start = time.perf_counter()
    results = run_all(args.quick, say, args.sections, previous, args.rounds)
    results["total_time_s"] = round(time.perf_counter() - start, 1)
    write(results, Path(args.out))
    say(f"wrote {args.out}/benchmarks.json and {args.out}/benchmarks.md in {results['total_time_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
