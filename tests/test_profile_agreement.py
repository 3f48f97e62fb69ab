"""One architecture, one prediction: the closed-form profile (`--model analytic:gpt|llama`), the
captured zoo model (`--model gpt|llama --set ...`) and an HF config of the same shape
(`--model hf:...`) price a plan within 2% of each other, in step time and in peak memory.

Swept over every published row meshplan validate predicts (its own command line, the model
swapped) and over torchtitan's Llama 3.1 8B rows. The runtimes of those rows build their own
model of the shape (runtime behaviour model_source): a standard block captured from any module
is priced as that runtime's block (models/analytic.as_runtime_builds)."""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import pytest

import meshplan
from benchmarks.heldout_runs import _rows as heldout_rows
from benchmarks.heldout_runs import command as heldout_command
from meshplan.planner.search import search
from meshplan.validation.published import cli_inputs, row_argv, with_source_degrees, with_source_software

CSV = Path(meshplan.__file__).resolve().parent / "data" / "published-runs.csv"
TOLERANCE = 0.02


def _rows() -> list[dict]:
    with open(CSV, newline="") as fh:
        return with_source_software(with_source_degrees(list(csv.DictReader(fh))))


def _swap(argv: list[str], model: str, *extra_set: str) -> list[str]:
    """The same command line with another --model of the same shape (and --seq, which a built
    model takes from its config: the closed form's `seq=` key)."""
    i = argv.index("--model")
    j = argv.index("--set")
    shape = argv[j + 1 : argv.index("--cluster")]
    seq = next(kv.split("=")[1] for kv in shape if kv.startswith("seq="))
    return [*argv[:i], "--model", model, *argv[i + 2 : j + 1], *extra_set, *argv[j + 1 :], "--seq", seq]


@functools.cache
def _predict(argv: tuple[str, ...]) -> tuple[float, float]:
    plan = search(*cli_inputs(list(argv)))
    return plan.prediction.step_time_s, plan.prediction.peak_memory_bytes


def _agree(closed: list[str], other: list[str]) -> None:
    (t0, m0), (t1, m1) = _predict(tuple(closed)), _predict(tuple(other))
    assert t1 == pytest.approx(t0, rel=TOLERANCE), f"step time {t1:.4f} s vs closed form {t0:.4f} s: {other}"
    assert m1 == pytest.approx(m0, rel=TOLERANCE), f"peak memory {m1 / 2**30:.2f} vs {m0 / 2**30:.2f} GiB: {other}"


ROWS = _rows()


@pytest.mark.parametrize("index", range(len(ROWS)), ids=lambda i: f"row{i + 1}")
def test_captured_zoo_gpt_agrees_with_the_closed_form(index):
    argv = row_argv(ROWS[index])
    _agree(argv, _swap(argv, "gpt"))


# HF GPT-2 ties its LM head to the embedding by default; untied it is the closed form's shape
HF_ROWS = (0, 10, 12, 19, 23)  # tp 1 and 8, pp 1 and 8, materialised and flash attention, both runtimes


@pytest.mark.parametrize("index", HF_ROWS, ids=lambda i: f"row{i + 1}")
def test_hf_gpt2_config_agrees_with_the_closed_form(index):
    argv = row_argv(ROWS[index])
    _agree(argv, _swap(argv, "hf:gpt2", "tie_word_embeddings=false"))


LLAMA_8B = [row for row in heldout_rows() if row["model"] == "8B" and row["gpus"] == 8][:4]


@pytest.mark.parametrize("model", ["llama", "hf:meta-llama/Llama-3.1-8B"])
@pytest.mark.parametrize("row", LLAMA_8B, ids=lambda r: f"{r['label']}-{r['seq']}".replace(" ", "_"))
def test_llama_shapes_agree_with_the_closed_form(row, model):
    argv = ["plan", *heldout_command(row)[1:]]  # its pins, searched over the rest as validate does
    _agree(argv, _swap(argv, model))
