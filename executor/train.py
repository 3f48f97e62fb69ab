"""One rank's training loop for one plan: build, parallelise, train, measure.

AdamW (or SGD, for exact loss-equality tests), global-norm gradient clipping, bf16 autocast on
GPU, synthetic seeded data or a user dataset, DCP checkpoints every K steps and resume.
Measured per rank: every step's wall time, the loss (identical on all ranks: the last pipeline
stage's losses, all-reduced once after the last step so no step waits on the loss), and peak
memory (CUDA max allocated; on CPU the live-tensor tracker watches step 1 — step 0 when it is
the only one — which the median step time then leaves out), the seconds of each phase of each
step (data, forward, backward, pipeline waits, optimizer...: executor/phases.py), and the
data-parallel bytes this rank sent per step and mesh axis (the methods' counters, closed after
each optimizer step).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from meshplan.executor import checkpoint, straggler, waves
from meshplan.executor.data import make_batches
from meshplan.executor.memory import LiveTensorTracker, held_tensors
from meshplan.executor.methods.host_optimizer import close_all
from meshplan.executor.model import build_for_apply
from meshplan.executor.parallel_dims import build_mesh
from meshplan.executor.parallelize import apply
from meshplan.plan import Plan


@dataclass(kw_only=True)
class TrainOptions:
    steps: int = 5
    optimizer: str = "adamw"
    """"adamw" or "sgd" (plain SGD: the loss-equality tests' optimizer)."""
    lr: float = 3e-4
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    """Max global gradient L2 norm; <= 0 disables clipping."""
    seed: int = 0
    data: str | None = None
    out_dir: str = "runs/latest"
    checkpoint_every: int = 0
    resume: bool = False
    track_memory: bool = True
    offload_dir: str | None = None
    """offload=nvme: where the optimizer-state files go (default: <out_dir>/offload); removed at the end."""


@dataclass(kw_only=True)
class RankResult:
    """What one rank measured; the launcher merges these into a RunResult."""

    rank: int
    losses: list[float]
    step_times_s: list[float]
    peak_memory_bytes: int
    start_step: int
    grad_norms: list[float]
    comm_bytes_by_step: list[dict[str, int]] = field(default_factory=list)
    """Data-parallel bytes this rank put on the wire in each step, by mesh axis (comm_bytes.py)."""
    comm_bytes_per_step: dict[str, int] = field(default_factory=dict)
    """Its mean per step after the first (ByteCounter.mean_after_first), by mesh axis."""
    phases_s_by_step: list[dict[str, float]] = field(default_factory=list)
    """Seconds of each phase of each step (executor/phases.py: forward, backward, pipeline, ...)."""
    method_notes: list[str] = field(default_factory=list)
    """Lines the data-parallel methods report (e.g. Accordion's share of steps at each setting)."""

    def to_json(self) -> dict:
        return asdict(self)


def train(
    plan: Plan,
    options: TrainOptions,
    device: torch.device,
    on_step: Callable[[int], None] = lambda step: None,
    on_step_end: Callable[[dict], None] | None = None,
) -> RankResult:
    """Train `plan` for options.steps steps (from the latest checkpoint if resuming). With
    `on_step_end`, every rank calls it after each step with {"step", "loss", "step_time_s",
    "peak_memory_bytes"} (the loss of the global batch: one small all-reduce after the step's
    timing, only under plain data parallelism; None under a sync method with its own loop)."""
    mesh = build_mesh(plan, device.type)
    model = build_for_apply(plan, options.seed)
    par = apply(model, plan, mesh, seed=options.seed, device=device)
    base = options.offload_dir or os.environ.get("MESHPLAN_OFFLOAD_DIR") or f"{options.out_dir}/offload"
    par.offload_dir = f"{base}/rank{torch.distributed.get_rank()}"  # `meshplan run --offload-dir` sets the env
    optimizers = par.make_optimizers(options.optimizer, options.lr, options.weight_decay)
    slow = None if par.sync is not None and par.sync.SLOWS_ITSELF else straggler.install(torch.distributed.get_rank())
    completed = False
    try:
        result = _train(par, plan, options, device, optimizers, model, on_step, on_step_end)
        completed = True
        return result
    finally:
        if par.sync is not None:  # always: lands the last averaging round or, after an error or a
            par.sync.close(aborted=not completed)  # signal, stops a background thread unwaited (sync.py)
        close_all(optimizers)  # offload=nvme: the state files are removed, also after an error
        if slow is not None:
            slow.remove()


def _train(
    par,
    plan: Plan,
    options: TrainOptions,
    device: torch.device,
    optimizers,
    model,
    on_step: Callable[[int], None],
    on_step_end: Callable[[dict], None] | None = None,
) -> RankResult:
    seed = waves.data_seed(options.seed)  # waves=2: each wave its own data (executor/waves.py)
    batches = make_batches(model, plan, par.dims.dp_rank, par.dims.dp_degree, seed, options.data)
    start = checkpoint.load(options.out_dir, par.parts, optimizers, par.stage_ids) if options.resume else 0
    result = RankResult(
        rank=torch.distributed.get_rank(),
        losses=[],
        step_times_s=[],
        peak_memory_bytes=0,
        start_step=start,
        grad_norms=[],
    )
    shares: list[torch.Tensor] = []  # this rank's loss share per step, summed over ranks at the end
    norms: list[torch.Tensor] = []  # the global gradient norm per step, read at the end
    # CPU memory is tracked on the second step when there is one: by then the optimizer states
    # exist, so the measured peak holds what the cost model predicts (states + grads + activations).
    tracked = start + 1 if options.steps > start + 1 else start
    for step in range(start, options.steps):
        on_step(step)
        tracker = _tracker(par, optimizers, device) if options.track_memory and step == tracked else None
        par.phases.end_step()  # nothing timed before the step counts in it
        t0 = time.perf_counter()
        with tracker or _null():
            with par.phases.phase("data"):
                batch = batches(step)
            if par.sync is None:  # token weighting (parallelize.py); sync methods split the batch their own way
                par.loss_fn.num_targets = batches.num_targets
            loss, norm = _train_step(par, optimizers, batch, options.grad_clip)
        _sync(device)
        result.step_times_s.append(time.perf_counter() - t0)
        result.phases_s_by_step.append(par.phases.end_step())
        result.comm_bytes_by_step.append(par.comm_bytes.end_step())
        shares.append(loss)
        norms.append(norm)
        if tracker is not None:
            result.peak_memory_bytes = tracker.peak_bytes
        if on_step_end is not None:
            on_step_end(_step_record(par, device, step, loss, result))
        if options.checkpoint_every and (step + 1) % options.checkpoint_every == 0:
            checkpoint.save(options.out_dir, step + 1, par.parts, optimizers, par.stage_ids, plan)
    if device.type == "cuda":
        result.peak_memory_bytes = torch.cuda.max_memory_allocated(device)
    result.losses = par.global_losses(shares) if shares else []  # one all-reduce for all steps
    result.grad_norms = [float(n) for n in norms]
    result.comm_bytes_per_step = par.comm_bytes.mean_after_first()
    result.method_notes = [line for method in par.comm_bytes.notes_from for line in method.notes()]
    return result


def _step_record(par, device: torch.device, step: int, loss, result: RankResult) -> dict:
    """What `meshplan run` logs after a step (torchtitan's per-step line)."""
    value = par.global_losses([loss])[0] if par.sync is None else None  # every rank: one all-reduce
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else result.peak_memory_bytes
    return {
        "step": step + 1,
        "loss": value,
        "step_time_s": result.step_times_s[-1],
        "peak_memory_bytes": peak,
        "phases_s": result.phases_s_by_step[-1],
    }


def _train_step(par, optimizers, batch, grad_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step; returns this rank's loss share (see Parallelized.step_local) and the
    global gradient norm before clipping. A sync method other than all-reduce runs its own step
    (local steps, master updates, learners, a time budget: executor/methods/sync.py)."""
    timer = par.phases
    if par.sync is not None:
        with timer.phase("sync"):  # less its forward and backward (parallelize.py)
            return par.sync.train_step(par, optimizers, batch, grad_clip)
    with timer.phase("optimizer"):
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
    loss = par.step_local(*batch)
    with timer.phase("grad_clip"):
        norm = par.clip_grad_norm_(grad_clip)
    with timer.phase("optimizer"):
        for opt in optimizers:
            opt.step()
    return loss, norm


def _tracker(par, optimizers, device: torch.device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return None
    return LiveTensorTracker(held_tensors(par.parameters(), optimizers))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
