"""Round trips of every contract, and bad inputs that must fail with one line naming the field."""

from __future__ import annotations

import json

import pytest
from contract_fixtures import make_cluster, make_plan, make_profile, make_searched_plan

from meshplan import schema
from meshplan.cluster import ClusterSpec
from meshplan.errors import MeshplanError
from meshplan.model_profile import ModelProfile
from meshplan.plan import Plan
from meshplan.run_result import RunResult


@pytest.mark.parametrize(
    "cls,obj",
    [
        (Plan, make_plan()),
        (Plan, make_searched_plan()),
        (ModelProfile, make_profile()),
        (ClusterSpec, make_cluster()),
        (
            RunResult,
            RunResult(
                world_size=4,
                steps=3,
                losses=[3.0, 2.5, 2.0],
                step_time_s=0.1,
                tokens_per_s=100.0,
                peak_memory_bytes=1 << 20,
            ),
        ),
    ],
)
def test_round_trip(tmp_path, cls, obj):
    path = tmp_path / "x.json"
    schema.save(obj, path)
    loaded = schema.load(cls, path)
    assert loaded == obj
    assert schema.dumps(loaded) == path.read_text()  # byte-for-byte stable


def test_profile_graph_is_the_chain():
    g = make_profile().graph()
    assert list(g.nodes) == ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"]
    assert list(g.successors("layers.1")) == ["layers.2"]


def _plan_dict(**changes):
    data = schema.to_dict(make_plan())
    data.update(changes)
    return data


BAD_PLANS = [
    # (description, change to the plan dict, text the message must contain)
    ("unknown field", {"tensor_paralel_degree": 2}, "tensor_paralel_degree"),
    ("wrong type", {"microbatch_size": "2"}, "microbatch_size"),
    ("negative degree", {"tensor_parallel_degree": -2, "world_size": -8}, "tensor_parallel_degree"),
    ("product not world size", {"world_size": 8}, "world_size"),
    ("stage skips a layer", {"stages": [["embed", "layers.0"], ["layers.2", "layers.3", "head"]]}, "layers.1"),
    (
        "stage repeats a layer",
        {"stages": [["embed", "layers.0", "layers.1"], ["layers.1", "layers.2", "layers.3", "head"]]},
        "layers.1",
    ),
    ("unknown schedule", {"pipeline_schedule": "zigzag"}, "pipeline_schedule"),
    ("bad recompute mode", {"recompute": {"layers.0": "sometimes"}}, "recompute.layers.0"),
    ("batch arithmetic", {"global_batch_size": 15}, "global_batch_size"),
    ("zero stage", {"zero_stage": 5}, "zero_stage"),
    ("missing field", {"__drop__": "stages"}, "stages"),
    ("schema version", {"schema_version": 99}, "schema_version"),
    (
        "stage of an unknown layer",
        {"stages": [["embed", "layers.0", "layers.1"], ["layers.2", "layers.3", "lm_head"]]},
        "lm_head",
    ),
    ("wrong stage count", {"stages": [["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"]]}, "stages"),
    ("nested wrong type", {"prediction": {"step_time_s": "fast"}}, "prediction.step_time_s"),
]


@pytest.mark.parametrize("desc,change,needle", BAD_PLANS, ids=[b[0] for b in BAD_PLANS])
def test_bad_plan_names_the_field(tmp_path, desc, change, needle):
    data = _plan_dict()
    drop = change.pop("__drop__", None) if "__drop__" in change else None
    data.update(change)
    if drop:
        del data[drop]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MeshplanError) as info:
        schema.load(Plan, path)
    message = str(info.value)
    assert needle in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"num_nodes": 0}, "num_nodes"),
        (
            {"device": {"name": "x", "peak_flops": {"bf16": 1e12}, "memory_bytes": -1, "hbm_gbps": 1.0}},
            "device.memory_bytes",
        ),
        ({"intra_node": {"bandwidth_gbps": 0, "latency_s": 0}}, "intra_node.bandwidth_gbps"),
        ({"calibration": {"dp_overlap": 1.5}}, "calibration.dp_overlap"),
    ],
)
def test_bad_cluster_names_the_field(tmp_path, change, needle):
    data = schema.to_dict(make_cluster())
    data.update(change)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MeshplanError, match=needle.replace(".", r"\.")):
        schema.load(ClusterSpec, path)


def test_bad_profile_duplicate_layer(tmp_path):
    data = schema.to_dict(make_profile())
    data["layers"][2]["name"] = "layers.0"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MeshplanError, match="layers"):
        schema.load(ModelProfile, path)


def test_not_json_and_missing_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(MeshplanError, match="not valid JSON"):
        schema.load(Plan, path)
    with pytest.raises(MeshplanError, match="does not exist"):
        schema.load(Plan, tmp_path / "nope.json")


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    class Boom:
        def __str__(self):
            raise RuntimeError("boom")

    target = tmp_path / "out.json"
    with pytest.raises(TypeError):
        schema.save({"x": object()}, target)
    assert not target.exists() and list(tmp_path.iterdir()) == []
