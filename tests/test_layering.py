"""The dependency direction of DESIGN.md, read from the source with `ast` (nothing is imported):
contracts (meshplan) <- models <- profiler, executor; the planner reads only contracts; the profiler
reaches the executor only through its public wrappers module; reports are pure functions of contracts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "meshplan": "meshplan",
    "models": "meshplan.models",
    "profiler": "meshplan.profiler",
    "planner": "meshplan.planner",
    "executor": "meshplan.executor",
}
"""Top-level folder -> import name (setup.py's ROOTS)."""
EXECUTOR_API = "meshplan.executor.wrappers"
DRIVERS = ("meshplan.demo", "meshplan.examples", "meshplan.validation", "meshplan.cli", "meshplan.commands")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [PACKAGES[rel.parts[0]], *rel.parts[1:]]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(folder: str) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / folder).rglob("*.py"))}


ALL_MODULES = {name: path for folder in PACKAGES for name, path in modules(folder).items()}


def imports(path: Path, name: str | None = None) -> set[str]:
    """Every module a file imports, at top level or inside a function; `from pkg import name` counts
    as pkg.name when that is a module of this repository, else as pkg."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in ALL_MODULES]
            found.update(subs or [base])
    return found


def under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def offences(folder: str, allowed, forbidden) -> list[str]:
    return sorted(
        f"{mod} imports {imp}"
        for mod, path in modules(folder).items()
        for imp in imports(path)
        if under(imp, forbidden) and not allowed(imp)
    )


def test_the_parser_sees_lazy_and_from_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import torch\nfrom meshplan.executor import wrappers\nfrom . import timing\n"
        "def f():\n    from meshplan.models.zoo import base\n    from meshplan.profiler import nothing\n"
    )
    found = imports(probe, "meshplan.profiler.probe")
    assert found == {"torch", EXECUTOR_API, "meshplan.profiler.timing", "meshplan.models.zoo.base", "meshplan.profiler"}


def test_executor_does_not_import_the_profiler():
    assert offences("executor", lambda imp: False, ["meshplan.profiler"]) == []


def test_profiler_uses_only_the_executors_public_api():
    assert offences("profiler", lambda imp: imp == EXECUTOR_API, ["meshplan.executor"]) == []
    assert (ROOT / "executor" / "wrappers.py").is_file()


def test_models_import_neither_profiler_nor_executor_nor_planner():
    assert (
        offences("models", lambda imp: False, ["meshplan.profiler", "meshplan.executor", "meshplan.planner", *DRIVERS])
        == []
    )


def test_planner_reads_only_contracts():
    forbidden = ["torch", "meshplan.profiler", "meshplan.executor", "meshplan.models", "meshplan.report", *DRIVERS]
    assert offences("planner", lambda imp: False, forbidden) == []


def test_report_is_a_function_of_contracts():
    forbidden = ["meshplan.planner", "meshplan.profiler", "meshplan.executor", "meshplan.models", "torch", *DRIVERS]
    report = {m: p for m, p in modules("meshplan").items() if under(m, ["meshplan.report"])}
    assert report, "meshplan/report/ not found"
    assert sorted(f"{m} imports {i}" for m, p in report.items() for i in imports(p) if under(i, forbidden)) == []


@pytest.mark.parametrize("start", ["meshplan.demo", "meshplan.examples"])
def test_demo_examples_and_report_form_no_cycle(start):
    """Depth-first from the driver over repository modules: no path leads back to where it began."""

    def reachable(name: str, seen: set[str]) -> set[str]:
        for imp in imports(ALL_MODULES[name]):
            if imp in ALL_MODULES and imp not in seen:
                seen.add(imp)
                reachable(imp, seen)
        return seen

    assert start not in reachable(start, set())
