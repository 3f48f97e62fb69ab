"""Issue #17: offload=cpu/nvme (host optimizer step, NVMe state files), the delayed update,
comm_schedule=bytescheduler, waves=2's refusal, and the planner's offload fallback.

Expectations from first principles: the host optimizer runs torch's own optimizer parameter by
parameter, so on CPU it equals in-memory training bit for bit; chunking an all-reduce does not
change an element-wise sum, so bytescheduler equals DDP bit for bit; the delayed update follows
x_{t+1} = x_t - lr g(x_{t-1}), x_1 = x_0 (ZeRO-Offload Sec 5).
"""

from __future__ import annotations

import copy
import errno
import os
from pathlib import Path

import pytest
import torch
from executor_plans import make_plan

from meshplan import dp_methods, feasibility
from meshplan.comm_bytes import ByteCounter
from meshplan.errors import MeshplanError
from meshplan.executor.methods.host_optimizer import host_optimizer_class
from meshplan.executor.methods.nvme_store import store_factory
from meshplan.plan import MethodChoice

ADAMW = dict(lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95))


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _train(make, steps=5, net=None):
    net = copy.deepcopy(net or _net())
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    opt, history = make(net), []
    for _ in range(steps):
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()
        history.append([p.detach().clone() for p in net.parameters()])
    if hasattr(opt, "close"):
        opt.close()
    return history


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for sa, sb in zip(a, b) for x, y in zip(sa, sb))


def test_host_and_nvme_optimizers_equal_in_memory_adamw_bit_for_bit(tmp_path):
    ref = _train(lambda m: torch.optim.AdamW(m.parameters(), **ADAMW))
    counter = ByteCounter()
    host = _train(lambda m: host_optimizer_class(torch.optim.AdamW, counter=counter)(m.parameters(), **ADAMW))
    folder = tmp_path / "offload" / "rank0"
    nvme = _train(
        lambda m: host_optimizer_class(
            torch.optim.AdamW, counter=counter, store_factory=store_factory(folder, "adamw")
        )(m.parameters(), **ADAMW)
    )
    assert _equal(host, ref) and _equal(nvme, ref)
    assert not folder.exists()  # the state files are removed at close()


def test_nvme_states_are_on_disk_between_steps(tmp_path):
    folder = tmp_path / "states"
    net = _net()
    opt = host_optimizer_class(torch.optim.AdamW, counter=ByteCounter(), store_factory=store_factory(folder, "adamw"))(
        net.parameters(), **ADAMW
    )
    net(torch.randn(4, 8)).sum().backward()
    opt.step()
    files = sorted(folder.glob("*.bin"))
    n = sum(p.numel() for p in net.parameters())
    assert len(files) == 4 and sum(f.stat().st_size for f in files) == 2 * 4 * n  # exp_avg + exp_avg_sq
    assert all(set(opt.entries[i][3].state[opt.entries[i][2]]) == {"step"} for i in range(4))  # not in memory
    opt.close()
    assert not folder.exists()


def test_a_full_disk_is_one_clear_error_and_leaves_no_files(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    folder = tmp_path / "offload" / "rank0"
    with pytest.raises(MeshplanError, match="not enough disk space for offload=nvme"):
        store_factory(folder, "adamw")(list(_net().parameters()))
    assert not folder.exists()


def test_delayed_update_follows_the_one_step_stale_recurrence():
    lr, steps = 0.1, 5
    got = _train(
        lambda m: host_optimizer_class(torch.optim.SGD, delayed=True, counter=ByteCounter())(m.parameters(), lr=lr),
        steps=steps,
    )
    net = copy.deepcopy(_net())
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))

    def grad_at(params):
        for p, v in zip(net.parameters(), params):
            p.data.copy_(v)
            p.grad = None
        net(x).pow(2).mean().backward()
        return [p.grad.clone() for p in net.parameters()]

    xs = [[p.detach().clone() for p in net.parameters()]]
    xs.append([v.clone() for v in xs[0]])  # x_1 = x_0: the first update lands one step late
    for t in range(1, steps):
        g = grad_at(xs[t - 1])
        xs.append([v - lr * gi for v, gi in zip(xs[t], g)])
    for t in range(steps):
        assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(got[t], xs[t + 1])), t


def test_registry_marks_the_delayed_update_approximate():
    row = dp_methods.method("offload", "cpu")
    assert row.exact_with(row.resolve({}, "")) and not row.exact_with(row.resolve({"delayed_update": True}, ""))
    assert dp_methods.method("offload", "nvme").exact and dp_methods.method("comm_schedule", "bytescheduler").exact


def _with(plan, axis, name, params=None, validate=True):
    setattr(
        plan.dp_methods, axis, MethodChoice(name=name, params=dp_methods.method(axis, name).resolve(params or {}, axis))
    )
    if validate:
        plan.validate()
    return plan


def test_feasibility_refuses_bytescheduler_with_pipelines_and_waves_2_everywhere():
    bs = _with(make_plan(pp=2, dp=2, microbatches=2, validate=False), "comm_schedule", "bytescheduler", validate=False)
    assert "bytescheduler with pipeline_parallel_degree 2" in feasibility.first(bs.layout())
    waves = _with(make_plan(dp=2), "waves", "2", validate=False)
    assert feasibility.first(waves.layout()) == feasibility.WAVES_NOT_RUN


# --- multi-rank: loss equality and counted bytes vs the planner ---------------------------------

CHUNKS = {"chunk_mb": 0.0625, "credit_mb": 0.125}
"""64 KiB chunks, two in flight: gpt-tiny's larger gradients split and the window fills."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from meshplan.executor.launch import LaunchOptions, run_plans

    plans = {
        "ddp": make_plan(dp=2),
        "cpu": _with(make_plan(dp=2), "offload", "cpu"),
        "nvme": _with(make_plan(dp=2), "offload", "nvme"),
        "zero1_nvme": _with(make_plan(dp=2, zero=1), "offload", "nvme"),
        "zero3_nvme": _with(make_plan(dp_shard=2, zero=3), "offload", "nvme"),
        "zero3": make_plan(dp_shard=2, zero=3),
        "bytescheduler": _with(make_plan(dp=2), "comm_schedule", "bytescheduler", CHUNKS),
    }
    out = tmp_path_factory.mktemp("offload_methods")
    results = run_plans(
        list(plans.values()), LaunchOptions(steps=3, out_dir=str(out), quiet=True, timeout_s=240, optimizer="adamw")
    )
    return out, {name: (plan, r) for (name, plan), r in zip(plans.items(), results)}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, base",
    [("cpu", "ddp"), ("nvme", "ddp"), ("zero1_nvme", "ddp"), ("bytescheduler", "ddp"), ("zero3_nvme", "zero3")],
)
def test_offload_and_bytescheduler_train_exactly_as_the_baseline(runs, name, base):
    _, r = runs
    assert r[name][1].losses == r[base][1].losses


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cpu", "nvme", "zero3_nvme", "bytescheduler"])
def test_counted_bytes_equal_the_planners_prediction(runs, name):
    from test_dp_methods_executor import predicted_bytes

    _, r = runs
    plan, result = r[name]
    assert predicted_bytes(plan) == result.comm_bytes_per_step
    if "nvme" in name:
        assert result.comm_bytes_per_step["nvme"] > 0 and result.comm_bytes_per_step["host_device"] > 0


@pytest.mark.slow
def test_nvme_files_are_removed_after_the_run(runs):
    out, _ = runs
    assert not list(Path(out).rglob("*.bin"))


# --- planner: offload exactly when nothing else fits ---------------------------------------------


def _plan(model: str, num_gpus: int, batch: int, **methods):
    from meshplan.planner import PlanRequest, search
    from meshplan.presets import cluster_preset
    from meshplan.profiler import profile_model

    profile = profile_model(model, {}, device="meta")
    req = PlanRequest(num_gpus=num_gpus, global_batch=batch, precision="bf16", top_k=1, methods=methods)
    return search(profile, cluster_preset("a100-80g", num_gpus), req)


def test_planner_offloads_gpt3_175b_on_8_a100_where_nothing_else_fits():
    plan = _plan("gpt3-175b", 8, 8)
    assert plan.dp_methods.offload.name in ("cpu", "nvme")
    with pytest.raises(MeshplanError, match="offload=cpu would make it fit"):
        _plan("gpt3-175b", 8, 8, offload=("none", {}))


def test_planner_does_not_offload_a_model_that_fits():
    plan = _plan("gpt-tiny", 8, 16)
    assert plan.dp_methods.offload.name == "none"
