"""Plan reports (Markdown + one self-contained HTML file) and exports to other trainers.

Public API (called by the CLI's `meshplan report` / `meshplan export`):
- write_report(plan, out_dir, *, run=None, title=None) -> list[Path]
- export_plan(plan, target) -> dict[str, str]      filename -> content
- stale_reports(out_dir) -> list[str]              checked-in example reports that differ
Reports are pure functions of the plan (and run): no timestamps, same input, same bytes.
"""
from __future__ import annotations

from pathlib import Path

from meshplan.plan import Plan
from meshplan.report.exports import EXPORT_TARGETS, export_plan
from meshplan.run_result import RunResult
from meshplan.schema import write_text_atomic

__all__ = ["write_report", "export_plan", "stale_reports", "EXPORT_TARGETS"]


def write_report(plan: Plan, out_dir: str | Path, *, run: RunResult | None = None,
                 title: str | None = None) -> list[Path]:
    """Write out_dir/report.md, out_dir/report.html and the Markdown's plots/*.svg; return the paths."""
    from meshplan.report.content import build_document
    from meshplan.report.html import render_html
    from meshplan.report.markdown import PLOTS_DIR, render_markdown

    out = Path(out_dir)
    doc = build_document(plan, run=run, title=title)
    written = []
    for figure in doc.figures():
        path = out / PLOTS_DIR / f"{figure.name}.svg"
        write_text_atomic(path, figure.svg + "\n")
        written.append(path)
    for name, text in (("report.md", render_markdown(doc)), ("report.html", render_html(doc))):
        write_text_atomic(out / name, text)
        written.append(out / name)
    return [written[-2], written[-1], *written[:-2]]


def stale_reports(out_dir: str | Path) -> list[str]:
    """Names of example reports under out_dir that differ from a fresh regeneration."""
    from meshplan.report.examples import stale_reports as _stale

    return _stale(out_dir)
