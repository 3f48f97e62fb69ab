"""A pipeline schedule measured in place: its per-microbatch cost beyond the stages' arithmetic.

A pipeline rank pays, per microbatch and chunk, more than its layers' forward and backward: the
boundary tensor sent forward and its gradient sent back (gloo isend/irecv, waited for before the
next action in 1F1B's steady state), torch.distributed.pipelining's own work around each action
(flattening and detaching the stage's inputs, the forward cache, stage_backward), the last
stage's loss, and the wait for a neighbour that shares the cores with every other rank. A link
fit (links.py) times a send between idle ranks only. So the executor's schedule is run here as a
training step runs it: on N ranks at once, a (N/P, P) mesh of N/P pipelines of P stages, every
stage one copy of the model's representative block (executor/pipeline.contiguous_boundaries,
torch's Schedule1F1B, a scalar loss on the last stage), NUM_MICROBATCHES = 2P microbatches of B
samples per step; and right after it the same block's plain forward + backward on every rank.

    pp@P:bB = slowest rank's schedule step / (m + P - 1) - mean rank's plain block pass

(ModelProfile.step_overhead_s, seconds per microbatch and chunk): what a pipeline rank's time
per microbatch t_r = compute + p2p must hold for the cost model's `(m + P - 1) t_r`
(planner/cost/pipeline.py, Narayanan et al. 2021 Sec 2.2) to be the measured step. The cost
model charges it in place of the link fit's two sends, for CPU profiles only.
"""

from __future__ import annotations

import statistics
import time

from meshplan.profiler.insitu import STEP, Case

NUM_MICROBATCHES_PER_STAGE = 2
"""m = 2P microbatches per measured step: 1F1B needs m >= P; 2P has a steady state as long as
its warm-up and cool-down."""


def pipeline_block(reps: list[str], rules: dict, inputs: dict) -> str | None:
    """The first representative transformer block taking and returning one tensor (a pipeline
    stage of such blocks sends one tensor each way); None if the model has none."""
    for rep in reps:
        if rules[rep].kind == "block" and not inputs[rep].parts and not inputs[rep].first:
            return rep
    return None


class PipelineCase(Case):
    """One (N/P, P) mesh's pipelines at microbatch B: `wrapped` is the rank's schedule (its
    stage index on the mesh's inner axis), `plain` the same block unwrapped; a pass of the
    schedule is one step over m microbatches, a pass of the plain block one microbatch."""

    def __init__(self, key: str, schedule, stage, plain, x, batch, degree: int, microbatches: int):
        super().__init__(STEP, key, schedule, plain, x)
        self.stage, self.batch, self.degree, self.microbatches = stage, batch, degree, microbatches

    def timed(self, module) -> tuple[float, ...]:
        from meshplan.profiler.insitu import _pass

        if module is self.plain:
            return _pass(module, self.x)
        import torch

        for p in self.stage.submod.parameters():
            p.grad = None
        args = (self.batch,) if self.stage.is_first else ()
        kwargs = {"target": torch.zeros(len(self.batch)), "losses": []} if self.stage.is_last else {}
        t0 = time.perf_counter()
        module.step(*args, **kwargs)
        return time.perf_counter() - t0, 0.0

    def raw_overheads(self) -> dict[str, tuple[float, float]]:
        """{key: (schedule step / (m + P - 1), plain block pass)} on this rank."""
        step = statistics.fmean(t[0] for t in self.times["wrapped"])
        plain = statistics.fmean(sum(t) for t in self.times["plain"])
        return {self.key: (step / (self.microbatches + self.degree - 1), plain)}


def pipeline_cases(model, rep: str, spec, batches: list[int], degree: int, mesh) -> list[PipelineCase]:
    """A PipelineCase per microbatch size, each with its own stage and schedule on `mesh`'s
    group (the pipeline axis of the (N/P, P) mesh)."""
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import Schedule1F1B

    from meshplan.executor.pipeline import contiguous_boundaries
    from meshplan.profiler.runner import make_input, materialise_layer

    m = NUM_MICROBATCHES_PER_STAGE * degree
    cases = []
    for b in batches:
        block = materialise_layer(model, rep, "cpu")
        contiguous_boundaries(block)
        stage = PipelineStage(block, mesh.get_local_rank(), degree, torch.device("cpu"), group=mesh.get_group())
        schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=_loss)
        whole = make_input(model, spec, m * b, "cpu", seed=1).detach()
        x = make_input(model, spec, b, "cpu", seed=1)
        cases.append(
            PipelineCase(
                f"pp@{degree}:b{b}", schedule, stage, materialise_layer(model, rep, "cpu"), x, whole, degree, m
            )
        )
    return cases


def _loss(out, target):
    """A scalar from the last stage's output (what matters is that backward starts there)."""
    return out.float().mean() + 0.0 * target.sum()
