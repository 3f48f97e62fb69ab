"""Section 4: predicted vs measured peak memory per rank on the local grid.

Measured: the executor's RunResult.peak_memory_bytes, the max over ranks of the live-tensor
tracker's peak during the first (warm-up) step on CPU (torch.cuda.max_memory_allocated on GPU).
Predicted: Plan.prediction.peak_memory_bytes (max over pipeline ranks).
"""

from __future__ import annotations

from benchmarks.common import mape


def memory_rows(rows: list[dict]) -> list[dict]:
    return [
        {
            "name": r["name"],
            "config": r["config"],
            "predicted_bytes": r["predicted_memory_bytes"],
            "measured_bytes": r["measured_memory_bytes"],
            "error": r["predicted_memory_bytes"] / r["measured_memory_bytes"] - 1,
        }
        for r in rows
        if r.get("measured_memory_bytes")
    ]


def summarize(rows_by_model: dict[str, list[dict]]) -> dict:
    per_plan = {m: memory_rows(rows) for m, rows in rows_by_model.items()}
    flat = [r for rows in per_plan.values() for r in rows]
    if not flat:
        return {"mape": None, "num_plans": 0, "models": per_plan}
    return {
        "mape": mape([r["predicted_bytes"] for r in flat], [r["measured_bytes"] for r in flat]),
        "num_plans": len(flat),
        "models": per_plan,
    }
