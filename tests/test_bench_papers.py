"""benchmarks/dp_paper_methods.py's markdown on a hand-made result (no launch)."""

from __future__ import annotations

from benchmarks.dp_paper_methods import _side, markdown


def test_side_of_ddp():
    assert (_side(0.95), _side(1.005), _side(1.2)) == ("faster", "=", "slower")


def test_markdown_renders_every_table():
    bs = {"measured_step_s": 0.2, "predicted_step_s": 0.19, "measured_vs_ddp": 1.1, "predicted_vs_ddp": 1.02}
    result = {
        "config": {"layers": 4, "hidden": 256, "seq": 64},
        "ranks": 2,
        "repeats": 3,
        "steps": 6,
        "seconds": 100.0,
        "load_avg_1min": 5.0,
        "bytescheduler": [
            {"method": "ddp", "measured_step_s": 0.18, "predicted_step_s": 0.186},
            {"method": "bytescheduler", **bs, "same_side": True},
        ],
        "crossbow": [
            {
                "learners": k,
                "concurrent_samples_per_s": 10.0 * k,
                "sequential_samples_per_s": 9.0 * k,
                "concurrent_vs_sequential": 1.1,
                "predicted_samples_per_s": 9.5,
            }
            for k in (1, 2, 4)
        ],
        "dabmd": {
            "budget_ms": 50.0,
            "slow": "1:3",
            "ddp": {"step_s": 0.3, "loss": 5.5, "drop_per_s": 0.01},
            "dabmd": {"step_s": 0.12, "loss": 5.52, "drop_per_s": 0.02},
            "measured_step_ratio": 0.4,
            "dabmd_samples_per_round": 10.0,
            "ddp_samples_per_step": 16,
            "predicted": {"ddp_step_s": 0.31, "dabmd_step_s": 0.13, "dabmd_samples_per_round": 10.0},
            "predicted_step_ratio": 0.42,
        },
        "wavelet": {
            "measured": {
                "two_waves_samples_per_s": 40.0,
                "one_wave_samples_per_s": 50.0,
                "two_waves_summed_dynamic_peak_bytes": 3 * 2**20,
                "wave_dynamic_peaks_bytes": [2**21, 2**21],
                "one_wave_dynamic_peak_bytes": 4 * 2**20,
                "tock_offset": 0.4,
                "cross_wave_averages": [5, 6],
            },
            "predicted": {
                "two_waves_samples_per_s": 45.0,
                "one_wave_samples_per_s": 46.0,
                "two_waves_activation_bytes": 3 * 2**20,
                "one_wave_activation_bytes": 4 * 2**20,
            },
        },
    }
    text = markdown(result)
    assert "| bytescheduler | 0.2000 | 0.1900 | 1.100 | 1.020 | yes |" in text
    assert "| 4 | 40.0 | 36.0 | 1.100 | 9.5 |" in text
    assert "| measured s/step | 0.3000 | 0.1200 | 0.400 |" in text
    assert "| measured samples/s | 40.0 | 50.0 | 0.800 |" in text and "0.750" in text
