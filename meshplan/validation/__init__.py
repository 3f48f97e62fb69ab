"""meshplan.validation: the cost model held against published runs (`meshplan validate`).

A driver, not part of the planner: it builds the published models' profiles with
meshplan.models.analytic and predicts them with the planner's public search()/estimate().
- published: one prediction per row of published-runs.csv, memory checks
- orderings: published orderings the model must reproduce (Narayanan et al. 2021)
- report: reports/validation.md
"""

from __future__ import annotations

__all__ = ["validate_published", "write_validation_report"]


def validate_published(csv_path: str, on_row=None) -> list[dict]:
    from meshplan.validation.published import validate_published as run

    return run(csv_path, on_row)


def write_validation_report(rows: list[dict], md_path: str) -> None:
    from meshplan.validation.report import write_validation_report as write

    write(rows, md_path)
