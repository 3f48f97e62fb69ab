"""Gradient compression on slow links, measured vs predicted against DDP (issue #15).

    python -m benchmarks.compression_slow_link [--rates 1gbit,100mbit,none] [--steps 8] [--out F.json]

gpt-tiny on 4 gloo ranks (SGD + momentum, lr 0.2, a learnable token pattern: `pattern_dataset`),
DDP and each compressor at one or two settings, at each rate: inside a fresh slow-link namespace
(benchmarks/slow_link.py; "none" = the plain loopback) it first measures the links there with
`meshplan profile-links --nproc 4` and then runs every plan in one launch, so the prediction
(estimate() on that measured ClusterSpec, modelled compute) and the measurement see the same
wire. Per row: median step time after the first two steps, predicted step time, counted and
predicted bytes per step and rank, loss after --steps steps and its ratio to DDP's. Per rate: the
prediction's mean absolute percentage error and whether each method's predicted ordering against
DDP (faster / slower) holds. Bounded: --timeout-s per rate (profile-links + one launch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

METHODS = [
    ("none", {}),
    ("fp16", {}),
    ("powersgd", {"rank": 2}),
    ("accordion", {"window": 3}),
    ("topk", {"density": 0.01}),
    ("topk", {"density": 0.001}),
    ("accordion_topk", {"window": 3}),
    ("qsgd", {"bits": 4}),
    ("nuqsgd", {"bits": 4}),
    ("alq", {"bits": 3, "refit_every": 4}),
    ("amq", {"bits": 3, "refit_every": 4}),
]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINK_BYTES = {"none": 4 << 20, "1gbit": 4 << 20, "100mbit": 1 << 20}


def pattern_dataset(num_samples: int = 64, vocab: int = 256, seq: int = 32):
    """A learnable next-token task: each row counts up by its own stride (mod vocab)."""
    import torch

    gen = torch.Generator().manual_seed(11)
    start = torch.randint(0, vocab, (num_samples, 1), generator=gen)
    stride = torch.randint(1, 4, (num_samples, 1), generator=gen)
    tokens = (start + stride * torch.arange(seq + 1)) % vocab
    return [(row[:-1], row[1:]) for row in tokens]


def _plans():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from executor_plans import make_plan

    return [make_plan(dp=4, microbatch=4, compression=n, compression_params=p) for n, p in METHODS]


def _predict(plan, cluster_path: str) -> tuple[float, dict]:
    from meshplan.planner import PlanRequest, estimate
    from meshplan.presets import load_cluster
    from meshplan.profiler import profile_model

    c = plan.dp_methods.compression
    req = PlanRequest(
        num_gpus=4,
        global_batch=plan.global_batch_size,
        precision="fp32",
        dp=4,
        tp=1,
        pp=1,
        microbatch=plan.microbatch_size,
        zero=0,
        methods={"compression": (c.name, dict(c.params))},
    )
    pred = estimate(profile_model("gpt-tiny", {}, device="meta"), load_cluster(cluster_path, 4), req).prediction
    return pred.step_time_s, pred.comm_bytes_per_step


def inner(rate: str, steps: int, timeout_s: float) -> dict:
    """Inside the namespace (or on the plain loopback): links, then every plan in one launch."""
    from meshplan.executor.launch import LaunchOptions, run_plans

    with tempfile.TemporaryDirectory() as tmp:
        links = os.path.join(tmp, "links.json")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "meshplan",
                "profile-links",
                "--nproc",
                "4",
                "--max-bytes",
                str(MAX_LINK_BYTES.get(rate, 1 << 20)),
                "-o",
                links,
                "--quiet",
            ],
            check=True,
            timeout=timeout_s / 2,
            stdout=subprocess.DEVNULL,
        )
        plans = _plans()
        results = run_plans(
            plans,
            LaunchOptions(
                steps=steps,
                out_dir=os.path.join(tmp, "run"),
                quiet=True,
                timeout_s=timeout_s / 2,
                optimizer="sgd",
                lr=0.2,
                grad_clip=1.0,
                data="benchmarks.compression_slow_link:pattern_dataset",
                env={"PYTHONPATH": ROOT},
            ),
        )
        rows = []
        for (name, params), plan, result in zip(METHODS, plans, results):
            pred_s, pred_bytes = _predict(plan, links)
            rows.append(
                {
                    "method": name + "".join(f":{k}={v}" for k, v in params.items()),
                    "measured_step_s": statistics.median(result.step_times_s[2:]),
                    "predicted_step_s": pred_s,
                    "measured_bytes": result.comm_bytes_per_step.get("dp_replicate", 0),
                    "predicted_bytes": pred_bytes.get("dp_replicate", 0),
                    "loss_last": result.losses[-1],
                    "notes": [n for n in result.notes if "accordion" in n],
                }
            )
        links_fit = json.load(open(links)).get("collectives", [])
    return {"rate": rate, "rows": summarise(rows), "links": links_fit}


def summarise(rows: list[dict]) -> list[dict]:
    ddp = rows[0]
    for r in rows:
        r["error_pct"] = 100 * (r["predicted_step_s"] - r["measured_step_s"]) / r["measured_step_s"]
        r["loss_vs_ddp"] = r["loss_last"] / ddp["loss_last"]
        if r is not ddp:
            r["ordering_holds"] = (r["predicted_step_s"] < ddp["predicted_step_s"]) == (
                r["measured_step_s"] < ddp["measured_step_s"]
            )
    return rows


def outer(rate: str, steps: int, timeout_s: float) -> dict:
    """Run `inner` for one rate, inside a slow-link namespace unless rate is "none"."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.compression_slow_link",
            "--inner",
            rate,
            "--steps",
            str(steps),
            "--timeout-s",
            str(timeout_s),
            "--out",
            out.name,
        ]
        if rate != "none":
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.slow_link",
                "--rate",
                rate,
                "--timeout-s",
                str(timeout_s + 60),
                "--",
                *cmd,
            ]
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        if rc != 0:
            return {"rate": rate, "error": f"exit {rc}"}
        return json.load(open(out.name))


def table(result: dict) -> str:
    """Markdown rows for benchmarks/README.md."""
    lines = []
    for block in result["rates"]:
        if "error" in block:
            lines.append(f"{block['rate']}: {block['error']}")
            continue
        rows = block["rows"]
        mape = statistics.fmean(abs(r["error_pct"]) for r in rows)
        holds = sum(r.get("ordering_holds", False) for r in rows[1:])
        lines += [
            f"\n{block['rate']}: MAPE {mape:.0f}%, predicted ordering vs DDP holds for {holds}/{len(rows) - 1}\n",
            "| method | measured s | predicted s | err | bytes/step/rank (measured = predicted) | loss / DDP |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            same = "=" if r["measured_bytes"] == r["predicted_bytes"] else f"!= {r['predicted_bytes']:,}"
            lines.append(
                f"| {r['method']} | {r['measured_step_s']:.3f} | {r['predicted_step_s']:.3f} | "
                f"{r['error_pct']:+.0f}% | {r['measured_bytes']:,} {same} | {r['loss_vs_ddp']:.3f} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compression_slow_link")
    ap.add_argument("--rates", default="1gbit,100mbit,none", help="tc rates; none = plain loopback")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout-s", type=float, default=600, help="per rate: profile-links + the launch")
    ap.add_argument("--out", default="")
    ap.add_argument("--inner", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inner:
        result = inner(args.inner, args.steps, args.timeout_s)
    else:
        result = {"steps": args.steps, "rates": [outer(r, args.steps, args.timeout_s) for r in args.rates.split(",")]}
        print(table(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
