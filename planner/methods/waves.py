"""Wavelet's cost model (the waves axis of meshplan/dp_methods.py): waves=2 runs each microbatch
as two half waves (b/2 samples each) on the same devices, the second (tock) started half a wave
period after the first (tick), so tock's forward (memory rising) overlaps tick's backward (memory
falling) and their activation peaks interleave (Wang et al., Wavelet, MLSys 2021, Sec 3). The
model prices the synchronous reading: both waves accumulate into the same gradients, all-reduced
once per step, so the updates are those of one wave of b. meshplan's executor (executor/waves.py)
runs the paper's job instead, 2N tasks of b/2 (the same global batch, the same per-device work
and activations, so this cost model applies to it), each wave all-reducing within itself and
the waves averaging models without waiting (approximate); it does not hold the half-period
offset once the two tasks share a core (it reports the drift); its second replica and
cross-wave exchange (one parameter copy a step each way) are priced in planner/rank/waves.py. Data-parallel layouts only
(feasibility.WAVES_NOT_RUN).

- Memory timeline (per rank, one wave period T = forward + backward of a half microbatch): layer
  i's saved activations a_i (at b/2) are held from the start of its forward, F_i = sum_{j<i} f_j,
  to the end of its backward, F_L + sum_{j>=i} g_j (backward runs L-1 .. 0); the peak is
  max_t sum_i a_i (held_i(t) + held_i(t - T/2)) over one period: a sweep over the intervals'
  ends. One wave's peak is sum_i a_i (at the end of forward); two interleaved half waves reach
  sum_i a_i + what the other wave holds then (~ A_peak + A_valley, Sec 3.1). The executor's
  waves are processes of their own, so weights, gradients, optimizer states and DDP's buckets
  are held twice, plus each wave's cross-wave model copies (planner/rank/waves.py CROSS_WAVE_*:
  three fp32 copies held, two more while one wave averages). Pipelines: the in-flight count of
  the schedule times the two-wave peak.
- Throughput: the device is shared, work-conserving: a microbatch costs both halves' compute,
  2 C (C = compute + recompute of one half wave at b/2's efficiency), and one wave's
  communication (tensor/context parallel, ZeRO gathers, pipeline p2p: X) runs behind the other
  wave's compute (Sec 3.2): max(2 C, 2 X) per microbatch. Once per step the tick starts alone
  and the tock ends alone (min(C, X) exposed, counted with the sync), and the summed gradients
  are all-reduced behind the tock's last backward (DDP's rule over one half wave's backward).
  Each wave process also steps its own optimizer and averages its model with its partner's once
  a step (memory passes over the parameters and the fp32 model sent across): on the shared
  device both are paid in series, twice a step.
"""

from __future__ import annotations


def two_wave_peak(acts: list[float], fwd: list[float], bwd: list[float]) -> float:
    """Peak of the summed activations of two waves offset by half a period (module docstring);
    per layer in forward order: saved bytes, forward and backward seconds."""
    total_f, period = sum(fwd), sum(fwd) + sum(bwd)
    if period <= 0:
        return 2 * sum(acts)
    always, events, start = 0.0, [], 0.0
    suffix = [sum(bwd[i:]) for i in range(len(bwd))]
    for a, f, tail in zip(acts, fwd, suffix):
        lo, hi = start, total_f + tail
        start += f
        for shift in (0.0, period / 2):
            if hi - lo >= period:  # held through the whole period
                always += a
                continue
            s, e = lo + shift, hi + shift
            if s >= period:
                s, e = s - period, e - period
            if e <= period:
                events += [(s, a), (e, -a)]
            else:  # wraps around the period's end
                events += [(s, a), (period, -a), (0.0, a), (e - period, -a)]
    peak = held = 0.0
    for _, delta in sorted(events):  # frees before allocations at the same instant
        held += delta
        peak = max(peak, held)
    return always + peak
