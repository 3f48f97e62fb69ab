"""Every data-parallel method of the registry (meshplan/dp_methods.py) has its planner cost object
in its axis' table (planner/methods/), as every one has its executor module
(tests/test_dp_methods_executor.py): a row without one would fail only when a search reached it."""

from __future__ import annotations

from meshplan import dp_methods
from meshplan.planner.methods.comm_schedule import SCHEDULES
from meshplan.planner.methods.compressors import COMPRESSORS
from meshplan.planner.methods.offload import OFFLOADS
from meshplan.planner.methods.sync import SYNCS

TABLES = {"compression": COMPRESSORS, "sync": SYNCS, "comm_schedule": SCHEDULES, "offload": OFFLOADS}
WAVES = ("1", "2")
"""The waves the planner prices: planner/rank/waves.py runs waves=2 as two half waves, "1" as is."""


def test_every_registry_row_has_a_planner_cost_object():
    planned = {(axis, name) for axis, table in TABLES.items() for name in table} | {("waves", w) for w in WAVES}
    assert planned == {(m.axis, m.name) for m in dp_methods.METHODS}


def test_each_cost_object_answers_to_its_registry_name():
    for table in (COMPRESSORS, SYNCS, SCHEDULES):
        assert all(cls.name == name for name, cls in table.items())
