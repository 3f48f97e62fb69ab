"""The on-disk cache of meta-device profiles (meshplan/profile_cache.py): a second plan of the same
model and code reads the profile instead of capturing it; anything that could change the profile
changes the key; user factories and a disabled or broken cache fall back to capturing."""

from __future__ import annotations

import pytest

import meshplan
from meshplan import profile_cache, schema
from meshplan.inputs import build_profile

MODEL, SET = "gpt-tiny", ("layers=2",)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MESHPLAN_PROFILE_CACHE", "on")
    return tmp_path


def _spy(monkeypatch) -> list[str]:
    """Record every capture (profiler.profile_model call) and let it run."""
    import meshplan.profiler as profiler

    calls: list[str] = []
    real = profiler.profile_model

    def spy(model, *args, **kwargs):
        calls.append(model)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(profiler, "profile_model", spy)
    return calls


def test_a_second_build_reads_the_cache(cache, monkeypatch):
    calls = _spy(monkeypatch)
    first = build_profile(MODEL, SET)
    second = build_profile(MODEL, SET)
    assert calls == [MODEL]  # captured once
    assert schema.dumps(second) == schema.dumps(first)
    assert second.structure_hash and len(list(cache.rglob("*.json"))) == 1


def test_the_key_follows_the_model_its_values_and_the_versions(cache, monkeypatch):
    base = profile_cache.key(MODEL, {"layers": 2})
    assert base == profile_cache.key(MODEL, {"layers": 2})
    assert base != profile_cache.key(MODEL, {"layers": 3})
    assert base != profile_cache.key("gpt", {"layers": 2})
    monkeypatch.setattr(meshplan, "__version__", "0.0.0-other")
    assert base != profile_cache.key(MODEL, {"layers": 2})
    assert profile_cache.cache_dir().name == "0.0.0-other"  # one folder per meshplan version


def test_user_factories_are_never_cached(cache, tmp_path):
    assert profile_cache.key(f"{tmp_path}/model.py:build", {}) is None
    assert profile_cache.key("some.module:build", {}) is None
    assert profile_cache.key("hf:tiny-llama", {}) is not None


def test_off_or_broken_means_capture(cache, monkeypatch):
    calls = _spy(monkeypatch)
    build_profile(MODEL, SET)
    (entry,) = cache.rglob("*.json")
    entry.write_text("{not json")  # a torn or foreign file: a miss, then rewritten
    build_profile(MODEL, SET)
    monkeypatch.setenv("MESHPLAN_PROFILE_CACHE", "off")
    build_profile(MODEL, SET)
    assert calls == [MODEL] * 3
    assert profile_cache.load(MODEL, {"layers": 2}) is None
    monkeypatch.setenv("MESHPLAN_PROFILE_CACHE", "on")
    assert profile_cache.load(MODEL, {"layers": 2}) is not None  # the second capture rewrote it


def test_timed_profiles_neither_read_nor_write_the_cache(cache, monkeypatch):
    import meshplan.profiler as profiler

    meta = build_profile(MODEL, SET)
    (entry,) = cache.rglob("*.json")
    before = entry.read_text()
    calls: list[str] = []

    def timed(model, *args, **kwargs):  # stands for a CPU-timed profile (seconds of timing)
        calls.append(kwargs["device"])
        return meta

    monkeypatch.setattr(profiler, "profile_model", timed)
    assert build_profile(MODEL, SET, device="cpu", microbatches=[1]) is meta
    assert calls == ["cpu"] and entry.read_text() == before
