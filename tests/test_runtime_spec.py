"""The runtime spec (planner/runtime_spec.py): the request's behaviours resolved once into typed
fields, the state layout a row of meshplan/runtimes.py STATE_LAYOUTS; below the request no planner
module reads the layout's name or compares a layout string."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from meshplan.errors import MeshplanError
from meshplan.models.analytic import gpt_profile
from meshplan.planner import PlanRequest
from meshplan.planner.context import Context
from meshplan.presets import cluster_preset
from meshplan.runtimes import RUNTIMES, STATE_LAYOUTS, request_behaviours

PLANNER = Path(__file__).resolve().parent.parent / "planner"
RESOLVERS = {"context.py", "request.py", "runtime_spec.py"}
"""The modules that turn the request into the spec (the only readers of request.state_layout)."""


def _ctx(**request) -> Context:
    profile = gpt_profile(layers=2, hidden=256, heads=4, seq=128)
    return Context.build(profile, cluster_preset("h100-80g", 8), PlanRequest(num_gpus=8, global_batch=8, **request))


@pytest.mark.parametrize("layout", sorted(STATE_LAYOUTS))
def test_the_spec_carries_the_layouts_row_and_is_frozen(layout):
    spec = _ctx(state_layout=layout).spec
    assert spec.state is STATE_LAYOUTS[layout]
    assert sum(spec.state.state_bytes) == {"torch": 16, "megatron": 18, "zero": 16}[layout]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.elementwise = "eager"  # type: ignore[misc]


def test_an_unknown_layout_is_one_clear_error():
    with pytest.raises(MeshplanError, match="state_layout 'apex' is unknown; use torch, megatron or zero"):
        _ctx(state_layout="apex")


def test_the_fsdp_gather_width_is_resolved_once():
    assert _ctx().spec.fsdp_gather_bytes == 2  # bf16
    assert _ctx(precision="fp32").spec.fsdp_gather_bytes == 4
    assert _ctx(fsdp_gather_bytes=4).spec.fsdp_gather_bytes == 4
    # the reduce-scatter: the request's, else the state layout's (torch: fp32), else the gather width
    assert _ctx().spec.fsdp_reduce_bytes == 4
    assert _ctx(fsdp_reduce_bytes=2).spec.fsdp_reduce_bytes == 2
    assert _ctx(state_layout="zero").spec.fsdp_reduce_bytes == 2
    assert _ctx(fsdp_reduce_bytes=2, precision="fp32").spec.fsdp_reduce_bytes == 4
    assert _ctx().spec.fsdp_unit_buffers == "fsdp2"


def test_the_engine_rows_that_left_the_layout_keep_what_each_runtimes_own_layout_priced():
    """zero1_grad_collective, sp_regather and pp_scatter_gather were StateLayout fields, Megatron's under the
    megatron layout: each runtime's row gives what its own layout priced, so its plans do not move; but for
    DeepSpeed's pipeline engine, which splits a boundary over the tensor-parallel group (pipe_partitioned,
    its default), where the zero layout had priced the whole replica."""
    for rt in RUNTIMES.values():
        megatron = rt.value("state_layout") == "megatron"
        got = tuple(rt.value(k) for k in ("zero1_grad_collective", "sp_regather", "pp_scatter_gather"))
        expected = ("reduce_scatter", True, True) if megatron else ("all_reduce", False, rt.name == "deepspeed")
        assert got == expected, rt.name
        spec = _ctx(**request_behaviours(rt.name, {})).spec
        assert (spec.zero1_grad_collective, spec.sp_regather, spec.pp_scatter_gather) == got, rt.name


def test_no_planner_module_below_the_request_reads_the_layout_by_name():
    found = []
    for path in sorted(PLANNER.rglob("*.py")):
        if path.parent == PLANNER and path.name in RESOLVERS:
            continue
        where = path.relative_to(PLANNER)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "state_layout":
                found.append(f"{where}:{node.lineno} reads .state_layout")
            if isinstance(node, ast.Compare):
                consts = [c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)]
                if any(isinstance(c, str) and c in ("torch", "megatron") for c in consts):
                    found.append(f"{where}:{node.lineno} compares a layout name")
    assert found == []


def test_every_behaviour_flag_comes_from_its_row_and_reaches_the_request():
    """The CLI's behaviour flags are the table's rows (meshplan/runtimes.py ROWS): each parses and
    lands in the PlanRequest field of its row, converted where the row says."""
    from meshplan import runtimes
    from meshplan.inputs import PlanOptions
    from meshplan.options import plan_parser

    parser = plan_parser("plan")
    for row in runtimes.ROWS:
        if row.flag is None or not row.request:
            continue
        flag = row.flag
        if flag.choices:
            argv, want = [flag.name, flag.choices[-1]], flag.choices[-1]
        elif flag.number:
            argv, want = [flag.name, "7"], 7
        else:
            argv, want = [flag.name], True
        if flag.to_request:
            want = flag.to_request[str(want)]
        ns = parser.parse_args(["--model", "gpt2-small", "--cluster", "h100-80g", "--global-batch", "8", *argv])
        assert runtimes.flag_overrides(PlanOptions.of(ns).behaviours)[row.name] == want, row.name
    assert runtimes.REQUEST_FIELDS == tuple(r.name for r in runtimes.ROWS if r.request)
    assert set(runtimes.REQUEST_FIELDS) <= {f.name for f in dataclasses.fields(PlanRequest)}


def test_each_spec_field_copied_from_the_request_has_the_requests_type():
    """Context.spec copies every RuntimeSpec field but the resolved ones (the state layout and the
    FSDP widths and buffers) from the PlanRequest field of the same name: the annotations must agree
    (what mypy cannot see through the copy)."""
    from meshplan.planner.runtime_spec import RuntimeSpec

    resolved = ("state", "fsdp_gather_bytes", "fsdp_reduce_bytes", "fsdp_unit_buffers")
    request = {f.name: f.type for f in dataclasses.fields(PlanRequest)}
    copied = {f.name: f.type for f in dataclasses.fields(RuntimeSpec) if f.name not in resolved}
    assert {name: request.get(name) for name in copied} == copied
