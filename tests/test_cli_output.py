"""Output for machines and pipes: piped tables keep every number (full width), --plain is TSV,
--json errors are JSON objects naming the field, `run --print-launch --json` is JSON, a launch
line that does not fit one host is said, every option has help text, the verbs are listed once."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from meshplan.cli import build_parser, main

GPT175 = ["--model", "analytic:gpt", "--set", "layers=96", "hidden=12288", "heads=96", "--cluster", "a100-80g"]
GPT175 += ["--num-gpus", "1024", "--global-batch", "1536", "--top", "2"]


def test_a_piped_table_keeps_every_number_and_plain_is_tsv(capsys):
    assert main(["plan", *GPT175]) == 0  # capsys: stdout is not a terminal
    out = capsys.readouterr().out
    assert "…" not in out and re.search(r"Interleaved1F1B v\d+ ", out)
    row = next(line for line in out.splitlines() if "best" in line)
    assert main(["plan", *GPT175, "--plain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("\tpp\tdp")))
    assert lines[header].split("\t")[-3:] == ["tok/s/gpu", "MFU", "peak GiB"]
    assert lines[header + 1].split("\t")[0] == "best" and len(lines[header + 1].split("\t")) == 12
    # the piped table's row holds every number of the TSV row, uncut, on one line
    cells = [c for c in lines[header + 1].split("\t") if c]
    assert all(f" {c} " in row for c in cells), (cells, row)
    assert "┃" not in "\n".join(lines)


@pytest.mark.parametrize(
    "argv, field, code",
    [
        (["plan", "--num-gpus", "0"], "--num-gpus", 2),
        (["plan", "--tp", "two"], "--tp", 2),
        (["estimate", "--tp", "1"], "--microbatch", 2),
        (["report", "missing.json"], None, 2),
    ],
)
def test_json_errors_are_objects_with_code_message_and_field(capsys, argv, field, code):
    assert main([*argv, "--json"]) == code
    out, err = capsys.readouterr()
    error = json.loads(out)["error"]
    assert error["code"] == code and error["field"] == field and error["message"] and error["message"] in err


def test_print_launch_json_and_the_one_host_warning(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    pins = ["--tp", "1", "--pp", "1", "--dp", "16", "--microbatch", "1", "--schedule", "1f1b", "--recompute", "none"]
    assert main(["estimate", "--cluster", "a100-80g", "--num-gpus", "16", *pins, "-o", str(plan), "-q"]) == 0
    capsys.readouterr()
    assert main(["run", str(plan), "--print-launch", "--json"]) == 0
    out, err = capsys.readouterr()
    view = json.loads(out)
    assert view["nproc_per_node"] == 16 and "--standalone" in view["argv"] and view["command"].count("--plan") == 1
    assert "one a100-80g node has 8 devices: run it on 2 hosts with --nnodes 2" in err
    assert view["warnings"] and view["warnings"][0] in err
    assert main(["run", str(plan), "--print-launch", "--json", "--nnodes", "2", "--rdzv-endpoint", "h0:29500"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["nproc_per_node"] == 8 and json.loads(out)["warnings"] == [] and "warning" not in err


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_option_has_help_and_the_verbs_are_listed_once():
    parser = build_parser()
    missing = [
        f"{verb} {a.option_strings or a.dest}"
        for verb, sub in _subparsers(parser).items()
        for a in sub._actions
        if not a.help
    ]
    assert missing == []
    text = parser.format_help()
    for verb in _subparsers(parser):
        assert sum(line.split()[:1] == [verb] for line in text.splitlines()) == 1, verb
