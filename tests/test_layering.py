"""The dependency direction of docs/design.md, read from the source with `ast` (nothing is imported):
contracts (meshplan) <- models, planner, report <- executor <- profiler <- inputs <- validation <-
the drivers (cli, commands, demo, examples); the planner reads only contracts, its own layers only
downward (base <- cost <- methods <- rank <- search); the profiler reaches the executor only through
its public wrappers module; reports are pure functions of contracts; no module reaches itself
through its imports (function-level ones too)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
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


def imports(path: Path, name: str | None = None, known: dict[str, Path] | None = None) -> set[str]:
    """Every module a file imports, at top level or inside a function; `from pkg import name` counts
    as pkg.name when that is a module of this repository (or of `known`), else as pkg."""
    name = name or module_name(path)
    known = ALL_MODULES if known is None else known
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
            subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
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


PACKAGE_RANKS = {
    "contracts": 0,
    "models": 1,
    "planner": 1,
    "report": 1,
    "executor": 2,
    "profiler": 3,
    "inputs": 4,
    "validation": 5,
    "drivers": 6,
}
"""Top-level packages, bottom first: a package imports only packages of a lower rank (never one of
its own rank: the planner does not read the models, nor the models the planner)."""
DRIVER_MODULES = ("meshplan.cli", "meshplan.commands", "meshplan.demo", "meshplan.examples", "meshplan.__main__")
"""The drivers' modules; meshplan.commands is a package: its modules are drivers too."""

PLANNER_LAYERS = {"cost": 1, "methods": 2, "rank": 3, "search": 4}
"""meshplan.planner's layers below its facade (planner/__init__.py); the modules directly in planner/
(request, context and the profile transforms it applies) are the base layer, 0."""


def package_of(name: str) -> str:
    for pkg in ("models", "planner", "profiler", "executor", "report", "validation", "inputs"):
        if under(name, [f"meshplan.{pkg}"]):
            return pkg
    return "drivers" if under(name, DRIVER_MODULES) else "contracts"


def planner_layer(name: str) -> int:
    """The planner layer of a meshplan.planner module: 0 base .. 4 search, 5 the facade."""
    parts = name.split(".")
    if name == "meshplan.planner":
        return 5
    return PLANNER_LAYERS.get(parts[2], 0) if len(parts) > 3 or parts[2] in PLANNER_LAYERS else 0


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the repository modules it imports (a submodule import counts as its module)."""

    def owner(imp: str) -> str | None:
        while imp not in mods and "." in imp:
            imp = imp.rpartition(".")[0]
        return imp if imp in mods else None

    return {
        name: {o for imp in imports(path, name, mods) if (o := owner(imp)) is not None and o != name}
        for name, path in mods.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(iter(children), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def upward_package_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{mod} imports {imp}"
        for mod, imps in edges.items()
        for imp in imps
        if PACKAGE_RANKS[package_of(imp)] >= PACKAGE_RANKS[package_of(mod)] and package_of(imp) != package_of(mod)
    )


def upward_planner_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{mod} imports {imp}"
        for mod, imps in edges.items()
        if under(mod, ["meshplan.planner"])
        for imp in imps
        if under(imp, ["meshplan.planner"]) and planner_layer(imp) > planner_layer(mod)
    )


def test_the_cycle_finder_sees_function_level_cycles(tmp_path):
    (tmp_path / "a.py").write_text("from meshplan.planner.cost import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from meshplan.planner.cost import a\n")
    (tmp_path / "c.py").write_text("from meshplan.planner.cost import a\n")
    mods = {f"meshplan.planner.cost.{n}": tmp_path / f"{n}.py" for n in "abc"}
    assert cycles(graph(mods)) == [{"meshplan.planner.cost.a", "meshplan.planner.cost.b"}]


def test_no_module_reaches_itself_through_its_imports():
    found = cycles(graph(ALL_MODULES))
    assert [sorted(c) for c in found] == []


def test_planner_layers_import_only_downward():
    assert {m for m in ALL_MODULES if under(m, ["meshplan.planner"]) and planner_layer(m) == 4}, "no search layer"
    assert upward_planner_imports(graph(ALL_MODULES)) == []


def test_top_level_packages_import_only_downward():
    assert upward_package_imports(graph(ALL_MODULES)) == []


def test_the_layer_checks_see_an_upward_import(tmp_path):
    (tmp_path / "x.py").write_text("from meshplan.planner.search import tuning\n")
    (tmp_path / "y.py").write_text("from meshplan.executor import wrappers\n")
    mods = {"meshplan.planner.cost.x": tmp_path / "x.py", "meshplan.planner.search.tuning": tmp_path / "x.py"}
    assert upward_planner_imports(graph(mods)) == ["meshplan.planner.cost.x imports meshplan.planner.search.tuning"]
    mods = {"meshplan.models.y": tmp_path / "y.py", "meshplan.executor.wrappers": tmp_path / "x.py"}
    assert upward_package_imports(graph(mods)) == ["meshplan.models.y imports meshplan.executor.wrappers"]


def test_the_planner_imports_at_module_level_only():
    """A function-level import in the planner hid a cycle once (seventeen of them); the layers make
    every planner import a top-level one."""
    found = []
    for name, path in modules("planner").items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found += [
                    f"{name}:{sub.lineno}"
                    for sub in ast.walk(node)
                    if isinstance(sub, ast.Import | ast.ImportFrom)
                    and any(under(i, ["meshplan"]) for i in imports_of(sub))
                ]
    assert found == []


def imports_of(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module or ""]
