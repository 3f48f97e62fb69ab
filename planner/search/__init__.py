"""The planner's search layer: candidates, stage partition and recompute solvers, branch and bound,
method choice and tuning, brute force, estimate, predict and explain; reads every layer below.

`search()` is the best plan for a request (search/branch_bound.py)."""

from meshplan.planner.search.branch_bound import search

__all__ = ["search"]
