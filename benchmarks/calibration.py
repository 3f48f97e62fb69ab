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
about two minutes, and a profile's layer timing covers a few seconds: on an idle host of this
kind five profiles in a row put one model's summed layer time anywhere from 20 to 40 ms. So the
launch is also split in two (benchmarks.local_accuracy.measure_round, chunks) and the layers are
timed again between the halves (retime_model): each layer's time is then the median of three
timings spread over the launch, before, during and after its plans' runs.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Sequence

from meshplan.model_profile import ModelProfile


def _middle(values: list[float]) -> float:
    """The median of the profiles' values of one timing (the mean for two)."""
    return statistics.median(values)


def _middle_dict(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = dict.fromkeys(k for d in dicts for k in d)
    return {k: _middle([d[k] for d in dicts if k in d]) for k in keys}


def combine_profiles(profiles: list[ModelProfile], mid: Sequence[ModelProfile] = ()) -> ModelProfile:
    """One profile whose every measured time is the middle of `profiles`' (same model, same
    layers and microbatch sizes, measured at different times); everything else is the first's.
    `mid`: layer timings taken between the profiles (benchmarks.local_accuracy.retime_model,
    without the in-place wrapper measurements): they join the layers' forward, backward and
    optimizer-step times, not the in-place overheads."""
    if not profiles:
        raise ValueError("combine_profiles needs at least one profile")
    first = profiles[0]
    for other in [*profiles[1:], *mid]:
        if [lp.name for lp in other.layers] != [lp.name for lp in first.layers]:
            raise ValueError(f"profiles of different layers cannot be combined ({first.model_name})")
        for a, b in zip(first.layers, other.layers):
            if [t.microbatch_size for t in a.timings] != [t.microbatch_size for t in b.timings]:
                raise ValueError(f"layer {a.name}: profiles timed at different microbatch sizes")
    out = copy.deepcopy(first)
    for i, layer in enumerate(out.layers):
        same = [p.layers[i] for p in profiles]
        timed = same + [p.layers[i] for p in mid]
        for j, timing in enumerate(layer.timings):
            timing.forward_s = _middle([lp.timings[j].forward_s for lp in timed])
            timing.backward_s = _middle([lp.timings[j].backward_s for lp in timed])
        layer.optimizer_step_s = _middle([lp.optimizer_step_s for lp in timed])
        layer.framework_overhead_s = _middle_dict([lp.framework_overhead_s for lp in same])
    out.step_overhead_s = _middle_dict([p.step_overhead_s for p in profiles])
    for name, codec in out.codec_timings.items():
        same_codec = [p.codec_timings[name] for p in profiles if name in p.codec_timings]
        codec.encode_s = _middle_dict([c.encode_s for c in same_codec])
        codec.decode_s = _middle_dict([c.decode_s for c in same_codec])
        codec.refit_s = _middle_dict([c.refit_s for c in same_codec])
    out.notes = [
        *out.notes,
        f"bracketed: every measured time is the median of {len(profiles)} profiles taken around one launch"
        + (f", the layers' times also of {len(mid)} timing(s) taken during it" if mid else ""),
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
