"""meshplan.planner: cost model and exact, fast search (pure Python; never imports torch).

Public API: search(), estimate(), validate_published(), write_validation_report(),
PlanRequest. Layout: context (profile + cluster + request, Candidate), compute / comm / memory /
layer_cost (per-layer costs), pipeline (schedules, tail), stages + partition + recompute (exact
boundaries and recompute per candidate), enumerate + search (branch and bound), predict (Plan and
Prediction), estimate, explain (messages, JSON), analytic (closed-form GPT/Llama profiles),
validation + orderings + validation_report (published runs).
"""
from meshplan.planner.estimate import estimate
from meshplan.planner.request import PlanRequest
from meshplan.planner.search import search

__all__ = ["PlanRequest", "estimate", "search", "validate_published", "write_validation_report"]


def validate_published(csv_path: str) -> list[dict]:
    from meshplan.planner.validation import validate_published as run

    return run(csv_path)


def write_validation_report(rows: list[dict], md_path: str) -> None:
    from meshplan.planner.validation_report import write_validation_report as write

    write(rows, md_path)
