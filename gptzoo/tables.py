"""Tables for the terminal whose headers fold between words, never inside one ("FLOPs/token", not
"FLOPs/to" over "ken"), and whose numbers never fold ("3.0352–3.0612", not "3.0352–3.0" over "612").

A table is laid out as rich lays it out, except that a column rich would make narrower than the longest
word of its header, or than the longest number in its cells, is widened to it, the widest of the other
columns giving up the room; when those do not fit even so, the table first gives up the padding between
its columns (``collapse_padding``, none at its edges), then keeps the numbers whole and lets headers
fold, then only the headers' words; a table too wide even for those is left to rich, which keeps every
column by folding. Other text wider than its column still folds (a long name, a path).
"""

from __future__ import annotations

import re

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Column, Table
from rich.text import Text

_ONE = r"[-+±]?[\d.,]*\d[\d.,]*(?:[eE][-+]?\d+)?[%kMGTPB]?"
NUMBER = re.compile(rf"\(?{_ONE}(?:[–±/-]{_ONE})*\)?")
"""A number as a table shows one: 12,345, 3.0352, 1.2e-05, 12.3%, 7.4M, a spread ±.012, numbers joined
by –, ± or / (an interval 3.0352–3.0612, a mean and spread 2.346±.012, a count 0/3), in parentheses or not."""


def header_word(column: Column) -> int:
    """The width of the longest word of the column's header."""
    return max((cell_len(w) for w in str(column.header).split()), default=0)


def longest_number(column: Column) -> int:
    """The width of the longest number in the column's cells (0: none)."""
    cells = (cell.plain if isinstance(cell, Text) else str(cell) for cell in column._cells)
    return max((cell_len(word) for cell in cells for word in cell.split() if NUMBER.fullmatch(word)), default=0)


class WholeWords:
    """``out.print(WholeWords(table))``: the table at the console's width, its headers folded between words
    and its numbers whole."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.table
        headers = [header_word(column) for column in table.columns]
        numbers = [longest_number(column) for column in table.columns]
        words = [max(pair) for pair in zip(headers, numbers, strict=True)]

        def layout() -> tuple[list[int], list[int]]:
            """Each column's width as rich lays the table out, and its narrowest (padding included)."""
            widths = table._calculate_column_widths(
                console, options.update_width(options.max_width - table._extra_width)
            )
            return widths, [word + table._get_padding_width(i) for i, word in enumerate(words)]

        widths, narrowest = layout()
        if all(w >= n for w, n in zip(widths, narrowest, strict=True)):
            yield table
            return
        if sum(narrowest) > options.max_width - table._extra_width:
            table.collapse_padding, table.pad_edge = True, False
            widths, narrowest = layout()
        for fallback in (numbers, headers):  # too narrow for both: whole numbers first, else whole header words
            if sum(narrowest) <= sum(widths):
                break
            words = fallback
            widths, narrowest = layout()
        if sum(narrowest) <= sum(widths):  # widen the columns rich made too narrow, from those with room to spare
            deficit = sum(max(n - w, 0) for w, n in zip(widths, narrowest, strict=True))
            widths = [max(w, n) for w, n in zip(widths, narrowest, strict=True)]
            for _ in range(deficit):
                widest = max(range(len(widths)), key=lambda i: (widths[i] > narrowest[i], widths[i]))
                widths[widest] -= 1
            for i, (column, width) in enumerate(zip(table.columns, widths, strict=True)):
                column.width = width - table._get_padding_width(i)
        yield table
