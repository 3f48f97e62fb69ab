"""Section 1's calibration taken on both sides of a launch, and the two combined.

The 2-core host's speed moves by up to 2x over minutes (diagnostics.calibration_drift measured
one layer's time 2.1x apart between rounds). A profile taken right before a launch then describes
a machine the launch may no longer run on: in one round every plan came out 20-30% fast or slow
alike (diagnostics.launch_drift). So each model is profiled again right after its launch, and
its plans are priced from the two profiles combined, per measured time: the plans ran between
the two, and the middle of the two is the best estimate of the host they ran on that uses no
measurement of the plans themselves. The plans to run are still chosen from the first profile
alone, as a user would choose them; the report keeps that one-profile prediction beside the
bracketed one (`predicted_before_s`) and the after/before ratio of each launch (`drift`).

Only measured times are combined (layer forward/backward, the optimizer step, the in-place
wrapper and step overheads, codec times); the structure of the two profiles must be the same.

One profile before and one after still describe the host at two moments around a launch of
about two minutes, and a profile's timing covers a few seconds: on an idle host of this kind five
profiles in a row put one model's summed layer time anywhere from 20 to 40 ms, and the in-place
tensor-parallel overheads, most of a TP plan's price, move as much (they are waits on partner
ranks that share the cores). So the launch is also split in two
(benchmarks.local_accuracy.measure_round, chunks) and the model is profiled again, in-place
wrappers included, between the halves (retime_model): every measured time is then the median of
three profiles spread over the launch, before, during and after its plans' runs.
"""

from __future__ import annotations

import copy
import statistics

from meshplan.model_profile import ModelProfile


def _middle(values: list[float]) -> float:
    """The median of the profiles' values of one timing (the mean for two)."""
    return statistics.median(values)


def _middle_dict(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = dict.fromkeys(k for d in dicts for k in d)
    return {k: _middle([d[k] for d in dicts if k in d]) for k in keys}


def combine_profiles(profiles: list[ModelProfile]) -> ModelProfile:
    """One profile whose every measured time is the median of `profiles`' (the mean of two; same
    model, same layers and microbatch sizes, measured at different times); everything else is the
    first's."""
    if not profiles:
        raise ValueError("combine_profiles needs at least one profile")
    first = profiles[0]
    for other in profiles[1:]:
        if [lp.name for lp in other.layers] != [lp.name for lp in first.layers]:
            raise ValueError(f"profiles of different layers cannot be combined ({first.model_name})")
        for a, b in zip(first.layers, other.layers):
            if [t.microbatch_size for t in a.timings] != [t.microbatch_size for t in b.timings]:
                raise ValueError(f"layer {a.name}: profiles timed at different microbatch sizes")
    out = copy.deepcopy(first)
    for i, layer in enumerate(out.layers):
        same = [p.layers[i] for p in profiles]
        for j, timing in enumerate(layer.timings):
            timing.forward_s = _middle([lp.timings[j].forward_s for lp in same])
            timing.backward_s = _middle([lp.timings[j].backward_s for lp in same])
        layer.optimizer_step_s = _middle([lp.optimizer_step_s for lp in same])
        layer.framework_overhead_s = _middle_dict([lp.framework_overhead_s for lp in same])
    out.step_overhead_s = _middle_dict([p.step_overhead_s for p in profiles])
    for name, codec in out.codec_timings.items():
        same_codec = [p.codec_timings[name] for p in profiles if name in p.codec_timings]
        codec.encode_s = _middle_dict([c.encode_s for c in same_codec])
        codec.decode_s = _middle_dict([c.decode_s for c in same_codec])
        codec.refit_s = _middle_dict([c.refit_s for c in same_codec])
    out.notes = [
        *out.notes,
        f"bracketed: every measured time is the median of {len(profiles)} profiles taken around and during one launch",
    ]
    return out


def layer_drift(before: ModelProfile, after: ModelProfile) -> float:
    """How much slower the host ran the model's layers after a launch than before it: the median
    over microbatch sizes of the summed forward+backward time of the measured layers, after over
    before (1.0 = no drift)."""
    sums: dict[int, list[float]] = {}
    for profile in (before, after):
        per_mb: dict[int, float] = {}
        for layer in profile.layers:
            for t in layer.timings:
                if not t.reused_from:
                    per_mb[t.microbatch_size] = per_mb.get(t.microbatch_size, 0.0) + t.forward_s + t.backward_s
        for mb, total in per_mb.items():
            sums.setdefault(mb, []).append(total)
    ratios = [s[1] / s[0] for s in sums.values() if len(s) == 2 and s[0] > 0]
    return statistics.median(ratios) if ratios else 1.0


TP_OVERHEAD_PREFIXES = ("tp@", "tp_sp@")
"""framework_overhead_s keys of the in-place tensor-parallel overheads (profiler/insitu.py)."""


def tp_overhead_drift(before: ModelProfile, other: ModelProfile) -> float | None:
    """How much the in-place tensor-parallel overheads moved between two profiles: the median
    over wrapper, degree and microbatch keys ("tp@2:b1", "tp_sp@4:b8", forward+backward) of the
    overhead summed over the model's layers, `other` over `before`; None when the two share no
    measured key (--concurrent 1, a model no degree divides)."""
    sums: list[dict[str, float]] = []
    for profile in (before, other):
        per_key: dict[str, float] = {}
        for layer in profile.layers:
            for key, value in layer.framework_overhead_s.items():
                if key.startswith(TP_OVERHEAD_PREFIXES) and not key.endswith(":fwd"):
                    per_key[key] = per_key.get(key, 0.0) + value
        sums.append(per_key)
    ratios = [sums[1][k] / v for k, v in sums[0].items() if v > 0 and k in sums[1]]
    return statistics.median(ratios) if ratios else None
