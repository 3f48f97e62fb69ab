"""Data-parallel methods chosen per candidate, not enumerated as an outer axis.

A compression or synchronisation method changes a candidate's once-per-step data-parallel term
and a little of its memory, not its per-microbatch layer costs' shape: so the search solves the
stage split and recompute once (with the pinned or default methods) and then re-prices the same
split with each allowed alternative (RankModel.finish per rank), keeping the fastest that fits.
Only methods the user allowed (--allow-compression / --allow-sync) or pinned are priced; exact
methods the planner prices completely are searched by default: ByteScheduler with its tuned chunk
and credit (planner/methods/comm_schedule.py), offload as the fallback (planner/search/offload_search.py).
"""

from __future__ import annotations

import functools
import math

from meshplan import dp_methods, feasibility
from meshplan.plan import MethodOption
from meshplan.planner.context import Candidate, Context
from meshplan.planner.methods.sync import straggler_trade
from meshplan.planner.rank.dp_cost import comm_bytes_per_step
from meshplan.planner.rank.layer_cost import CostTable
from meshplan.planner.rank.stages import RankSolution
from meshplan.planner.search import tuning

NOT_RUN = "priced only, not run by this executor: "
"""MethodOption.note of a method feasibility.py calls valid but not runnable here (waves=2)."""


def alternatives(ctx: Context, cand: Candidate) -> list[Candidate]:
    """`cand` with each allowed approximate method on an axis the user did not pin, where it
    composes (feasibility.py)."""
    out = []
    for axis, names in sorted(ctx.request.allow.items()):
        if axis in ctx.request.methods:
            continue
        for name in names:
            alt = cand.with_method(axis, name, dp_methods.defaults_of(axis, name))
            if not feasibility.first(alt.layout(ctx.seq), also_runs=ctx.spec.also_runs):
                out.append(alt)
    return out


def best_method(
    ctx: Context, table: CostTable, cand: Candidate, sols: list[RankSolution], worth_below_s: float = math.inf
) -> tuple[float, Candidate, list[RankSolution]]:
    """(step, candidate, solutions) of the fastest allowed method on this candidate's split.
    A compressor changes only the once-per-step sync (and memory), so none beats max over ranks
    of (cost - sync): when that is already >= `worth_below_s` (the search's K-th best step) the
    compressors are not priced. Other axes' methods may change the per-microbatch costs too."""
    if tuning.auto(cand):  # a parameter left to the planner (crossbow's k): picked on this split
        cand, sols, _ = tuning.tune(ctx, table, cand, sols)
    best = (max(s.cost_s for s in sols), cand, sols)
    scheduled = tuning.composes(ctx, cand)
    if not ctx.request.allow and not scheduled:
        return best
    hopeless = max(s.cost_s - s.sync_s for s in sols) >= worth_below_s
    recomputes = any(mode != "none" for s in sols for mode in s.modes.values())
    for alt in tuning.searched(ctx, table, cand) if not hopeless or recomputes else ():
        alt_sols, ok = tuning.solutions(ctx, table, alt, sols)  # exact: searched by default
        step = max(s.cost_s for s in alt_sols)
        if ok and step < best[0]:
            best = (step, alt, alt_sols)
    for alt in alternatives(ctx, cand):
        if hopeless and alt.method("compression")[0] != cand.method("compression")[0]:
            continue
        alt, alt_sols, ok = tuning.tune(ctx, table, alt, sols)  # = reprice but auto parameters
        step = max(s.cost_s for s in alt_sols)
        if ok and step < best[0]:
            best = (step, alt, alt_sols)
    return best


def method_options(ctx: Context, table: CostTable, chosen: Candidate, sols: list[RankSolution]) -> list[MethodOption]:
    """The chosen plan re-priced with its default, pinned and allowed methods on every axis that
    has a choice: what the report's "Data-parallel methods" section shows."""
    out = []
    for axis in dp_methods.AXES:
        names = sorted({dp_methods.DEFAULTS[axis], chosen.method(axis)[0], *ctx.request.allow.get(axis, ())})
        if len(names) == 1 and names[0] == dp_methods.DEFAULTS[axis] and axis not in ctx.request.methods:
            continue
        if axis == "offload":  # the report's offload trade shows every placement (report/offload_section.py)
            names = sorted(dp_methods.names(axis))
        for name in names:
            params = chosen.method(axis)[1] if name == chosen.method(axis)[0] else dp_methods.defaults_of(axis, name)
            alt = chosen.with_method(axis, name, params)
            found = feasibility.reasons(alt.layout(ctx.seq), also_runs=ctx.spec.also_runs)
            why = next((r.text for r in found if not r.runnable_only), "")
            not_run = next((NOT_RUN + r.text for r in found if r.runnable_only), "")  # priced all the same
            row = dp_methods.method(axis, name)
            option = functools.partial(MethodOption, axis=axis, name=name, params=params, exact=row.exact_with(params))
            if why:
                out.append(option(feasible=False, note=why, chosen=False))
                continue
            alt, alt_sols, ok = tuning.tune(ctx, table, alt, sols)  # = reprice but auto parameters
            params = alt.method(axis)[1]
            option = functools.partial(option, params=params, exact=row.exact_with(params))
            caveat = (
                ""
                if row.exact_with(params)
                else "changes the training mathematics: check convergence before relying on it"
            )
            if axis == "sync" and name == "dabmd":
                caveat += "; " + _straggler_note(ctx, table, chosen, alt, alt_sols, sols)
            out.append(
                option(
                    feasible=ok,
                    step_time_s=max(s.cost_s for s in alt_sols),
                    peak_memory_bytes=max(s.memory_bytes for s in alt_sols),
                    comm_bytes_per_step=comm_bytes_per_step(ctx, alt, [s.layers for s in alt_sols]),
                    chosen=alt == chosen,
                    note=not_run or caveat,
                )
            )
    return out


STRAGGLER = 2.0
"""How much slower the straggler of the report's DDP-against-DABMD trade is."""


def _straggler_note(ctx, table, chosen, alt, alt_sols, sols) -> str:
    """DDP against DABMD with one replica STRAGGLER x slower (planner/methods/sync.py
    straggler_trade), from the two re-priced plans' compute, sync and optimizer step."""
    ddp = chosen.with_method("sync", "allreduce", {})
    _, ddp_sols, _ = tuning.tune(ctx, table, ddp, sols)
    d, a = max(ddp_sols, key=lambda s: s.cost_s), max(alt_sols, key=lambda s: s.cost_s)
    m = alt.num_microbatches
    compute = m * (a.parts["compute_s"] + a.parts["recompute_s"])
    params = alt.method("sync")[1]
    n = alt.dp_replicate * alt.dp_shard
    t = straggler_trade(
        compute,
        m,
        m * alt.microbatch,
        STRAGGLER,
        params["budget_ms"] / 1e3,
        params["min_microbatches"],
        max(0.0, d.cost_s - compute - d.optimizer_s),
        max(0.0, a.cost_s - compute - a.optimizer_s),
        a.optimizer_s,
        n,
    )
    return (
        f"with one of {n} replicas {STRAGGLER:g}x slower: DDP {t['ddp_step_s'] * 1e3:.4g} ms/step "
        f"({t['ddp_samples_per_s']:.4g} samples/s), DABMD {t['dabmd_step_s'] * 1e3:.4g} ms/round "
        f"({t['dabmd_samples_per_s']:.4g} samples/s, {t['dabmd_samples_per_round']:g} samples a round"
        + (", budget 0: the slow replica sets the round" if params["budget_ms"] <= 0 else "")
        + ")"
    )
