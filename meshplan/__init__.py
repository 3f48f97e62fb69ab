"""meshplan: auto-parallel planner, cost model and executor for PyTorch training.

Contracts (this package): ClusterSpec, ModelProfile, Plan, RunResult. Subpackages: meshplan.models,
meshplan.profiler, meshplan.planner, meshplan.executor (top-level folders models/, profiler/,
planner/, executor/; docs/design.md).
"""

__version__ = "0.1.0"

from meshplan import schema  # noqa: E402 (the version first: modules below may read it)
from meshplan.cluster import ClusterSpec  # noqa: E402
from meshplan.model_profile import ModelProfile  # noqa: E402
from meshplan.plan import Plan  # noqa: E402
from meshplan.run_result import RunResult  # noqa: E402

schema.CONTRACTS.update(
    {
        ModelProfile: "from meshplan profile",
        ClusterSpec: "from meshplan profile-links or a preset",
        Plan: "from meshplan plan -o",
        RunResult: "run.json from meshplan run",
    }
)
