"""waves=2 on real ranks (executor/waves.py): the two waves of one emulated device, pinned to one
core, the tock half an iteration late, models averaged across waves, the summed memory timeline;
and the summary's arithmetic on hand-made timelines."""

from __future__ import annotations

import json
import math

import pytest
from executor_plans import make_plan

from meshplan.errors import MeshplanError
from meshplan.executor import waves_launch as waves


def _timeline(path, wave, rank, ends, samples, core=0, averaged=3):
    path.mkdir(parents=True, exist_ok=True)
    body = {"wave": wave, "rank": rank, "core": core, "samples": samples, "step_ends": ends, "averaged": averaged}
    (path / f"wave{wave}.rank{rank}.json").write_text(json.dumps(body))


def test_summed_timeline_of_offset_peaks(tmp_path):
    """Each wave peaks at 10 above a 100 baseline for the first half of its period (1 s); the tock
    half a period late: the sum never holds both peaks, it peaks at 210 + 0, not 220."""
    plan = make_plan(dp=1, microbatch=4, microbatches=1)
    half = waves.wave_plan(plan)
    ends = [float(k) for k in range(1, 9)]

    def wave(offset):
        return [(t / 10 + offset, 110 if (t / 10) % 1 < 0.5 else 100) for t in range(0, 90)]

    _timeline(tmp_path, 0, 0, ends, wave(0.0))
    _timeline(tmp_path, 1, 0, [e + 0.5 for e in ends], wave(0.5))
    (device,) = waves.summarise(tmp_path, plan, half)["devices"]
    assert device["summed_peak_bytes"] == 210 and device["summed_dynamic_peak_bytes"] == 10
    assert device["wave_dynamic_peaks_bytes"] == [10, 10]
    assert device["tock_offset_s"] == pytest.approx(0.5)
    lo, hi = 2.5, 8.0  # the tock's second step end .. the tick's last
    steps = sum(1 for e in ends + [e + 0.5 for e in ends] if lo < e <= hi)
    assert device["samples_per_s"] == pytest.approx(steps * half.global_batch_size / (hi - lo))


def test_wave_plan_halves_the_microbatch_and_refuses_what_does_not_run():
    plan = make_plan(dp=2, microbatch=4, microbatches=2)
    half = waves.wave_plan(plan)
    assert (half.microbatch_size, half.global_batch_size, half.world_size) == (2, plan.global_batch_size // 2, 2)
    assert half.dp_methods.waves.name == "1"
    with pytest.raises(MeshplanError, match="data-parallel plans only"):
        waves.check(make_plan(tp=2))
    with pytest.raises(MeshplanError, match="even microbatch"):
        waves.check(make_plan(dp=2, microbatch=3))


@pytest.mark.slow
def test_two_waves_share_a_core_start_late_and_average(tmp_path):
    from meshplan.executor.launch import LaunchOptions

    plan = make_plan(dp=1, microbatch=4, microbatches=2)
    steps = 12
    opts = LaunchOptions(steps=steps, out_dir=str(tmp_path), quiet=True, timeout_s=240, optimizer="sgd", lr=0.1)
    report = waves.run(plan, opts, baseline=True)
    (device,) = report["devices"]
    tick, tock = (json.loads((tmp_path / "timelines" / f"wave{w}.rank0.json").read_text()) for w in (0, 1))
    assert len(tick["step_ends"]) == len(tock["step_ends"]) == steps
    assert tick["core"] == tock["core"] is not None  # one emulated device: one core for the pair
    assert tock["step_ends"][0] > tick["step_ends"][1]  # the tock started after the tick's second step
    assert min(device["cross_wave_averages"]) > 0  # each wave averaged with the other's model
    assert all(math.isfinite(x) for w in report["losses"].values() for x in w)
    assert report["losses"]["wave0"] != report["losses"]["wave1"]  # each wave its own data
    assert device["summed_peak_bytes"] > max(device["wave_peaks_bytes"]) and len(device["timeline"]) > 10
    assert report["one_wave"]["samples_per_s_per_device"] > 0 and (tmp_path / "waves.json").exists()
