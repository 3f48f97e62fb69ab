"""Maps the top-level models/, profiler/, planner/ and executor/ folders into the single import
namespace meshplan.* (docs/design.md, "Layout"); all metadata lives in pyproject.toml."""

from setuptools import find_packages, setup

ROOTS = {
    "meshplan": "meshplan",
    "meshplan.models": "models",
    "meshplan.profiler": "profiler",
    "meshplan.planner": "planner",
    "meshplan.executor": "executor",
}

packages, package_dir = [], {}
for name, folder in ROOTS.items():
    package_dir[name] = folder
    packages.append(name)
    for sub in find_packages(folder):
        packages.append(f"{name}.{sub}")
        package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

# meshplan/data holds no Python, only the shipped tables (hardware.csv, published-runs.csv): a
# data-only package, read with importlib.resources.files("meshplan.data").
packages.append("meshplan.data")
package_dir["meshplan.data"] = "meshplan/data"

setup(packages=packages, package_dir=package_dir)
