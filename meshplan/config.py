"""Job files: every option of `meshplan plan`, `estimate`, `run` and `report` as a key of a TOML
file (`--config job.toml`), and the file of a command line (`--save-config job.toml`); and another
tool's configuration read as the options of plan and estimate (`--import`, meshplan/imports/).

The sections and keys are read off the verb's own argparse groups (meshplan/options.py): a group
titled "model" is the [model] section, an option --num-gpus is the key num_gpus. There is no
second list of options: a flag added to a group is a key of its section.
Flags given on the command line override the file. An unknown section or key, or a value of the
wrong type, is one MeshplanError line naming the key (exit 2). docs/config.md has examples.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.options import parse_overrides

VERBS = ("plan", "estimate", "run", "report")
"""The verbs that take --config/--save-config."""

NOT_KEYS = frozenset({"help", "config", "save_config", "import_path"})
"""Options that are not keys of a job file (--config itself, --import of another tool's config)."""


def key_of(action: argparse.Action) -> str:
    """--num-gpus -> num_gpus, -o/--output -> output, a positional -> its name."""
    longs = [s for s in action.option_strings if s.startswith("--")]
    if not action.option_strings:
        return action.dest
    return longs[0][2:].replace("-", "_") if longs else action.dest


def sections(parser: argparse.ArgumentParser) -> dict[str, dict[str, argparse.Action]]:
    """{section: {key: action}} of a verb's parser, from its argument groups' titles."""
    out: dict[str, dict[str, argparse.Action]] = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            if action.dest in NOT_KEYS or type(action) is argparse._StoreConstAction:
                continue  # --compile is an alias of --elementwise compiled
            section = group.title or ""
            if section in ("options", "positional arguments"):
                raise RuntimeError(f"{parser.prog}: option {action.dest} is in no section (put it in a named group)")
            out.setdefault(section, {})[key_of(action)] = action
    return out


def load(path: str, parser: argparse.ArgumentParser) -> tuple[dict[str, Any], dict[str, Any]]:
    """(values by dest, the file's table) of a job file for `parser`'s verb; MeshplanError
    naming the key for an unknown section or key or a wrong type."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MeshplanError(
            f"--config {path}: cannot read it ({exc.__class__.__name__}: {exc})", field="--config"
        ) from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MeshplanError(f"--config {path}: not TOML ({exc})", field="--config") from None
    known = sections(parser)
    values: dict[str, Any] = {}
    for section, body in table.items():
        if not isinstance(body, dict):
            where = [s for s, keys in known.items() if section in keys]
            hint = f"put it under [{where[0]}]" if where else "keys belong in sections"
            raise MeshplanError(f"{path}: {section} = {_toml(body)} is outside any section; {hint}", field=section)
        if section not in known:
            raise MeshplanError(
                f"{path}: [{section}] is not a section of {parser.prog} (its sections: {', '.join(known)})",
                field=section,
            )
        for key, value in body.items():
            action = known[section].get(key)
            if action is None:
                where = [s for s, keys in known.items() if key in keys]
                hint = f"; it belongs in [{where[0]}]" if where else f" (its keys: {', '.join(known[section])})"
                raise MeshplanError(f"{path}: [{section}] {key} is not an option of {parser.prog}{hint}", field=key)
            values[action.dest] = _check_value(path, section, key, value, action)
    return values, table


def _check_value(path: str, section: str, key: str, value: Any, action: argparse.Action) -> Any:
    def wrong(expected: str) -> MeshplanError:
        return MeshplanError(f"{path}: [{section}] {key} = {_toml(value)}: expected {expected}", field=key)

    if isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if action.nargs in ("+", "*"):  # --set KEY=VALUE ...: a table or a list of "k=v" strings
        if isinstance(value, dict):
            items = [f"{k}={_scalar_text(v)}" for k, v in value.items()]
            if any(isinstance(v, (dict, list)) for v in value.values()):
                raise wrong("a table of numbers, strings or booleans")
            return items
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise wrong('a table ({ layers = 4 }) or a list of "KEY=VALUE" strings')
    kind = action.type
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("a number")
        value = float(value)
    elif isinstance(value, list) and kind is not str and all(type(v) is int for v in value):
        value = ",".join(map(str, value))  # a comma list flag given as a TOML array (stage_layers = [2, 8])
    elif not isinstance(value, str):
        raise wrong("a string")
    if action.choices is not None and value not in action.choices:
        raise wrong("one of " + ", ".join(_toml(c) for c in action.choices))
    return value


def _scalar_text(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def apply(parser: argparse.ArgumentParser, values: dict[str, Any]) -> None:
    """Make the file's values the parser's defaults (flags then override them); an option the file
    gives is no longer required on the command line."""
    for action in parser._actions:
        if action.dest in values:
            action.required = False
            if not action.option_strings:
                action.nargs = "?"  # a positional the file names (run's plan) may be left out
    parser.set_defaults(**values)


def merge_lists(args: argparse.Namespace, parser: argparse.ArgumentParser, values: dict[str, Any]) -> None:
    """A KEY=VALUE list option (--set) the file gives: argparse appended the flags' items to the
    file's; a key the flags give replaces the file's item of that key."""
    for action in parser._actions:
        if action.nargs not in ("+", "*") or action.dest not in values:
            continue
        items = list(getattr(args, action.dest) or [])
        from_file, from_flags = items[: len(values[action.dest])], items[len(values[action.dest]) :]
        flags = {item.partition("=")[0].strip(): item for item in from_flags}  # the last of a key wins
        merged = [flags.pop(item.partition("=")[0].strip(), item) for item in from_file]  # in place
        setattr(args, action.dest, merged + list(flags.values()))


def dump(args: argparse.Namespace, parser: argparse.ArgumentParser, verb: str, defaults: dict[str, Any]) -> str:
    """The job file of a parsed command line: every option whose value is not its default
    (`defaults`: the parser's, before a --config file changed them)."""
    lines = [f"# meshplan {verb} job file: meshplan {verb} --config FILE (flags override it; docs/config.md)"]
    for section, keys in sections(parser).items():
        body = []
        for key, action in keys.items():
            value = getattr(args, action.dest, None)
            if value is None or value == defaults.get(action.dest) or (value == [] and action.nargs in ("+", "*")):
                continue
            if action.nargs in ("+", "*"):
                value = parse_overrides(value)
            elif isinstance(value, tuple):  # a comma list flag (--stage-layers 2,8): written as typed
                value = ",".join(map(str, value))
            body.append(f"{key} = {_toml(value)}")
        if body:
            lines += ["", f"[{section}]", *body]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return {math.inf: "inf", -math.inf: "-inf"}.get(value, "nan")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_bare(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


def _bare(key: str) -> str:
    return key if key and all(c.isalnum() or c in "_-" for c in key) else json.dumps(key)


def option_value(argv: list[str], flag: str) -> str | None:
    """The value given to `flag` on a command line not yet parsed (`--flag V` or `--flag=V`), or None."""
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token.partition("=")[2]
    return None


def apply_import(sub: argparse.ArgumentParser, argv: list[str], verb: str) -> dict | None:
    """--import PATH: the file's options become defaults (`plan` takes only its model, cluster, batch, precision
    and runtime, and searches the rest); returns the file's values for the comparison."""
    from meshplan.imports import read_config

    path = option_value(argv, "--import")
    if path is None:
        return None
    world = option_value(argv, "--num-gpus")
    imported = read_config(path, int(world) if world and world.isdigit() else None)
    values = dict(imported.values)
    for flag, key in (("--model", "model"), ("--cluster", "cluster")):
        if key not in values and flag not in argv:
            raise MeshplanError(f"--import {path}: the file names no {key}; give {flag}")
    apply(sub, values if verb == "estimate" else imported.fixed())
    for note in imported.notes:
        if "--quiet" not in argv and "-q" not in argv:
            print(f"meshplan {verb}: warning: --import {path}: {note}", file=sys.stderr)
    return {"path": path, "format": imported.format, "values": values}
