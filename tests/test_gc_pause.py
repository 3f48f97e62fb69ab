"""The planner pauses the cyclic garbage collector only while it searches (planner/search/gc_pause.py)."""

from __future__ import annotations

import gc

import pytest

from meshplan.planner.search.gc_pause import gc_paused


def test_the_collector_is_off_inside_and_restored_after_even_on_error():
    seen = []

    @gc_paused
    def work(fail: bool):
        seen.append(gc.isenabled())
        if fail:
            raise ValueError("boom")
        return 7

    assert gc.isenabled()
    assert work(False) == 7 and seen == [False] and gc.isenabled()
    with pytest.raises(ValueError):
        work(True)
    assert gc.isenabled()
    gc.disable()
    try:
        work(False)
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()
