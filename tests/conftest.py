"""Profiles that several test modules measure, made once per test session.

A CPU profile of a tiny zoo model takes several seconds on 2 cores (every representative layer
timed, then its wrappers); the tests that read the same model share one. Profiles that a test
must make itself (because it measures the profiling, or spies on it) stay in the test."""

from __future__ import annotations

import functools
import os

import pytest

# Each test captures its own profiles: the on-disk profile cache (meshplan/profile_cache.py) would
# let one test's capture answer another's and write under ~/.cache; its own tests turn it on.
os.environ.setdefault("MESHPLAN_PROFILE_CACHE", "off")

CPU_MICROBATCHES = (2, 4)
"""Microbatch sizes of the shared CPU profiles: the smallest and a larger one."""


@pytest.fixture(scope="session")
def zoo_cpu_profile():
    """`zoo_cpu_profile(name)`: the zoo model `name` profiled on this CPU at CPU_MICROBATCHES, made
    on first use and shared by every test of the session (treat it as read-only)."""
    from meshplan.profiler import profile_model

    @functools.cache
    def make(name: str):
        return profile_model(name, device="cpu", microbatch_sizes=list(CPU_MICROBATCHES))

    return make
