"""meshplan's measured claims: `python -m benchmarks.run --out reports [--quick]` (see README.md)."""
