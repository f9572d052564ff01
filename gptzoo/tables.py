"""Tables for the terminal whose words never fold inside themselves where the width allows: headers fold
between words ("FLOPs/token", not "FLOPs/to" over "ken"), numbers never fold ("3.0352–3.0612", not
"3.0352–3.0" over "612"), and names stay whole (``gptzoo_plugins.norms``, ``swiglu+lr=0.003``).

A table is laid out as rich lays it out, except that a column rich would make narrower than the longest
word of its header or its cells is widened to it, the widest of the other columns giving up the room.
Where that does not fit, the table gives up the padding between its columns (``collapse_padding``, none
at its edges), then the columns its caller marked optional, one by one (a line under the table says
which); where even that does not fit, every column stays, its numbers whole and then only its headers'
words, and other text folds (a long name, a path); a table too wide even for those is left to rich, which
keeps every column by folding.
"""

from __future__ import annotations

import copy
import itertools
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


def longest_word(column: Column) -> int:
    """The width of the longest word in the column's cells: a name (``gptzoo_plugins.norms``,
    ``swiglu+lr=0.003``) reads only whole."""
    cells = (cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain for cell in column._cells)
    return max((cell_len(word) for cell in cells for word in cell.split()), default=0)


class WholeWords:
    """``out.print(WholeWords(table))``: the table at the console's width, its headers folded between words
    and its numbers whole; and every word of its cells whole where the width allows, leaving out the columns
    ``optional`` names (headers, the first left out first) one by one while that buys it, with a line that
    says which were left out."""

    def __init__(self, table: Table, optional: tuple[str, ...] = ()) -> None:
        self.table = table
        self.optional = optional

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        present = [h for h in self.optional if any(str(c.header) == h for c in self.table.columns)]
        for dropped, collapsed in itertools.product(range(len(present) + 1), (False, True)):
            table = copy.copy(self.table)
            table.columns = [copy.copy(c) for c in self.table.columns if str(c.header) not in present[:dropped]]
            for index, column in enumerate(table.columns):  # rich pads a column by its index
                column._index = index
            if collapsed:  # the padding between columns goes before a column does
                table.collapse_padding, table.pad_edge = True, False
            whole = [max(header_word(c), longest_word(c)) for c in table.columns]
            if _fit(table, whole, console, options):
                yield table
                if dropped:
                    *most, last = present[:dropped]
                    left_out = f"{', '.join(most)} and {last}" if most else last
                    them = "them" if most else "it"
                    yield Text(f"({left_out} left out at {options.max_width} columns; a wider terminal shows {them})")
                return
        yield from self._numbers_and_headers(console, options)

    def _numbers_and_headers(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """The table with every column, its numbers whole, else its headers' words, else as rich folds it."""
        table = self.table
        headers = [header_word(column) for column in table.columns]
        numbers = [longest_number(column) for column in table.columns]
        words = [max(pair) for pair in zip(headers, numbers, strict=True)]
        if sum(_narrowest(table, words)) > options.max_width - table._extra_width:
            table.collapse_padding, table.pad_edge = True, False
        for attempt in (words, numbers, headers):  # whole numbers first, else whole header words
            if _fit(table, attempt, console, options):
                break
        yield table


def _narrowest(table: Table, words: list[int]) -> list[int]:
    return [word + table._get_padding_width(i) for i, word in enumerate(words)]


def _fit(table: Table, words: list[int], console: Console, options: ConsoleOptions) -> bool:
    """Set the table's column widths so that each holds its ``words`` whole (a column rich would make
    narrower is widened, the widest of those with room to spare giving it up); False, with nothing set,
    where the width cannot hold them all."""
    widths = table._calculate_column_widths(console, options.update_width(options.max_width - table._extra_width))
    narrowest = _narrowest(table, words)
    if sum(narrowest) > sum(widths):
        return False
    if all(w >= n for w, n in zip(widths, narrowest, strict=True)):
        return True
    deficit = sum(max(n - w, 0) for w, n in zip(widths, narrowest, strict=True))
    widths = [max(w, n) for w, n in zip(widths, narrowest, strict=True)]
    for _ in range(deficit):
        widest = max(range(len(widths)), key=lambda i: (widths[i] > narrowest[i], widths[i]))
        widths[widest] -= 1
    for i, (column, width) in enumerate(zip(table.columns, widths, strict=True)):
        column.width = width - table._get_padding_width(i)
    return True
