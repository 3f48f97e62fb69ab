"""Executor runs end to end: run.json, the gloo shutdown crash, resume, dead and hung ranks,
and the plan/launch mismatches that must fail before any process starts."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from executor_plans import make_plan

from meshplan.errors import MeshplanError, RunError
from meshplan.executor import check_plan, launch_command, run_plan
from meshplan.executor.checkpoint import latest_step
from meshplan.executor.checkpoint_manifest import write_manifest
from meshplan.executor.reference import reference_losses
from meshplan.run_result import RunResult
from meshplan.schema import load

SGD = dict(optimizer="sgd", lr=0.5, grad_clip=1.0)


def _dataset_reference(plan, steps: int) -> list[float]:
    """Single-process losses on the global batches a DistributedSampler per replica yields."""
    import torch
    from executor_plans import token_dataset
    from torch.utils.data import DistributedSampler, default_collate

    from meshplan.executor.model import build_model_for_plan
    from meshplan.executor.optimizers import make_optimizer

    data, dp = token_dataset(), plan.data_parallel_degree
    per = plan.global_batch_size // dp
    samplers = [
        DistributedSampler(data, num_replicas=dp, rank=r, shuffle=True, seed=0, drop_last=True) for r in range(dp)
    ]
    model = build_model_for_plan(plan, "cpu")
    opt = make_optimizer(list(model.parameters()), "sgd", SGD["lr"], 0.0)
    losses = []
    for step in range(steps):
        rows = [i for s in samplers for i in list(iter(s))[step * per : (step + 1) * per]]
        x, y = default_collate([data[i] for i in rows])
        opt.zero_grad()
        loss = model.loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), SGD["grad_clip"])
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
def test_run_with_user_data_writes_run_json_and_survives_a_shutdown_crash(tmp_path, monkeypatch):
    """--data module:fn through a DistributedSampler per replica; rank 1 aborts (SIGABRT) after
    all work is done, and the run still succeeds, with a note."""
    monkeypatch.setenv("MESHPLAN_FAULT", "1:end:abort")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    plan = make_plan(dp=2)
    result = run_plan(plan, steps=3, out_dir=str(tmp_path), quiet=True, data="executor_plans:token_dataset", **SGD)
    saved = load(RunResult, tmp_path / "run.json")
    assert saved.losses == result.losses and len(result.losses) == 3
    assert result.step_time_s > 0 and result.tokens_per_s > 0 and result.peak_memory_bytes > 0
    assert result.world_size == 2 and result.backend == "gloo"
    assert any("shutdown crash ignored" in note for note in result.notes)
    ref = _dataset_reference(plan, steps=3)
    assert max(abs(a - b) / b for a, b in zip(result.losses, ref)) <= 1e-4


@pytest.mark.slow
def test_dead_rank_is_named_then_resume_and_reshard_continue_the_trajectory(tmp_path, monkeypatch):
    """Rank 1 dies at step 4: the job fails naming it and the step-4 checkpoint is intact. Resuming
    the same plan (ZeRO-3, sharded DCP state) gives exactly the uninterrupted losses (= the single
    process); resuming that run's step-6 checkpoint into a TP x PP plan (DCP reshards model and
    momentum by FQN) continues the same trajectory."""
    plan = make_plan(dp_shard=2, zero=3)
    monkeypatch.setenv("MESHPLAN_FAULT", "1:4:exit")
    with pytest.raises(RunError, match=r"^rank 1 "):
        run_plan(plan, steps=6, out_dir=str(tmp_path), checkpoint_every=2, quiet=True, timeout_s=60, **SGD)
    assert latest_step(tmp_path) == 4
    monkeypatch.delenv("MESHPLAN_FAULT")
    resumed = run_plan(plan, steps=6, out_dir=str(tmp_path), checkpoint_every=2, resume=True, quiet=True, **SGD)
    # the failed launch's run.json kept steps 1-4 as they went; the resumed run continues it
    assert resumed.resumed_from_step == 4 and len(resumed.losses) == 6
    other = make_plan(tp=2, pp=2, microbatch=4, microbatches=1, schedule="GPipe")
    resharded = run_plan(other, steps=8, out_dir=str(tmp_path), resume=True, quiet=True, **SGD)
    assert resharded.resumed_from_step == 6
    # another plan: the earlier run.json's steps are not this plan's, so only steps 7-8 are reported
    assert len(resharded.losses) == 2
    ref = reference_losses(plan, steps=8, **SGD)
    got = resumed.losses + resharded.losses
    assert len(got) == 8 and max(abs(a - b) / b for a, b in zip(got, ref)) <= 1e-4


@pytest.mark.slow
def test_hung_rank_ends_the_job_within_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_FAULT", "1:1:hang")
    start = time.monotonic()
    with pytest.raises(RunError, match=r"rank 1 hung.*step 0"):
        run_plan(make_plan(dp=2), steps=3, out_dir=str(tmp_path), quiet=True, timeout_s=10, **SGD)
    assert time.monotonic() - start < 90


def _with(plan, **changes):
    return dataclasses.replace(plan, **changes)


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: _with(
                make_plan(pp=2, microbatches=2),
                stages=[["embed", "layers.0", "layers.1"], ["layers.2", "layers.3", "layers.9"]],
                layers=["embed", "layers.0", "layers.1", "layers.2", "layers.3", "layers.9"],
            ),
            r"plan.layers: 'layers.9' does not match the layers of gpt-tiny",
        ),
        (lambda: make_plan(tp=3), r"^plan: \w+ \d+ not divisible by tp=3$"),
        (lambda: make_plan(model="llama-tiny", tp=4), r"kv_heads 2 not divisible by tp=4"),
        (
            lambda: _with(make_plan(dp=2), context_parallel_degree=2, world_size=4),
            r"context_parallel_degree 2: the executor does not run context parallelism",
        ),
        (
            lambda: make_plan(tp=2, dp=2, compression="powersgd", validate=False),
            r"compression=powersgd with tensor_parallel_degree 2: needs DDP",
        ),
        (
            lambda: make_plan(dp_shard=2, zero=3, compression="fp16", validate=False),
            r"compression=fp16 with zero_stage 3: runs with zero_stage 0/1 only",
        ),
        (lambda: _with(make_plan(), seq_len=64), r"plan.seq_len = 64: gpt-tiny handles at most 32"),
        (
            lambda: _with(
                make_plan(pp=2, microbatches=2),
                stages=[["embed", "layers.0"], ["layers.2", "layers.1", "layers.3", "head"]],
            ),
            r"contiguous layers",
        ),
        (lambda: _with(make_plan(), model_name="no-such-model"), r"not in the zoo"),
        (
            lambda: make_plan(
                pp=2, dp_shard=2, zero=3, virtual=2, schedule="InterleavedZeroBubble", microbatches=4, validate=False
            ),
            r"FSDP2 misses the split weight-gradient pass",
        ),
    ],
)
def test_mismatched_plans_fail_before_launch(make, match):
    with pytest.raises(MeshplanError, match=match) as info:
        check_plan(make())
    assert "\n" not in str(info.value)


def test_world_size_must_fit_the_nodes(tmp_path):
    plan = make_plan(dp=2, tp=2)
    with pytest.raises(MeshplanError, match=r"--nnodes 3: does not divide plan.world_size = 4"):
        check_plan(plan, nnodes=3)
    with pytest.raises(MeshplanError, match=r"--nnodes 3"):
        run_plan(plan, nnodes=3, rdzv_endpoint="h:29500", out_dir=str(tmp_path))
    assert not (tmp_path / "ranks").exists()  # nothing was launched


def test_launch_command_single_and_multi_node():
    plan = make_plan(dp=2, tp=2)
    cmd = launch_command(plan, steps=7)
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--standalone" in cmd
    assert "--nproc-per-node=4" in cmd and cmd[cmd.index("--steps") + 1] == "7"
    assert cmd[cmd.index("-m", 3) + 1] == "meshplan.executor.worker"
    multi = launch_command(plan, nnodes=2, node_rank=1, rdzv_endpoint="node0:29500")
    assert "--nproc-per-node=2" in multi and "--nnodes=2" in multi and "--node-rank=1" in multi
    assert "--rdzv-endpoint=node0:29500" in multi and "--standalone" not in multi
    with pytest.raises(MeshplanError, match="--rdzv-endpoint"):
        launch_command(plan, nnodes=2)


def test_plan_file_round_trip_runs_check(tmp_path):
    """A plan saved as JSON (what `meshplan run plan.json` reads) passes check_plan."""
    from meshplan.plan import Plan
    from meshplan.schema import save

    save(make_plan(pp=2, virtual=2, schedule="Interleaved1F1B", microbatches=4), tmp_path / "plan.json")
    check_plan(load(Plan, tmp_path / "plan.json"))
    assert json.loads((tmp_path / "plan.json").read_text())["virtual_stages"] == 2


def test_resume_needs_a_checkpoint_before_the_last_step(tmp_path):
    plan = make_plan(dp=2)
    with pytest.raises(MeshplanError, match=r"--resume: no complete checkpoint"):
        run_plan(plan, steps=4, out_dir=str(tmp_path), resume=True)
    (tmp_path / "checkpoints" / "step_000004").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_000004" / "__0_0.distcp").write_bytes(b"shard")
    write_manifest(tmp_path / "checkpoints" / "step_000004", 4)
    (tmp_path / "checkpoints" / "latest").write_text("4\n")
    with pytest.raises(MeshplanError, match=r"at step 4, not before --steps 4"):
        run_plan(plan, steps=4, out_dir=str(tmp_path), resume=True)
    assert not (tmp_path / "ranks").exists()


def test_zero1_checkpoint_resumes_only_into_its_own_plan(tmp_path):
    from meshplan.schema import save

    step_dir = tmp_path / "checkpoints" / "step_000002"
    save(make_plan(dp=2, zero=1), step_dir / "plan.json")
    write_manifest(step_dir, 2)
    (tmp_path / "checkpoints" / "latest").write_text("2\n")
    with pytest.raises(MeshplanError, match=r"ZeRO-1 optimizer state .* resumes only into the plan"):
        run_plan(make_plan(dp=2), steps=4, out_dir=str(tmp_path), resume=True)
    with pytest.raises(MeshplanError, match=r"is of gpt-tiny"):
        run_plan(make_plan(model="llama-tiny", dp=2), steps=4, out_dir=str(tmp_path), resume=True)
