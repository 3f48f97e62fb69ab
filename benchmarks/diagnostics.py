"""Why a target was missed: checks computed from the run's own data (never fitted to the grid).

Each check returns a finding {"check", "value", "text"} or None when it does not apply:
- host load: the 1-minute load average when the cost model was calibrated vs during the grid
  (timings on 2 shared cores scale with the number of runnable processes);
- error by family: median measured / predicted for plans with and without tensor parallelism
  (TP issues many small, latency-bound collectives, the most load-sensitive cost);
- memory without temporary buffers: the memory MAPE with the predicted `buffers_bytes` term
  removed, to show how much of the error that one term carries;
- recompute blind spot: measured peaks that do not drop (by 2% or more) when recompute is
  switched on, other things equal;
- profile outliers: a layer's measured time growing > 3x for a 2x larger microbatch;
- calibration drift: the same layer at the same microbatch timed in every round's calibration,
  slowest over fastest round (the host's own speed moving between calibrations, which the
  predictions of each round carry);
- launch drift: per model and round, the launch's common factor (median predicted / measured
  over its plans: the host's speed then moves every plan of the launch alike) and the MAPE left
  when each plan's ratio is divided by its launch's factor — the error between plans, which a
  host-wide speed change cannot cause. A decomposition of the headline MAPE, not a replacement;
- bracket drift: per launch, the model's layer time in the profile taken right after it over the
  one taken right before (benchmarks/calibration.py), and the step-time MAPE priced from the
  profile before alone beside the bracketed headline.
"""

from __future__ import annotations

import statistics


def host_load(local: dict) -> dict | None:
    """Load while calibrating vs after that round's grid launches, per round."""
    cals = local.get("calibrations") or ([local["calibration"]] if "calibration" in local else [])
    launches = local.get("launches", [])
    rounds = []
    for rep, cal in enumerate(cals):
        after = [x["load_average"][0] for x in launches if x.get("repetition", 0) == rep]
        if cal.get("load_average") and after:
            rounds.append((cal["load_average"][0], statistics.median(after)))
    if not rounds:
        return None
    shown = ", ".join(f"{c:.1f} -> {g:.1f}" for c, g in rounds)
    worse = sum(g > 2 * max(c, 1.0) for c, g in rounds)
    return {
        "check": "host_load",
        "value": [{"calibration": c, "grid_median": g} for c, g in rounds],
        "text": f"1-minute load average while calibrating -> after the grid launches, per round: {shown} "
        f"(2 cores; {worse} of {len(rounds)} round(s) measured the grid on a host more than twice "
        "as loaded as the profile saw).",
    }


def error_by_family(rows: list[dict]) -> dict | None:
    done = [r for r in rows if "measured_s" in r and "degrees" in r]
    tp = [r["measured_s"] / r["predicted_s"] for r in done if r["degrees"]["tp"] > 1]
    rest = [r["measured_s"] / r["predicted_s"] for r in done if r["degrees"]["tp"] == 1]
    if not tp or not rest:
        return None
    a, b = statistics.median(tp), statistics.median(rest)
    return {
        "check": "error_by_family",
        "value": {"tp": a, "no_tp": b},
        "text": f"median measured / predicted step time: {a:.2f}x for tensor-parallel plans, {b:.2f}x for the others.",
    }


def memory_without_buffers(rows: list[dict]) -> dict | None:
    pairs = [
        (
            r["predicted_memory_bytes"] - r["predicted_memory_breakdown"].get("buffers_bytes", 0),
            r["measured_memory_bytes"],
            r["predicted_memory_breakdown"].get("buffers_bytes", 0),
        )
        for r in rows
        if r.get("measured_memory_bytes") and r.get("predicted_memory_breakdown")
    ]
    if not pairs:
        return None
    mape = statistics.fmean(abs(p - m) / m for p, m, _ in pairs)
    biggest = max(b for _, _, b in pairs)
    return {
        "check": "memory_without_buffers",
        "value": {"mape": mape, "largest_buffers_bytes": biggest},
        "text": f"memory MAPE with the predicted temporary-buffer term removed: {mape * 100:.1f}% "
        f"(that term is up to {biggest / 2**20:.1f} MiB per rank in these predictions).",
    }


def recompute_blind_spot(rows_by_model: dict[str, list[dict]]) -> dict | None:
    by_key = {}
    for model, rows in rows_by_model.items():
        for r in rows:
            if "measured_memory_bytes" in r and "degrees" in r and " | " not in r["config"]:
                key = (model, tuple(sorted(r["degrees"].items())), r["config"].split(" recompute")[0])
                by_key.setdefault(key, {})[bool(r["recompute"])] = r["measured_memory_bytes"]
    same = [k for k, v in by_key.items() if len(v) == 2 and v[True] >= 0.98 * v[False]]
    if not same:
        return None
    return {
        "check": "recompute_blind_spot",
        "value": len(same),
        "text": f"{len(same)} configuration(s) measure no lower peak with recompute than without: the "
        "CPU peak is tracked on the first step, where AdamW creates its states after the "
        "backward, so the optimizer step, not the activations, sets that peak.",
    }


def profile_outliers(layer_timings: dict) -> dict | None:
    found = []
    for model, layers in layer_timings.items():
        for layer, by_mb in layers.items():
            sizes = sorted(by_mb, key=int)
            for small, big in zip(sizes, sizes[1:]):
                for i, phase in enumerate(("forward", "backward")):
                    ratio = by_mb[big][i] / max(by_mb[small][i], 1e-12)
                    if ratio > 1.5 * int(big) / int(small):
                        found.append(f"{model} {layer} {phase} mb {small}->{big}: x{ratio:.1f}")
    if not found:
        return None
    return {
        "check": "profile_outliers",
        "value": found,
        "text": "measured layer times that grow faster than 1.5x the microbatch ratio (noise in the "
        "profile, used as is by the cost model): " + "; ".join(found[:6]),
    }


def calibration_drift(calibrations: list[dict]) -> dict | None:
    """Per model, the largest slowest/fastest ratio over rounds of one layer's forward+backward
    time at one microbatch size."""
    if len(calibrations) < 2:
        return None
    worst: dict[str, tuple[float, str]] = {}
    timings = [c.get("layer_timings_s", {}) for c in calibrations]
    for model in timings[0]:
        for layer, by_mb in timings[0][model].items():
            for mb in by_mb:
                runs = [sum(t[model][layer][mb]) for t in timings if mb in t.get(model, {}).get(layer, {})]
                if len(runs) < 2 or min(runs) <= 0:
                    continue
                ratio = max(runs) / min(runs)
                if ratio > worst.get(model, (0.0, ""))[0]:
                    worst[model] = (ratio, f"{layer} mb {mb}: " + ", ".join(f"{r * 1e3:.2f}" for r in runs) + " ms")
    if not worst:
        return None
    return {
        "check": "calibration_drift",
        "value": {m: r for m, (r, _) in worst.items()},
        "text": "the same layer at the same microbatch, timed in each round's calibration, slowest over "
        "fastest round: "
        + "; ".join(f"{m} x{r:.2f} ({where})" for m, (r, where) in worst.items())
        + " — the host's speed moved between calibrations, and each round's predictions with it.",
    }


def launch_drift(rows_by_model: dict[str, list[dict]]) -> dict | None:
    """Launch factors per model and the MAPE with them divided out (rows' `rounds` pairs)."""
    factors, ratios = {}, []
    for model, rows in rows_by_model.items():
        paired = [r["rounds"] for r in rows if r.get("rounds")]
        if not paired:
            continue
        count = max(len(p) for p in paired)
        launch = []
        for k in range(count):
            ks = [p[k][0] / p[k][1] for p in paired if k < len(p) and p[k][1]]
            launch.append(statistics.median(ks) if ks else None)
        factors[model] = launch
        for p in paired:
            norm = [pk[0] / pk[1] / launch[k] for k, pk in enumerate(p) if pk[1] and launch[k]]
            if norm:
                ratios.append(statistics.median(norm))
    if not ratios or max(len(f) for f in factors.values()) < 2:
        return None
    mape = statistics.fmean(abs(x - 1) for x in ratios)
    shown = "; ".join(f"{m} " + ", ".join("-" if f is None else f"{f:.2f}" for f in fs) for m, fs in factors.items())
    return {
        "check": "launch_drift",
        "value": {"factors": factors, "mape_between_plans": mape},
        "text": f"median predicted / measured over each launch's plans, per round: {shown} — the host's "
        f"speed during a launch moves all its plans alike; with each launch's factor divided out "
        f"the step-time MAPE is {mape * 100:.1f}% (the error between plans; the headline keeps "
        "the factors).",
    }


def _per_launch(ratios: list[tuple[str, int, float]]) -> tuple[str, str]:
    """(model, repetition, ratio) per launch written out, and the ratio furthest from 1 with its
    launch: ("gpt-tiny #1 x1.03; llama-tiny #1 x0.97", "x0.97, llama-tiny #1")."""
    worst = max(ratios, key=lambda d: max(d[2], 1 / d[2]))
    shown = "; ".join(f"{m} #{rep + 1} x{d:.2f}" for m, rep, d in ratios)
    return shown, f"x{worst[2]:.2f}, {worst[0]} #{worst[1] + 1}"


def bracket_drift(local: dict) -> dict | None:
    """Each launch's after/before layer-time ratio and the one-profile MAPE beside the bracketed one."""
    drifts = [(x["model"], x.get("repetition", 0), x["drift"]) for x in local.get("launches", []) if "drift" in x]
    if not drifts or "mape_before" not in local:
        return None
    shown, largest = _per_launch(drifts)
    return {
        "check": "bracket_drift",
        "value": {"drifts": [d for _, _, d in drifts], "mape_before": local["mape_before"], "mape": local["mape"]},
        "text": f"the model's layer time profiled right after each launch over right before it: {shown} "
        f"(largest {largest}); priced from the profile before each "
        f"launch alone the step-time MAPE is {local['mape_before'] * 100:.1f}%, from the two profiles' "
        f"middle {local['mape'] * 100:.1f}% (the headline).",
    }


def _ratios_check(check: str, moves: list[tuple[str, int, float]], describe) -> dict | None:
    """A check over (model, repetition, ratio) per launch: the ratios, and `describe(shown,
    largest)` for its text (_per_launch); None without any."""
    if not moves:
        return None
    shown, largest = _per_launch(moves)
    return {"check": check, "value": {"ratios": [d for _, _, d in moves]}, "text": describe(shown, largest)}


def tp_drift(local: dict) -> dict | None:
    """Each launch's in-place tensor-parallel overheads, summed over the model's layers, in the
    profiles after the launch and between its halves over the one before
    (benchmarks/calibration.tp_overhead_drift): the term most of a TP plan's price rests on."""
    moves = [
        (x["model"], x.get("repetition", 0), d)
        for x in local.get("launches", [])
        if "tp_drift" in x
        for d in (x["tp_drift"], *x.get("tp_mid_drift", []))
    ]
    return _ratios_check(
        "tp_drift",
        moves,
        lambda shown, largest: (
            "the in-place TP overheads (waits on partner ranks sharing the cores; most of a TP "
            "plan's price) summed over the layers, in the profiles after each launch and between its halves over "
            f"the one before: {shown} (largest {largest}); each plan is priced from the three profiles' median."
        ),
    )


def pass_drift(local: dict) -> dict | None:
    """Each launch's second pass over its first (median over its plans: benchmarks.local_accuracy
    .measure_round runs the plans A B ... B A)."""
    passes = [
        (x["model"], x.get("repetition", 0), x["pass_ratio"]) for x in local.get("launches", []) if x.get("pass_ratio")
    ]
    return _ratios_check(
        "pass_drift",
        passes,
        lambda shown, largest: (
            "each plan runs twice per launch in mirrored order; median step time of the second "
            f"run over the first: {shown} (largest {largest}) — the host's move within a launch, which the mirrored "
            "order spreads over all its plans alike."
        ),
    )


def diagnose(local: dict, memory: dict) -> list[dict]:
    by_model = {name: m.get("rows", []) for name, m in local.get("models", {}).items()}
    rows = [r for model_rows in by_model.values() for r in model_rows]
    checks = [
        host_load(local),
        error_by_family(rows),
        memory_without_buffers(rows),
        recompute_blind_spot(by_model),
        profile_outliers(local.get("calibration", {}).get("layer_timings_s", {})),
        calibration_drift(local.get("calibrations", [])),
        launch_drift(by_model),
        bracket_drift(local),
        tp_drift(local),
        pass_drift(local),
    ]
    return [c for c in checks if c is not None]
