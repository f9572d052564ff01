"""Where a command writes: the console, JSON documents, model text as it is, and tables."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console as RichConsole
from rich.table import Table

from gptzoo.cli.render import text
from gptzoo.tables import WholeWords


class Console(RichConsole):
    json_document = False
    """This console writes the one JSON document of a --json command."""

    def on_broken_pipe(self) -> None:  # rich would exit 1, the status of a bug: main() handles it
        raise BrokenPipeError


def warn(err: Console, message: str) -> None:
    """What a person should know that does not stop the command: one ``warning:`` line on stderr."""
    err.print(f"[yellow]warning:[/yellow] {text(message)}")


SLOW_S = 2.0
"""How long a step runs before its status line appears (a faster one says nothing), unless $GPTZOO_STATUS_S
says otherwise (0: never; the test suite sets it so that a loaded machine does not change what a command prints)."""
STATUS_ENV = "GPTZOO_STATUS_S"


def slow_after() -> float | None:
    """$GPTZOO_STATUS_S, or SLOW_S when it is unset or not a number; None for 0 (no status lines)."""
    try:
        seconds = float(os.environ.get(STATUS_ENV, SLOW_S))
    except ValueError:
        seconds = SLOW_S
    return seconds if seconds > 0 else None


@contextmanager
def status(err: Console, what: str, *, quiet: bool = False) -> Iterator[None]:
    """A slow step's status line on stderr: ``what...`` once it has run :func:`slow_after` seconds, then
    ``what: 12.3 s`` when it ends; nothing for a faster step, nor when ``quiet`` (--json)."""
    after = slow_after()
    if quiet or after is None:
        yield
        return
    start, lock, shown = time.monotonic(), threading.Lock(), []

    def say() -> None:
        with lock:
            if not shown:
                shown.append(True)
                err.print(f"[dim]{text(what)}...[/dim]")

    timer = threading.Timer(after, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            if not shown:
                shown.append(False)  # too late for the timer to print
        if shown[0]:
            err.print(f"[dim]{text(what)}: {time.monotonic() - start:.1f} s[/dim]")


def print_json(out: Console, obj: Any) -> None:
    out.file.write(json.dumps(obj, indent=2) + "\n")


def write_text(out: Console, text: str) -> None:
    """Model text exactly as it is (rich would expand tabs and parse markup)."""
    out.file.write(text)
    out.file.flush()


def emit(
    args: argparse.Namespace,
    out: Console,
    rows: list[dict[str, Any]],
    title: str,
    columns: dict[str, Callable[[dict[str, Any]], str]],
    *,
    empty: str = "",
    optional: tuple[str, ...] = (),
) -> None:
    """Rows as JSON with --json, else as a table with these columns (header -> cell text); no rows: the
    line ``empty`` instead of a table without rows, when given; ``optional``: the columns a narrow terminal
    goes without, so that names stay whole (:class:`gptzoo.tables.WholeWords`)."""
    if args.json:
        print_json(out, rows)
        return
    if not rows and empty:
        out.print(empty, highlight=False)
        return
    table = Table(title=title, title_justify="left")
    for header in columns:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*(cell(row) for cell in columns.values()))
    out.print(WholeWords(table, optional))
