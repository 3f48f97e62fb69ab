"""meshplan.planner: cost model and exact, fast search (pure Python; never imports torch).

Reads only the contracts (ModelProfile, ClusterSpec, PlanRequest) and writes a Plan. Public API:
`meshplan.planner.search.search()` (the best plan), `estimate()` (one given layout priced) and
`PlanRequest`. Layers, each importing only from the ones before it (docs/design.md, "Planner
layers"; tests/test_layering.py holds them):

1. base (this folder): request (PlanRequest), context (Context, Candidate) and the profile
   transforms it applies (attention, sac, seqscale);
2. cost/: per-layer and per-step costs: compute, comm, memory, elementwise, in-place overheads,
   pipeline timing, the optimizer step, training-state bytes;
3. methods/: one cost object per data-parallel method axis (compression, sync, offload, comm
   schedule, waves) and their registries;
4. rank/: a rank's costs: layer costs, the data-parallel cost object, the stage timeline
   (RankModel), re-pricing a split under other methods;
5. search/: enumeration, stage partition and recompute solvers, branch and bound, method choice
   and tuning, brute force, estimate, predict (Plan), explain.
"""

from meshplan.planner.request import PlanRequest
from meshplan.planner.search.estimate import estimate

__all__ = ["PlanRequest", "estimate"]
