"""offload=cpu/nvme (host optimizer step, NVMe state files), the delayed update,
comm_schedule=bytescheduler, waves=2's refusal, checkpoints of offloaded runs, and the planner's
offload fallback.

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
from meshplan.executor.model import build_named_model
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


def _storage_io() -> tuple[int, int]:
    """(read_bytes, write_bytes) the kernel counted for this process's storage I/O."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["read_bytes"]), int(fields["write_bytes"])


def test_nvme_states_move_through_the_disk_as_the_kernel_counts_it(tmp_path):
    """The kernel's per-process storage counters (no code shared with the store or the planner)
    see every state byte written to and read back from the device: a read served by the page
    cache, as a memory-mapped store's would be a step after its write, counts 0 there."""
    if not Path("/proc/self/io").exists():
        pytest.skip("no /proc/self/io on this system: the kernel's storage I/O counters are Linux's")
    mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    here = str(tmp_path.resolve())
    fstype = max(
        (m for m in mounts if here == m[0] or here.startswith(m[0].rstrip("/") + "/")), key=lambda m: len(m[0])
    )[1]
    if fstype in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is on {fstype}: its pages are the storage, nothing reaches a device")
    shapes = [(256, 256), (512, 128), (65536,)]  # whole 4 KiB pages: the kernel counts pages
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    store = store_factory(tmp_path / "states", "adamw")(params)
    states = [{"exp_avg": torch.randn(s), "exp_avg_sq": torch.rand(s)} for s in shapes]
    store.take_bytes()
    r0, w0 = _storage_io()
    for _ in range(3):
        for i, st in enumerate(states):
            store.write(i, st)
        for i, st in enumerate(states):
            back = store.read(i)
            assert all(torch.equal(back[k], st[k]) for k in st)
    r1, w1 = _storage_io()
    moved = store.take_bytes()
    if r1 - r0 == 0 and w1 - w0 == 0:
        pytest.skip("the kernel counted no storage I/O at all here (a file system without block accounting)")
    assert moved == 3 * 2 * 2 * 4 * sum(p.numel() for p in params)  # 3 rounds, read + write, 2 states
    assert 0.95 * moved / 2 <= r1 - r0 <= 1.1 * moved / 2, (r1 - r0, moved / 2)
    assert 0.95 * moved / 2 <= w1 - w0 <= 1.5 * moved / 2, (w1 - w0, moved / 2)
    store.remove()


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


def _host_opt(kind: str, folder: Path, counter: ByteCounter):
    """A HostOptimizer factory: "cpu" (AdamW on the host), "nvme" (its states in files), "delayed"
    (SGD with momentum, one step stale)."""
    if kind == "delayed":
        cls = host_optimizer_class(torch.optim.SGD, counter=counter, delayed=True)
        return lambda m: cls(m.parameters(), lr=0.05, momentum=0.9)
    store = store_factory(folder, "adamw") if kind == "nvme" else None
    return lambda m: host_optimizer_class(torch.optim.AdamW, counter=counter, store_factory=store)(
        m.parameters(), **ADAMW
    )


@pytest.mark.parametrize("kind", ["cpu", "nvme", "delayed"])
def test_host_optimizer_checkpoint_resumes_exactly_and_saving_changes_nothing(tmp_path, kind):
    """executor/checkpoint.py's DCP layout for a HostOptimizer (single process, no group): save
    after 3 of 5 steps, resume into a fresh model and optimizer: steps 4-5 equal the uninterrupted
    run's bit for bit, and that run equals one that never saved. The NVMe states come back into
    the store, the delayed update's host master (the update not yet uploaded) with them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    from meshplan.executor import checkpoint

    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    ref = _train(_host_opt(kind, tmp_path / "ref", ByteCounter()))

    def steps(net, opt, n):
        out = []
        for _ in range(n):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
            out.append([p.detach().clone() for p in net.parameters()])
        return out

    counter = ByteCounter()
    net = copy.deepcopy(_net())
    opt = _host_opt(kind, tmp_path / "a", counter)(net)
    first = steps(net, opt, 3)
    moved = opt.store.moved_bytes if opt.store else 0
    dcp.save(checkpoint._merged(checkpoint._part_states([net], [opt])), checkpoint_id=str(tmp_path / "ckpt"))
    assert (opt.store.moved_bytes if opt.store else 0) == moved  # a checkpoint is not training traffic
    rest = steps(net, opt, 2)
    opt.close()
    assert _equal(first + rest, ref)  # saving changed nothing

    torch.manual_seed(7)
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt2 = _host_opt(kind, tmp_path / "b", ByteCounter())(fresh)
    templates = checkpoint._part_states([fresh], [opt2], template=True)
    merged = checkpoint._merged(templates)
    assert any(k.endswith("exp_avg_sq" if kind != "delayed" else "host_master") for k in merged["optim"])
    dcp.load(merged, checkpoint_id=str(tmp_path / "ckpt"))
    set_model_state_dict(fresh, merged["model"])
    checkpoint._set_host_state(fresh, opt2, merged["optim"])
    resumed = steps(fresh, opt2, 2)
    opt2.close()
    assert _equal(resumed, rest)


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
    waves = _with(make_plan(tp=2), "waves", "2", validate=False)
    assert feasibility.first(waves.layout()) == feasibility.WAVES_NOT_RUN
    assert not feasibility.first(_with(make_plan(dp=2), "waves", "2", validate=False).layout())


# --- multi-rank: loss equality and counted bytes vs the planner ---------------------------------

CHUNKS = {"chunk_mb": 0.0625, "credit_mb": 0.125}
"""64 KiB chunks, two in flight: gpt-tiny's larger gradients split and the window fills."""


STEPS, CHECKPOINT_AT = 5, 3
"""Every plan saves a DCP checkpoint after step 3 of 5; the resume launch runs steps 4-5 from it
(step 5's loss is the first that depends on the optimizer states the checkpoint carried)."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from meshplan.executor.launch import LaunchOptions, run_plans

    plans = {
        "ddp": make_plan(dp=2),
        "cpu": _with(make_plan(dp=2), "offload", "cpu"),
        "zero1_cpu": _with(make_plan(dp=2, zero=1), "offload", "cpu"),
        "tp": make_plan(tp=2),
        "tp_cpu": _with(make_plan(tp=2), "offload", "cpu"),
        "nvme": _with(make_plan(dp=2), "offload", "nvme"),
        "zero1_nvme": _with(make_plan(dp=2, zero=1), "offload", "nvme"),
        "zero3_nvme": _with(make_plan(dp_shard=2, zero=3), "offload", "nvme"),
        "zero3": make_plan(dp_shard=2, zero=3),
        "bytescheduler": _with(make_plan(dp=2), "comm_schedule", "bytescheduler", CHUNKS),
    }
    out = tmp_path_factory.mktemp("offload_methods")
    opts = LaunchOptions(
        steps=STEPS, out_dir=str(out), quiet=True, timeout_s=240, optimizer="adamw", checkpoint_every=CHECKPOINT_AT
    )
    results = run_plans(list(plans.values()), opts)
    return out, {name: (plan, r) for (name, plan), r in zip(plans.items(), results)}


RESUMED = ("ddp", "cpu", "zero1_cpu", "tp_cpu", "nvme", "zero1_nvme", "zero3_nvme")


@pytest.fixture(scope="module")
def resumed(runs, tmp_path_factory):
    """The offload plans (and DDP) resumed from their step-3 checkpoints in one more launch: their
    checkpoints copied into a run directory of their own, one variant each."""
    import shutil

    from meshplan.executor.launch import LaunchOptions, run_plans
    from meshplan.executor.worker import variant_dir

    out, r = runs
    again = tmp_path_factory.mktemp("offload_resumed")
    for j, name in enumerate(RESUMED):
        src = variant_dir(str(out), list(r).index(name), len(r)) / "checkpoints"
        shutil.copytree(src, variant_dir(str(again), j, len(RESUMED)) / "checkpoints")
    opts = LaunchOptions(steps=STEPS, out_dir=str(again), quiet=True, timeout_s=240, optimizer="adamw", resume=True)
    return dict(zip(RESUMED, run_plans([r[name][0] for name in RESUMED], opts)))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, base",
    [
        ("cpu", "ddp"),
        ("zero1_cpu", "ddp"),
        ("tp_cpu", "tp"),
        ("nvme", "ddp"),
        ("zero1_nvme", "ddp"),
        ("bytescheduler", "ddp"),
        ("zero3_nvme", "zero3"),
    ],
)
def test_offload_and_bytescheduler_train_exactly_as_the_baseline(runs, name, base):
    _, r = runs
    assert r[name][1].losses == r[base][1].losses


@pytest.mark.slow
@pytest.mark.parametrize("name", RESUMED)
def test_a_resumed_offload_run_equals_the_uninterrupted_one(runs, resumed, name):
    """The checkpoint carries the host optimizer's states (DDP, ZeRO-1's partition, TP shards as
    DTensors) and the NVMe files' (written back into a fresh store on resume)."""
    whole, again = runs[1][name][1], resumed[name]
    assert again.resumed_from_step == CHECKPOINT_AT and len(again.losses) == STEPS - CHECKPOINT_AT
    assert again.losses == pytest.approx(whole.losses[CHECKPOINT_AT:], rel=1e-6, abs=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cpu", "zero1_cpu", "tp_cpu", "nvme", "zero3_nvme", "bytescheduler"])
def test_counted_bytes_equal_the_planners_prediction(runs, name):
    from test_dp_methods_executor import predicted_bytes

    _, r = runs
    plan, result = r[name]
    assert predicted_bytes(plan) == result.comm_bytes_per_step
    if "nvme" in name:
        assert result.comm_bytes_per_step["nvme"] > 0  # CPU ranks: no copy crosses devices
    if name != "bytescheduler":
        assert "host_device" not in result.comm_bytes_per_step


@pytest.mark.slow
def test_nvme_files_are_removed_after_the_run(runs):
    out, _ = runs
    assert not list(Path(out).rglob("*.bin"))


# --- planner: offload exactly when nothing else fits ---------------------------------------------


def _plan(model: str, num_gpus: int, batch: int, **methods):
    from meshplan.planner import PlanRequest
    from meshplan.planner.search import search
    from meshplan.presets import cluster_preset
    from meshplan.profiler import profile_model

    profile = profile_model(model, {}, device="meta")
    req = PlanRequest(num_gpus=num_gpus, global_batch=batch, precision="bf16", top_k=1, methods=methods)
    return search(profile, cluster_preset("a100-80g", num_gpus), req)


def test_planner_offloads_gpt3_13b_on_2_a100_where_nothing_else_fits():
    """13B on 2 x 80 GB: ZeRO-3 alone needs 13e9 x 16 / 2 = 104 GB a GPU; with FSDP2's
    CPUOffloadPolicy the shards live on the host (104 GB of the DGX A100's 250 GB per GPU)."""
    plan = _plan("gpt3-13b", 2, 8)
    assert plan.dp_methods.offload.name == "cpu" and plan.zero_stage == 3
    with pytest.raises(MeshplanError, match="offload=cpu would make it fit"):
        _plan("gpt3-13b", 2, 8, offload=("none", {}))


def test_offload_is_refused_where_the_host_cannot_hold_the_states():
    """175B on one DGX A100 (8 x 80 GB, 2 TB host): offload=cpu keeps an fp32 weight, gradient and
    m, v per parameter on the host (16 B: 2.8 TB for the node), more than it has; counting only
    the Adam states (8 B) had called it a fit."""
    with pytest.raises(MeshplanError, match=r"offload=cpu fits on the device but its states need 326\.4 GiB"):
        _plan("gpt3-175b", 8, 8)


def test_planner_does_not_offload_a_model_that_fits():
    plan = _plan("gpt-tiny", 8, 16)
    assert plan.dp_methods.offload.name == "none"


def test_nvme_step_pays_a_synced_write_and_a_read_per_state_file():
    """nvme_store.py keeps one file per trainable parameter tensor: the planner charges the
    link's latency twice per file a rank steps (profile-links measures it as a 4 KiB write +
    fsync and cold read), so raising the latency by d adds 2 d x files to the step, exactly."""
    import dataclasses

    from planner_profiles import small_gpt

    from meshplan.planner import PlanRequest, estimate
    from meshplan.presets import local_cpu

    profile = small_gpt(2)
    for layer in profile.layers:
        layer.param_shapes = [[layer.num_params]] if layer.num_params else []
    files = sum(len(layer.param_shapes) for layer in profile.layers)
    req = PlanRequest(num_gpus=2, global_batch=4, precision="fp32", tp=1, pp=1, dp=2, microbatch=1, zero=0)
    req = dataclasses.replace(req, methods={"offload": ("nvme", {})})

    def step(latency_s: float) -> float:
        cluster = local_cpu(2)
        cluster.nvme = dataclasses.replace(cluster.nvme, latency_s=latency_s)
        return estimate(profile, cluster, req).prediction.step_time_s

    assert files >= 3 and step(0.01) - step(0.0) == pytest.approx(2 * 0.01 * files, rel=1e-9)


def test_offload_checkpoints_load_into_plain_plans_and_back(tmp_path):
    """The host optimizer's checkpoint has torch's flattened layout: a plain AdamW run's checkpoint
    resumes into offload=nvme and an offload=nvme run's into plain AdamW, each continuing exactly."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    from meshplan.executor import checkpoint

    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    plain = lambda m: torch.optim.AdamW(m.parameters(), **ADAMW)  # noqa: E731
    nvme = _host_opt("nvme", tmp_path / "states", ByteCounter())
    ref = _train(plain)

    def steps(net, opt, n):
        for _ in range(n):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
        return [p.detach().clone() for p in net.parameters()]

    for first, second, name in ((plain, nvme, "to_nvme"), (nvme, plain, "to_plain")):
        net = copy.deepcopy(_net())
        opt = first(net)
        steps(net, opt, 3)
        dcp.save(checkpoint._merged(checkpoint._part_states([net], [opt])), checkpoint_id=str(tmp_path / name))
        getattr(opt, "close", lambda: None)()
        fresh = copy.deepcopy(_net())
        opt2 = second(fresh)
        ((model, optim),) = checkpoint._part_states([fresh], [opt2], template=True)
        merged = {"model": model, "optim": optim}
        dcp.load(merged, checkpoint_id=str(tmp_path / name))
        set_model_state_dict(fresh, merged["model"])
        if hasattr(opt2, "entries"):
            checkpoint._set_host_state(fresh, opt2, merged["optim"])
        else:
            from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

            set_optimizer_state_dict(fresh, opt2, merged["optim"], options=checkpoint.FLAT)
        got = steps(fresh, opt2, 2)
        getattr(opt2, "close", lambda: None)()
        assert all(torch.equal(a, b) for a, b in zip(got, ref[-1])), name


RSS_PROBE = """
import sys, torch
from meshplan.comm_bytes import ByteCounter
from meshplan.executor.methods.host_optimizer import host_optimizer_class
from meshplan.executor.methods.nvme_store import store_factory

def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))

torch.manual_seed(0)
net = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(16)])
x = torch.randn(8, 1024)
net(x).pow(2).mean().backward()  # gradients exist before the measurement starts
if sys.argv[1] == "memory":
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
else:
    make = store_factory(sys.argv[2], "adamw")
    opt = host_optimizer_class(torch.optim.AdamW, counter=ByteCounter(), store_factory=make)(net.parameters(), lr=1e-3)
before = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS from here on
for _ in range(3):
    opt.zero_grad(set_to_none=False)
    net(x).pow(2).mean().backward()
    opt.step()
print(status("VmHWM") - before, 2 * 4 * sum(p.numel() for p in net.parameters()))
getattr(opt, "close", lambda: None)()  # removes the state files
"""


@pytest.mark.slow
def test_nvme_keeps_the_optimizer_state_out_of_resident_memory(tmp_path):
    """16 layers of 1024 x 1024 (AdamW states 128 MiB, 8 MiB per parameter): three training steps
    with offload=nvme grow the process's peak resident memory (VmHWM, reset before the first step)
    by less than 48 MiB, a few parameters' states in flight; in memory the same steps grow it by
    the whole state. Fails if the states stay resident, or if freed state buffers are kept by the
    allocator (glibc's dynamic mmap threshold did: +114 MiB before nvme_store fixed it)."""
    import subprocess
    import sys

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc/self/clear_refs to reset the peak resident memory")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def grow(kind: str) -> tuple[int, int]:
        out = subprocess.run(
            [sys.executable, "-c", RSS_PROBE, kind, str(tmp_path / kind)],
            capture_output=True, text=True, timeout=300, env=env, check=True,
        )  # fmt: skip
        growth, state = map(int, out.stdout.split())
        return growth, state

    nvme, state = grow("nvme")
    memory, _ = grow("memory")
    assert state == 128 * 2**20
    assert memory >= 0.9 * state, memory  # the measurement sees states that stay in memory
    assert nvme < 48 * 2**20, f"offload=nvme grew resident memory by {nvme / 2**20:.1f} MiB"
    assert not (tmp_path / "nvme").exists() or not any((tmp_path / "nvme").iterdir())


# --- ZeRO-Infinity's parameter tier: offload=nvme params=true (executor/methods/param_pager.py) ---


@pytest.fixture(scope="module")
def paged(tmp_path_factory):
    from meshplan.executor.launch import LaunchOptions, run_plans

    plans = {
        "zero3": make_plan(dp_shard=2, zero=3),
        "zero3_nvme": _with(make_plan(dp_shard=2, zero=3), "offload", "nvme"),
        "zero3_nvme_params": _with(make_plan(dp_shard=2, zero=3), "offload", "nvme", {"params": True}),
    }
    out = tmp_path_factory.mktemp("param_offload")
    opts = LaunchOptions(steps=3, out_dir=str(out), quiet=True, timeout_s=240, optimizer="adamw")
    return out, {name: (plan, r) for (name, plan), r in zip(plans.items(), run_plans(list(plans.values()), opts))}


@pytest.mark.slow
def test_parameter_offload_trains_exactly_holds_less_and_reads_each_shard_four_times(paged):
    """The shards paged through files train bit-equal to ZeRO-3; the measured peak drops by the
    rank's parameter shard less the units in flight at the peak (backward holds the unit it runs
    and the one prefetched; gpt-tiny's blocks are ~1/5 of the shard each); per step each shard is read in forward, in backward and by
    the host step, and written once (4 x 469,760 fp32 bytes on 2 ranks), on top of the AdamW
    states read and written (2 x 2 x 469,760), and the cost model predicts the same bytes."""
    from test_dp_methods_executor import predicted_bytes

    out, r = paged
    base, states, both = (r[k][1] for k in ("zero3", "zero3_nvme", "zero3_nvme_params"))
    assert both.losses == base.losses
    shard = 4 * sum(p.numel() for p in build_named_model("gpt-tiny", {}, "meta").parameters()) // 2
    assert both.comm_bytes_per_step["nvme"] - states.comm_bytes_per_step["nvme"] == 4 * shard
    assert states.comm_bytes_per_step["nvme"] == 2 * 2 * shard
    assert both.peak_memory_bytes <= states.peak_memory_bytes - shard / 4
    assert predicted_bytes(r["zero3_nvme_params"][0]) == both.comm_bytes_per_step
    assert not list(Path(out).rglob("*.bin"))


def test_parameter_offload_needs_zero_3_and_no_checkpoints():
    from meshplan.executor.check import check_run_options

    zero2 = _with(make_plan(dp_shard=2, zero=2), "offload", "nvme", {"params": True}, validate=False)
    with pytest.raises(MeshplanError, match="needs ZeRO-3"):
        check_run_options(zero2, "adamw")
    with pytest.raises(MeshplanError, match="params=true with zero_stage 2: runs with zero_stage 3 only"):
        zero2.validate()  # the planner's rule (meshplan/feasibility.py): such a plan is never written
    zero3 = _with(make_plan(dp_shard=2, zero=3), "offload", "nvme", {"params": True})
    with pytest.raises(MeshplanError, match="--checkpoint-every"):
        check_run_options(zero3, "adamw", checkpoint_every=2)
    check_run_options(zero3, "adamw")


def test_host_optimizer_on_cpu_ranks_pays_part_of_an_optimizer_call_per_tensor():
    """On CPU ranks the host is the device, but HostOptimizer steps each parameter tensor with an
    optimizer of its own: offload=cpu (ZeRO-0) costs DDP's step plus HOST_TENSOR_CALL_SHARE of the
    profile's optimizer call per tensor beyond the first, exactly; FSDP2's policy (ZeRO-3) none."""
    import dataclasses

    from planner_profiles import small_gpt

    from meshplan.planner import PlanRequest, estimate
    from meshplan.planner.methods.offload import HOST_TENSOR_CALL_SHARE
    from meshplan.presets import local_cpu

    profile = small_gpt(2)
    profile.device = "cpu"
    for layer in profile.layers:
        layer.param_shapes = [[layer.num_params]] if layer.num_params else []
    tensors = sum(len(layer.param_shapes) for layer in profile.layers)

    def step(call_s: float, offload: str, zero: int = 0) -> float:
        for layer in profile.layers:
            layer.framework_overhead_s["optimizer_call"] = call_s
        req = PlanRequest(num_gpus=2, global_batch=4, precision="fp32", tp=1, pp=1, dp=2, microbatch=1, zero=zero)
        req = dataclasses.replace(req, methods={"offload": (offload, {})} if offload != "none" else {})
        return estimate(profile, local_cpu(2), req).prediction.step_time_s

    extra = step(0.01, "cpu") - step(0.01, "none")
    assert tensors >= 3 and extra == pytest.approx((tensors - 1) * HOST_TENSOR_CALL_SHARE * 0.01, rel=1e-6)
    assert step(0.01, "cpu", zero=3) == pytest.approx(step(0.01, "none", zero=3), rel=1e-9)
