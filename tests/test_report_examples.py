"""reports/ stays fresh: the checked-in example reports equal what the current code generates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_fixtures import flat_plan, run_for, searched_plan, uneven_plan

from meshplan import examples, schema

REPORTS = Path(__file__).resolve().parent.parent / "reports"


def _planner_ready() -> str:
    """Why the real examples cannot be generated yet ("" when they can)."""
    try:
        from meshplan.profiler import profile_model  # noqa: F401

        examples.planner_search()
    except ImportError as exc:
        return f"the planner/profiler is not importable yet ({exc}); the example reports need meshplan.planner.search"
    return ""


def test_checked_in_reports_are_fresh():
    why = _planner_ready()
    if why:
        pytest.skip(why)
    stale = examples.stale_reports(REPORTS)
    assert not stale, "stale example reports; regenerate with `make reports`:\n" + "\n".join(stale)


@pytest.fixture()
def fake_planner(monkeypatch):
    """Examples planned by hand-built plans, so the staleness machinery is tested without the planner."""
    plans = dict(zip((e.name for e in examples.EXAMPLES), (searched_plan, flat_plan, uneven_plan)))
    monkeypatch.setattr(examples, "plan_example", lambda ex: plans[ex.name]())


def _write_all(out: Path) -> None:
    examples.generate(out, demo=False, quiet=True)
    plan = searched_plan()
    examples.write_example(plan, out / examples.DEMO, "demo title", run=run_for(plan))
    schema.save(run_for(plan), out / examples.DEMO / "run.json")


def test_fresh_reports_are_not_stale(fake_planner, tmp_path):
    _write_all(tmp_path)
    folder = tmp_path / examples.EXAMPLES[0].name
    names = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert {
        "plan.json",
        "report.md",
        "report.html",
        "plots/timeline.svg",
        "exports/torchtitan/meshplan_torchtitan.py",
        "exports/megatron/megatron_args.sh",
        "exports/deepspeed/ds_config.json",
        "exports/accelerate/accelerate_config.yaml",
    } <= names
    assert examples.stale_reports(tmp_path) == []


def test_search_time_and_float_noise_do_not_make_a_report_stale(fake_planner, tmp_path):
    _write_all(tmp_path)
    path = tmp_path / examples.EXAMPLES[0].name / "plan.json"
    data = json.loads(path.read_text())
    data["search"]["search_time_s"] = 9.99
    data["prediction"]["step_time_s"] *= 1 + 1e-15  # last-bit noise from summation order
    path.write_text(json.dumps(data, indent=2))
    assert examples.stale_reports(tmp_path) == []
    data["prediction"]["step_time_s"] *= 1.001
    path.write_text(json.dumps(data, indent=2))
    assert examples.stale_reports(tmp_path) == [f"{examples.EXAMPLES[0].name}: plan.json differs"]


def test_edits_missing_and_leftover_files_are_stale(fake_planner, tmp_path):
    _write_all(tmp_path)
    name = examples.EXAMPLES[1].name
    md = tmp_path / name / "report.md"
    md.write_text(md.read_text().replace("ZeRO-3", "ZeRO-2"))
    (tmp_path / name / "plots" / "memory.svg").unlink()
    (tmp_path / name / "plots" / "old.svg").write_text("<svg/>")
    stale = examples.stale_reports(tmp_path)
    assert f"{name}: report.md differs" in stale
    assert f"{name}: plots/memory.svg is missing" in stale
    assert f"{name}: plots/old.svg is no longer generated" in stale


def test_demo_is_compared_by_re_rendering_its_plan_and_run(fake_planner, tmp_path):
    _write_all(tmp_path)
    demo = tmp_path / examples.DEMO
    (demo / "profile.json").write_text("{}")  # the demo's other outputs are not compared
    assert examples.stale_reports(tmp_path) == []
    run = json.loads((demo / "run.json").read_text())
    run["step_time_s"] *= 2  # a new measurement that the report was not regenerated from
    (demo / "run.json").write_text(json.dumps(run))
    assert f"{examples.DEMO}: report.md differs" in examples.stale_reports(tmp_path)
    (demo / "report.md").unlink()
    assert any("missing plan.json or report.md" in s for s in examples.stale_reports(tmp_path))


def test_missing_example_folder_is_stale(fake_planner, tmp_path):
    assert any("missing" in s for s in examples.stale_reports(tmp_path))
