"""`make reports` (python -m meshplan.examples --out reports): the example reports in reports/.

- demo/: gpt-tiny on 4 local CPU ranks WITH a measured run (meshplan.demo: profile on this CPU,
  measured gloo links, search, torchrun, report).
- planner-only examples, profiled on the meta device with spec-sheet cluster presets, so they are
  a pure function of the code: GPT-3 175B on 1024 A100-80GB, Llama-3 70B on 64 H100, ResNet-50
  (a non-transformer) on 8 A100-80GB. Each folder holds plan.json, the report and the exports.

`stale_reports(out)` regenerates the planner-only examples in a temporary folder and compares
them byte for byte (plan.json without its measured search_time_s). The demo's plan comes from
measured timings, so it cannot be byte-compared; instead its report is re-rendered from its
checked-in plan.json and run.json and compared.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from meshplan import schema
from meshplan.errors import MeshplanError
from meshplan.plan import Plan
from meshplan.report import EXPORT_TARGETS, export_plan, write_report
from meshplan.run_result import RunResult

DEMO = "demo"


@dataclass(frozen=True, kw_only=True)
class Example:
    name: str
    """Folder under reports/."""
    model: str
    cluster: str
    num_gpus: int
    global_batch: int
    seq: int | None = None
    title: str


EXAMPLES = (
    Example(
        name="gpt3-175b-1024xa100",
        model="gpt3-175b",
        cluster="a100-80g",
        num_gpus=1024,
        global_batch=1536,
        seq=2048,
        title="GPT-3 175B on 1024 x A100-80GB (global batch 1536 x 2048 tokens)",
    ),
    Example(
        name="llama3-70b-64xh100",
        model="llama3-70b",
        cluster="h100-80g",
        num_gpus=64,
        global_batch=128,
        seq=8192,
        title="Llama-3 70B on 64 x H100-80GB (global batch 128 x 8192 tokens)",
    ),
    Example(
        name="resnet50-8xa100",
        model="resnet50",
        cluster="a100-80g",
        num_gpus=8,
        global_batch=1024,
        title="ResNet-50 on 8 x A100-80GB (global batch 1024 images, a non-transformer)",
    ),
)


def planner_search():
    """meshplan.planner.search.search (the function)."""
    from meshplan.planner.search import search

    return search


def plan_example(ex: Example) -> Plan:
    """Profile on meta, plan against the spec-sheet preset: deterministic for given code."""
    from meshplan.planner.request import PlanRequest
    from meshplan.presets import cluster_preset
    from meshplan.profiler import profile_model

    profile = profile_model(ex.model, None, device="meta")
    cluster = cluster_preset(ex.cluster, ex.num_gpus)
    return planner_search()(
        profile, cluster, PlanRequest(num_gpus=ex.num_gpus, global_batch=ex.global_batch, seq=ex.seq)
    )


def write_example(plan: Plan, folder: Path, title: str, run: RunResult | None = None) -> list[Path]:
    """plan.json, report.md, report.html, plots/ and exports/<target>/ in `folder`."""
    schema.save(plan, folder / "plan.json")
    paths = [folder / "plan.json", *write_report(plan, folder, run=run, title=title)]
    for target in EXPORT_TARGETS:
        for name, text in export_plan(plan, target).items():
            schema.write_text_atomic(folder / "exports" / target / name, text)
            paths.append(folder / "exports" / target / name)
    return paths


def generate(out: Path, names: list[str] | None = None, *, demo: bool = True, quiet: bool = False) -> None:
    say = (lambda *_: None) if quiet else (lambda text: print(text, flush=True))
    for ex in EXAMPLES:
        if names and ex.name not in names:
            continue
        say(f"planning {ex.name}: {ex.model} on {ex.num_gpus} x {ex.cluster}")
        write_example(plan_example(ex), out / ex.name, ex.title)
    if demo and (not names or DEMO in names):
        from meshplan.demo import run_demo

        say(f"running the demo into {out / DEMO} (profile, links, plan, torchrun, report)")
        plan, run = run_demo(out / DEMO, quiet=quiet)
        write_example(plan, out / DEMO, _title(out / DEMO), run=run)


def _title(folder: Path) -> str:
    """The title the report was written with (its first Markdown line)."""
    first = (folder / "report.md").read_text().splitlines()[0]
    return first.removeprefix("# ")


def _rounded(value):
    """Floats to 9 significant digits: summation order may move the last bits between processes."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _normalised(path: Path) -> bytes:
    if path.name != "plan.json":
        return path.read_bytes()
    data = json.loads(path.read_text())
    if isinstance(data.get("search"), dict):
        data["search"]["search_time_s"] = 0.0  # measured, not part of the plan
    return json.dumps(_rounded(data), sort_keys=True).encode()


def _compare(checked_in: Path, fresh: Path, name: str, extra_ok: bool = False) -> list[str]:
    """'name: file ...' for every file missing, extra (unless extra_ok) or different between the folders."""
    if not checked_in.is_dir():
        return [f"{name}: missing (run `make reports`)"]
    ours = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
    theirs = {p.relative_to(checked_in) for p in checked_in.rglob("*") if p.is_file()}
    out = [f"{name}: {rel} is missing" for rel in sorted(ours - theirs)]
    out += [] if extra_ok else [f"{name}: {rel} is no longer generated" for rel in sorted(theirs - ours)]
    out += [
        f"{name}: {rel} differs"
        for rel in sorted(ours & theirs)
        if _normalised(checked_in / rel) != _normalised(fresh / rel)
    ]
    return out


def _demo_outputs(folder: Path, into: Path) -> None:
    """Re-render the demo's report and exports from its checked-in plan.json and run.json."""
    plan = schema.load(Plan, folder / "plan.json", "plan")
    run = schema.load(RunResult, folder / "run.json", "run") if (folder / "run.json").exists() else None
    write_example(plan, into, _title(folder), run=run)


def stale_reports(out_dir: str | Path) -> list[str]:
    """Example reports under out_dir that differ from what the current code generates."""
    out = Path(out_dir)
    stale: list[str] = []
    with tempfile.TemporaryDirectory(prefix="meshplan-reports-") as tmp:
        for ex in EXAMPLES:
            write_example(plan_example(ex), Path(tmp) / ex.name, ex.title)
            stale += _compare(out / ex.name, Path(tmp) / ex.name, ex.name)
        demo = out / DEMO
        if not (demo / "plan.json").exists() or not (demo / "report.md").exists():
            stale.append(f"{DEMO}: missing plan.json or report.md (run `make reports`)")
        else:
            _demo_outputs(demo, Path(tmp) / DEMO)
            stale += _compare(demo, Path(tmp) / DEMO, DEMO, extra_ok=True)  # profile, cluster, run logs
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m meshplan.examples", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="reports", help="folder holding one sub-folder per example")
    parser.add_argument("--only", nargs="*", help=f"example names: {DEMO}, " + ", ".join(e.name for e in EXAMPLES))
    parser.add_argument("--no-demo", action="store_true", help="skip the demo (it runs torchrun on 4 CPU ranks)")
    parser.add_argument("--check", action="store_true", help="only list stale reports; exit 1 if any")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_reports(args.out)
            print("\n".join(stale) if stale else "all example reports are fresh")
            return 1 if stale else 0
        generate(Path(args.out), args.only, demo=not args.no_demo, quiet=args.quiet)
    except MeshplanError as exc:
        print(f"meshplan reports: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
