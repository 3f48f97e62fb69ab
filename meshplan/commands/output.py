"""What the verbs print, and where: tables for people (boxed on a terminal, full width in a pipe,
tab-separated with --plain), JSON for programs (--json: on the real stdout, everything else on
stderr), progress bars only for a person at a terminal, and warning lines on stderr."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

from meshplan import schema


def console():
    from rich.console import Console

    return Console(stderr=True)


def interactive() -> bool:
    """Progress bars only for a person at a terminal (stderr), never in a pipe or a CI log."""
    return sys.stderr.isatty()


def _no_tick(done: int, total: int, label: str | None = None) -> None:
    pass


@contextlib.contextmanager
def progress(args: argparse.Namespace, message: str) -> Iterator[Any]:
    """A rich spinner on stderr for people; nothing with --quiet or --json. Yields `tick(done,
    total, label=None)`: the work's count so far, which on a terminal turns the spinner into a bar
    with the count, the elapsed time and an estimate of the time left (layers profiled,
    candidates searched, rows validated); a no-op elsewhere."""
    if args.quiet or args.json:
        yield _no_tick
        return
    if not interactive():
        with console().status(message):
            yield _no_tick
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    # the count first: on a narrow terminal the description is what gets cut
    columns = [SpinnerColumn(), MofNCompleteColumn(), BarColumn(bar_width=24), TimeElapsedColumn()]
    columns += [TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.description}")]
    screen = console()
    room = max(20, screen.width - 64)  # what the count, bar and times leave on one line

    def fit(text: str) -> str:
        return text if len(text) <= room else text[: room - 1] + "…"

    with Progress(*columns, console=screen, transient=True) as bar:
        task = bar.add_task(fit(message), total=None)  # no count yet: an indeterminate bar

        def tick(done: int, total: int, label: str | None = None) -> None:
            description = fit(f"{label}: {message}" if label else message)
            bar.update(task, completed=min(done, total), total=max(total, 1), description=description)

        yield tick


def print_table(args: argparse.Namespace, table) -> None:
    """A table on stdout: boxed on a terminal, full width when piped (a log keeps every number),
    tab-separated values with --plain."""
    if getattr(args, "plain", False):
        from meshplan.views import table_tsv

        if table.title:
            print(f"# {table.title}")
        sys.stdout.write(table_tsv(table))
        return
    from rich.console import Console

    if sys.stdout.isatty():
        Console().print(table)
    else:  # never cut to 80 columns: as wide as the table needs
        Console(width=100_000, no_color=True, highlight=False).print(table)


JSON_OUT: Any = None
"""Where --json output goes (json_stdout points it at the real stdout; other prints go to stderr)."""


@contextlib.contextmanager
def json_stdout() -> Iterator[None]:
    """--json: stdout carries the JSON only; anything else printed meanwhile (a model file that
    prints at import, a factory's progress) goes to stderr."""
    global JSON_OUT
    JSON_OUT = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        JSON_OUT = None


def json_file() -> Any:
    """The file --json output is printed to."""
    return JSON_OUT or sys.stdout


def print_json(obj: Any) -> None:
    print(json.dumps(schema.to_dict(obj), indent=2, allow_nan=False), file=json_file())


def say(args: argparse.Namespace, text: str) -> None:
    if not args.json and not args.quiet:
        console().print(text, highlight=False)


def warn(args: argparse.Namespace, text: str) -> None:
    """A warning line on stderr; --quiet silences progress, not warnings."""
    print(f"meshplan {args.verb}: warning: {text}", file=sys.stderr)
