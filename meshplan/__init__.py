"""meshplan: auto-parallel planner, cost model and executor for PyTorch training.

Contracts (this package): ClusterSpec, ModelProfile, Plan. Subpackages: meshplan.profiler,
meshplan.planner, meshplan.executor (top-level folders profiler/, planner/, executor/).
"""

__version__ = "0.1.0"
