"""Where a command writes: the console, JSON documents, model text as it is, and tables."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
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
) -> None:
    """Rows as JSON with --json, else as a table with these columns (header -> cell text); no rows: the
    line ``empty`` instead of a table without rows, when given."""
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
    out.print(WholeWords(table))
