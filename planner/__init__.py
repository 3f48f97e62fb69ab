"""meshplan.planner: cost model and exact, fast search (pure Python; never imports torch).

Reads only the contracts (ModelProfile, ClusterSpec, PlanRequest) and writes a Plan.
Public API: search(), estimate(), PlanRequest. Layout: context (profile + cluster + request,
Candidate), compute / comm / memory / layer_cost (per-layer costs), pipeline (schedules, tail),
stages + partition + recompute (exact boundaries and recompute per candidate), enumerate + search
(branch and bound), predict (Plan and Prediction), estimate, explain (messages, JSON). Validation
against published runs is meshplan.validation; closed-form profiles are meshplan.models.analytic.
"""

from meshplan.planner.estimate import estimate
from meshplan.planner.request import PlanRequest
from meshplan.planner.search import search

__all__ = ["PlanRequest", "estimate", "search"]
