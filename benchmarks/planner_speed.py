"""Planner speed: search time and candidates for GPT-3 175B (A100-80GB, global batch 1536, seq
2048) and Llama-3 405B (H100-80GB, global batch 2048, seq 8192) from 8 to 16384 GPUs, and the
speedup over brute-force enumeration of the same plan space (meshplan.planner.bruteforce).

    python -m benchmarks.planner_speed [--quick] [--brute-force-cap-s 600] [--probe-s 20] [--json]
    python -m benchmarks.planner_speed --methods    # plain vs --allow-compression all --allow-sync all
    python -m benchmarks.planner_speed --cli        # the whole command's wall time, captured vs closed form

Targets: 175B on 1024 A100 under 1 s, 405B on 16384 H100 under 5 s of CPU. Profiles
come from meshplan.profiler.profile_model on the meta device (not timed here; no weights), or the
closed forms of meshplan.models.analytic without torch. search_time_s is CPU time of search(). Counts too small to
hold the model end in InfeasibleError; their time includes finding the fewest GPUs that fit.

Brute force: every plan of the space search() chooses from — every outer candidate,
every contiguous split into pp x v stages, every per-layer recompute choice — visited and costed
with the same cost model, no pruning. The full-size spaces hold 1e40 plans and more, so those rows
get a short probe (--probe-s CPU seconds): the exact space size, the plans visited, and an
extrapolation `brute_force_estimate_s` = space size x measured seconds per plan (an estimate, not
a measurement), with `speedup_lower_bound` = probe time / search time (brute force needs at least
that). Measured speedups come from the same model shapes with fewer layers (GPT-3 and Llama-3
blocks, 8 to 64 GPUs) whose spaces brute force finishes within --brute-force-cap-s.
"""

from __future__ import annotations

import argparse
import json
import math
import time

from meshplan import dp_methods
from meshplan.errors import InfeasibleError
from meshplan.models.analytic import GPT3_175B, LLAMA3_405B, gpt_profile, llama_profile
from meshplan.planner import PlanRequest
from meshplan.planner.search import search
from meshplan.planner.search.bruteforce import brute_force
from meshplan.presets import cluster_preset

GPT_SHAPE = ("layers", "hidden", "heads", "vocab", "seq")


def _profile(zoo: str, overrides: dict, closed_form):
    """The profiler's meta-device profile (as `meshplan plan --model` builds it); the planner's
    closed form when the profiler (torch) is unavailable."""
    try:
        from meshplan.profiler import profile_model
    except ImportError:
        return closed_form()
    return profile_model(zoo, overrides, device="meta")


def gpt3(layers: int = GPT3_175B["layers"]):
    """GPT-3 175B (Brown et al. 2020, Table 2.1), or its blocks with fewer layers."""
    shape = {**{k: GPT3_175B[k] for k in GPT_SHAPE}, "layers": layers}
    return _profile("gpt", shape, lambda: gpt_profile(**shape))


def llama3(layers: int = LLAMA3_405B["layers"]):
    """Llama-3 405B (Dubey et al. 2024, Table 3) at seq 8192, or its blocks with fewer layers."""
    overrides = {"seq": 8192} if layers == LLAMA3_405B["layers"] else {"seq": 8192, "layers": layers}
    return _profile("llama3-405b", overrides, lambda: llama_profile(**{**LLAMA3_405B, "layers": layers}))


FAMILIES = {"gpt3-175b": ("a100-80g", 1536, gpt3), "llama3-405b": ("h100-80g", 2048, llama3)}
"""model -> (cluster preset, global batch, profile(layers))."""
FULL_COUNTS = (8, 64, 256, 1024, 4096, 16384)
QUICK_COUNTS = {"gpt3-175b": (8, 1024), "llama3-405b": (16384,)}
REDUCED = [
    ("gpt3-175b", 2, (8,)),
    ("gpt3-175b", 4, (8, 64)),
    ("gpt3-175b", 6, (8, 64)),
    ("llama3-405b", 4, (8, 64)),
    ("llama3-405b", 6, (8, 32)),
]
"""(family, transformer blocks, GPU counts) whose brute force finishes: 0.3 s to 81 s of CPU each on
this host (about 4 min in all), spaces of 2e4 to 4e7 plans."""
QUICK_REDUCED = [("gpt3-175b", 2, (8,)), ("llama3-405b", 3, (8,))]
PROBE_S, QUICK_PROBE_S = 20.0, 0.5
"""CPU seconds of brute force on each full-size row: enough to extrapolate, never to finish."""


def _plan_text(plan) -> str:
    return (
        f"pp={plan.pipeline_parallel_degree} dp={plan.data_parallel_replicate_degree}x"
        f"{plan.data_parallel_shard_degree} tp={plan.tensor_parallel_degree} "
        f"b={plan.microbatch_size} {plan.pipeline_schedule} v={plan.virtual_stages} zero={plan.zero_stage}"
    )


ALLOW_ALL = {axis: tuple(dp_methods.approximate(axis)) for axis in ("compression", "sync")}
"""--allow-compression all --allow-sync all: every approximate method priced as a what-if."""


def measure(model: str, preset: str, global_batch: int, profile, num_gpus: int, allow: dict | None = None) -> dict:
    """search() once: its CPU time, candidates and choice."""
    start = time.process_time()
    wall = time.perf_counter()
    row = {
        "model": model,
        "cluster": preset,
        "num_gpus": num_gpus,
        "global_batch": global_batch,
        "allow": {k: list(v) for k, v in (allow or {}).items()},
    }
    try:
        plan = search(
            profile,
            cluster_preset(preset, num_gpus),
            PlanRequest(num_gpus=num_gpus, global_batch=global_batch, allow=dict(allow or {})),
        )
        s = plan.search
        row.update(
            candidates=s.num_candidates,
            evaluated=s.num_evaluated,
            rejected=s.num_rejected,
            feasible=True,
            mfu=round(plan.prediction.mfu, 4),
            step_time_s=plan.prediction.step_time_s,
            plan=_plan_text(plan),
            methods=" ".join(f"{a}={c.name}" for a, c in plan.dp_methods.non_default()) or "plain",
        )
    except InfeasibleError as exc:
        row.update(candidates=0, evaluated=0, rejected=0, feasible=False, step_time_s=None, plan=str(exc)[:120])
    row["search_time_s"] = round(time.process_time() - start, 4)
    row["wall_time_s"] = round(time.perf_counter() - wall, 4)
    return row


def _ratio(num, den):
    return None if num is None or not den else num / den


def compare_brute_force(row: dict, profile, cap_s: float) -> dict:
    """Brute force over the row's space for at most cap_s CPU seconds; the columns it adds."""
    request = PlanRequest(num_gpus=row["num_gpus"], global_batch=row["global_batch"])
    bf = brute_force(profile, cluster_preset(row["cluster"], row["num_gpus"]), request, cap_s=cap_s)
    search_s, estimate_s = row["search_time_s"], bf.estimate_s()
    out = {
        "brute_force_plans": bf.num_plans,
        "brute_force_plans_log10": round(math.log10(bf.num_plans), 2) if bf.num_plans else None,
        "brute_force_evaluated": bf.num_evaluated,
        "brute_force_finished": bf.finished,
        "brute_force_cap_s": cap_s,
        "brute_force_spent_s": round(bf.time_s, 4),
        "brute_force_s": round(bf.time_s, 4) if bf.finished else None,
        "brute_force_estimate_s": estimate_s,
        "brute_force_seconds_per_plan": bf.seconds_per_plan,
        "speedup": _ratio(bf.time_s, search_s) if bf.finished else None,
        "speedup_estimate": _ratio(estimate_s, search_s),
        "speedup_lower_bound": None if bf.finished else _ratio(bf.time_s, search_s),
    }
    if bf.finished and row["feasible"]:  # the same optimum, or search() is wrong
        out["brute_force_agrees"] = math.isclose(bf.best_step_s, row["step_time_s"], rel_tol=1e-9)
    return out


def _rows(model: str, layers: int | None, counts, cap_s: float, say) -> list[dict]:
    preset, batch, make = FAMILIES[model]
    profile = make() if layers is None else make(layers)
    name = model if layers is None else f"{model}-{layers}layer"
    out = []
    for n in counts:
        row = measure(name, preset, batch, profile, n)
        row["reduced_layers"] = layers
        row.update(compare_brute_force(row, profile, cap_s))
        say(row)
        out.append(row)
    return out


def run(
    quick: bool, brute_force_cap_s: float = 600.0, probe_s: float | None = None, say=lambda row: None
) -> list[dict]:
    """One row per (model, GPU count): model, cluster, num_gpus, search_time_s (CPU), candidates,
    and the brute-force columns (full-size models: probe only; `-Nlayer` models: to the end or the cap)."""
    probe_s = min(probe_s if probe_s is not None else QUICK_PROBE_S if quick else PROBE_S, brute_force_cap_s)
    rows = []
    for model in FAMILIES:
        rows += _rows(model, None, QUICK_COUNTS[model] if quick else FULL_COUNTS, probe_s, say)
    for model, layers, counts in QUICK_REDUCED if quick else REDUCED:
        rows += _rows(model, layers, counts, brute_force_cap_s, say)
    return rows


def methods_rows(say=lambda row: None, repeats: int = 5) -> list[dict]:
    """GPT-3 175B on 1024 A100-80GB, plain and with every approximate data-parallel method
    allowed, measured alternately `repeats` times in this process; the median CPU time of each
    (target: both under 1 s)."""
    preset, batch, make = FAMILIES["gpt3-175b"]
    profile = make()
    rows = []
    for allow in ({}, ALLOW_ALL):
        runs = [measure("gpt3-175b", preset, batch, profile, 1024, allow) for _ in range(repeats)]
        row = dict(
            runs[-1],
            search_time_s=sorted(r["search_time_s"] for r in runs)[repeats // 2],
            search_times_s=[r["search_time_s"] for r in runs],
        )
        say(row)
        rows.append(row)
    return rows


def _seconds(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def line(r: dict) -> str:
    same = {True: ", same optimum", False: ", DIFFERENT optimum"}.get(r.get("brute_force_agrees"), "")
    bf = (
        f"brute force {r['brute_force_s']:.2f} s, speedup {r['speedup']:.0f}x{same}"
        if r["brute_force_finished"]
        else f"brute force > {_seconds(r['brute_force_spent_s'])} s (est. {_seconds(r['brute_force_estimate_s'])} s, "
        f"speedup > {_seconds(r['speedup_lower_bound'])}x, est. {_seconds(r['speedup_estimate'])}x)"
    )
    return (
        f"{r['model']:20s} {r['cluster']:9s} {r['num_gpus']:6d} GPUs  {r['search_time_s']:7.3f} s CPU  "
        f"{r['candidates']:6d} candidates  {r['evaluated']:5d} evaluated  "
        f"1e{r['brute_force_plans_log10']} plans, {bf}  {r['plan']}"
    )


CLI_CASES = (
    (
        "GPT-3 175B, 1024 A100",
        "--cluster a100-80g --num-gpus 1024 --global-batch 1536",
        "gpt3-175b",
        "analytic:gpt --set layers=96 hidden=12288 heads=96 vocab=51200 seq=2048",
    ),
    (
        "Llama-3 405B, 16384 H100",
        "--cluster h100-80g --num-gpus 16384 --global-batch 2048",
        "llama3-405b --seq 8192",
        "analytic:llama --set layers=126 hidden=16384 heads=128 kv_heads=8 ffn_hidden=53248 vocab=128256 seq=8192",
    ),
)
"""(label, cluster flags, captured --model, closed-form --model) of the whole-command wall times."""


def _wall_s(argv: list[str], env: dict) -> float:
    import subprocess
    import sys

    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "meshplan", *argv], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def cli_rows(repeats: int = 3, say=lambda row: None) -> list[dict]:
    """Wall time of the whole `meshplan plan` command (interpreter start, imports, profile, search,
    output), median of `repeats`, interleaved: the closed form; the captured zoo model with an empty
    profile cache (torch imported, one block per distinct signature captured on the meta device);
    the same with the cache warm (meshplan/profile_cache.py: no torch)."""
    import os
    import statistics
    import tempfile

    rows = []
    # As an installed package runs: pip writes bytecode at install, so no import compiles source
    # (a host with PYTHONDONTWRITEBYTECODE set would otherwise add ~0.1 s of compile to every row).
    env_base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as root:  # one untimed captured run writes the bytecode
        warm = {**env_base, "MESHPLAN_PROFILE_CACHE": "on", "MESHPLAN_CACHE_DIR": root}
        _wall_s(["plan", *CLI_CASES[0][1].split(), "--quiet", "--model", *CLI_CASES[0][2].split()], warm)
    for label, cluster, captured, closed in CLI_CASES:
        times: dict[str, list[float]] = {"closed_form": [], "captured_cold": [], "captured_warm": []}
        with tempfile.TemporaryDirectory() as root:
            for i in range(repeats):
                env = {**env_base, "MESHPLAN_PROFILE_CACHE": "on", "MESHPLAN_CACHE_DIR": f"{root}/{i}"}
                base = ["plan", *cluster.split(), "--quiet"]
                times["closed_form"].append(_wall_s([*base, "--model", *closed.split()], env))
                times["captured_cold"].append(_wall_s([*base, "--model", *captured.split()], env))
                times["captured_warm"].append(_wall_s([*base, "--model", *captured.split()], env))
        row = {"case": label, **{k: statistics.median(v) for k, v in times.items()}, "samples_s": times}
        say(row)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized: 3 full-size rows, 2 small brute forces")
    parser.add_argument(
        "--brute-force-cap-s",
        type=float,
        default=600.0,
        help="CPU seconds after which a brute force stops and reports itself unfinished",
    )
    parser.add_argument(
        "--probe-s",
        type=float,
        default=None,
        help=f"brute-force CPU seconds on full-size models (default {PROBE_S}, quick {QUICK_PROBE_S})",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--cli",
        action="store_true",
        help="only the whole `meshplan plan` command's wall time: closed form, captured cold, captured warm",
    )
    parser.add_argument(
        "--methods",
        action="store_true",
        help="only GPT-3 175B on 1024 GPUs, plain vs every approximate method allowed (median of 5)",
    )
    args = parser.parse_args()
    if args.cli:
        rows = cli_rows(
            say=lambda r: (
                None
                if args.json
                else print(
                    f"{r['case']}: closed form {r['closed_form']:.2f} s, captured {r['captured_cold']:.2f} s cold "
                    f"/ {r['captured_warm']:.2f} s with the profile cache (wall, median of {len(r['samples_s']['closed_form'])})",
                    flush=True,
                )
            )
        )
        if args.json:
            print(json.dumps(rows, indent=2))
        return
    if args.methods:
        rows = methods_rows(
            lambda r: (
                None
                if args.json
                else print(
                    f"{r['model']} {r['num_gpus']} GPUs allow={r['allow'] or 'none'}: median {r['search_time_s']:.3f} s CPU "
                    f"of {r['search_times_s']}, {r['candidates']} candidates, {r['plan']} {r['methods']}",
                    flush=True,
                )
            )
        )
        if args.json:
            print(json.dumps(rows, indent=2))
        return
    say = (lambda row: None) if args.json else (lambda row: print(line(row), flush=True))
    rows = run(args.quick, args.brute_force_cap_s, args.probe_s, say)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
