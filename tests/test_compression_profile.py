"""Measured compressor compute: `meshplan profile` times each registry compressor's
codec (profiler/codecs.py) and the planner's cost objects use it (planner/methods/compression.py).

- the profiler times every compressor the executor has a codec for, per layer with trainable
  parameters (identical shape sets once), at the registry defaults (Accordion critical), and
  splits a step into encode, per-rank decode and re-fit exactly as its docstring says (checked
  on a fake clock);
- the planner charges the measurement at the timed setting to the second (encode + group x
  decode + re-fit / refit_every), scales it by its own model's ratio to other settings and TP
  shards, and models the compute where nothing was measured on this kind of device;
- profiles without timings (older files) load, and timings survive the JSON round trip.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from meshplan import dp_methods
from meshplan.executor.wrappers import CODECS
from meshplan.model_profile import CodecTiming, LayerProfile, ModelProfile
from meshplan.planner.methods.compressors import compressor
from meshplan.presets import local_cpu
from meshplan.profiler import codecs as profiler_codecs
from meshplan.schema import from_dict, to_dict


def defaults(name: str, **given) -> dict:
    return dp_methods.method("compression", name).resolve(given, name)


def layer(name: str, shapes: list[list[int]]) -> LayerProfile:
    numel = sum(math.prod(s) for s in shapes)
    return LayerProfile(
        name=name,
        kind="x",
        num_params=numel,
        param_shapes=shapes,
        forward_flops=0,
        backward_flops=0,
        activation_bytes=0,
    )


def tiny_profile() -> ModelProfile:
    block = [[48, 16], [48], [16, 16], [16]]
    layers = [layer("embed", [[32, 16]]), layer("l0", block), layer("l1", block), layer("act", [])]
    return ModelProfile(
        model_name="t", seq_len=1, num_params=sum(lp.num_params for lp in layers), forward_flops_per_sample=0,
        num_layers=2, layers=layers, device="cpu",
    )  # fmt: skip


def test_every_codec_is_timed_per_distinct_layer_at_the_defaults():
    profile = tiny_profile()
    profiler_codecs.time_codecs(profile, "cpu")
    timed = profile.codec_timings
    assert set(timed) == set(CODECS) and set(CODECS) <= set(dp_methods.names("compression"))
    for name, t in timed.items():
        assert set(t.encode_s) == set(t.decode_s) == {"embed", "l0", "l1"}, name  # no parameters: no exchange
        assert t.encode_s["l0"] == t.encode_s["l1"] >= 0 and t.decode_s["l0"] == t.decode_s["l1"] >= 0, name
        assert t.encode_s["l0"] + t.decode_s["l0"] > 0, name  # one rank's exchange takes time
        assert set(t.refit_s) == ({"embed", "l0", "l1"} if name in ("alq", "amq") else set()), name
        expected = defaults(name, **({"critical_fraction": 1.0} if "critical_fraction" in t.params else {}))
        assert t.params == expected, name


def test_a_step_splits_into_encode_decode_per_rank_and_refit(monkeypatch):
    """On a fake clock (1 s + 0.25 s per rank decoded + 3 s when the levels are re-fitted):
    a group of g takes 1 + 0.25 g s: encode 1, decode 0.25 per rank, refit 3."""

    def fake_s(codec, comm, items, device, share):
        return 1.0 + 0.25 * comm.world + (3.0 if codec.params.get("refit_every") == 1 else 0.0)

    monkeypatch.setattr(profiler_codecs, "_exchange_s", fake_s)
    profile = tiny_profile()
    profiler_codecs.time_codecs(profile, "cpu")
    for name, t in profile.codec_timings.items():
        assert t.encode_s["l0"] == pytest.approx(1.0) and t.decode_s["l0"] == pytest.approx(0.25), name
    assert profile.codec_timings["alq"].refit_s["l0"] == pytest.approx(3.0)


def ctx_with(profile: ModelProfile, measured: bool = True):
    return SimpleNamespace(profile=profile, measured=measured, cluster=local_cpu(4))


def with_timing(name: str, params: dict, encode: float, decode: float, refit: float | None = None) -> ModelProfile:
    profile = tiny_profile()
    names = ["embed", "l0", "l1"]
    profile.codec_timings[name] = CodecTiming(
        params=params,
        encode_s=dict.fromkeys(names, encode),
        decode_s=dict.fromkeys(names, decode),
        refit_s=dict.fromkeys(names, refit) if refit is not None else {},
    )
    return profile


def cost(name: str, group: int = 4, **given):
    c = compressor(name, defaults(name, **given))
    c.group = group
    return c


def test_the_planner_charges_the_measurement_at_the_timed_setting():
    profile = with_timing("topk", defaults("topk"), 1e-3, 2e-4)
    lp = profile.layer("l0")
    assert cost("topk").compute_s(ctx_with(profile), lp, 1) == pytest.approx(1e-3 + 4 * 2e-4)
    assert cost("topk", group=2).compute_s(ctx_with(profile), lp, 1) == pytest.approx(1e-3 + 2 * 2e-4)
    alq = with_timing("alq", defaults("alq"), 1e-3, 0.0, refit=0.1)
    assert cost("alq", refit_every=4).compute_s(ctx_with(alq), alq.layer("l0"), 1) == pytest.approx(1e-3 + 0.025)


def test_other_settings_and_shards_scale_by_the_models_ratio():
    profile = with_timing("topk", defaults("topk"), 1e-3, 2e-4)
    ctx, lp = ctx_with(profile), profile.layer("l0")
    timed = cost("topk")
    for c, split in ((cost("topk", density=0.2), 1), (timed, 2)):
        ratio = c.modelled_s(ctx, lp, split) / timed.modelled_s(ctx, lp, 1)
        assert ratio != pytest.approx(1.0)
        assert c.compute_s(ctx, lp, split) == pytest.approx((1e-3 + 4 * 2e-4) * ratio)
    acc = with_timing("accordion", defaults("accordion", critical_fraction=1.0), 1e-3, 0.0)
    mixed = cost("accordion", critical_fraction=0.3)  # mostly at rank 1, cheaper than the timed rank 2
    assert 0 < mixed.compute_s(ctx_with(acc), acc.layer("l0"), 1) < 1e-3
    unset = cost("accordion")  # no share set: the band's top, every step at rank 2 as timed
    assert unset.compute_s(ctx_with(acc), acc.layer("l0"), 1) == pytest.approx(1e-3)


def test_unmeasured_layers_devices_and_compressors_are_modelled():
    profile = with_timing("topk", defaults("topk"), 1e-3, 2e-4)
    c = cost("topk")
    for ctx, lp in (
        (ctx_with(profile, measured=False), profile.layer("l0")),
        (ctx_with(profile), profile.layer("act")),
    ):
        assert c.compute_s(ctx, lp, 1) == c.modelled_s(ctx, lp, 1)
    q = cost("qsgd")
    assert q.compute_s(ctx_with(profile), profile.layer("l0"), 1) == q.modelled_s(
        ctx_with(profile), profile.layer("l0"), 1
    )


def test_profiles_without_timings_load_and_timings_round_trip():
    data = to_dict(with_timing("alq", defaults("alq"), 1e-3, 2e-4, refit=0.1))
    again = from_dict(ModelProfile, data)
    assert again.codec_timings == with_timing("alq", defaults("alq"), 1e-3, 2e-4, refit=0.1).codec_timings
    del data["codec_timings"]
    assert from_dict(ModelProfile, data).codec_timings == {}


def test_the_benchmarks_summary_and_markdown():
    """benchmarks/compression_slow_link's entry points on hand-made rows: errors, ordering against
    DDP per prediction, and one table per rate (what benchmarks/run.py's report prints)."""
    from benchmarks.compression_slow_link import PREDICTIONS, markdown, summarise

    def row(method, measured, predicted):
        return dict(
            method=method, measured_step_s=measured, predicted_step_s=dict.fromkeys(PREDICTIONS, predicted),
            measured_bytes=8, predicted_bytes=8, loss_last=2.0, notes=[],
        )  # fmt: skip

    rows = summarise([row("none", 1.0, 1.5), row("topk", 0.5, 2.0), row("qsgd", 2.0, 3.0)])
    assert rows[0]["error_pct"]["meta"] == pytest.approx(50.0) and rows[1]["error_pct"]["cpu"] == pytest.approx(300.0)
    assert rows[1]["ordering_holds"]["meta"] is False and rows[2]["ordering_holds"]["meta"] is True
    text = markdown({"steps": 8, "rates": [{"rate": "100mbit", "rows": rows}, {"rate": "1gbit", "error": "exit 1"}]})
    assert "100mbit: meta MAPE 133%, ordering 1/2" in text and "| topk | 0.500 | 2.000 |" in text
    assert "1gbit: exit 1" in text


def test_codec_host_share_adds_the_other_ranks_to_the_hosts_own_load(monkeypatch):
    """Codecs are timed in one process without busy neighbours: its wall / CPU m saw the host's
    other load only (m = (1 + L) / C), while R ranks run their codecs at once beside it:
    (R + L) / C = m + (R - 1) / C; an idle host (m = 1) gives R / C."""
    from meshplan.profiler import codecs
    from meshplan.profiler.step_timing import HostShare

    monkeypatch.setattr(codecs, "cores_available", lambda: 2)
    idle, loaded = HostShare(), HostShare()
    idle.add(1.0, 1.0)
    loaded.add(1.5, 1.0)  # L = 2 other runnable tasks on 2 cores
    assert codecs.rank_share(idle, 4) == 2.0 and codecs.rank_share(idle, 1) == 1.0
    assert codecs.rank_share(loaded, 4) == pytest.approx((4 + 2) / 2)
