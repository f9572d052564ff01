"""Tables for the terminal whose headers fold between words, never inside one ("FLOPs/token", not
"FLOPs/to" over "ken").

A table is laid out as rich lays it out, except that a column rich would make narrower than the longest
word of its header is widened to it, the widest of the other columns giving up the room; when the
headers' words do not fit even so, the table first gives up the padding between its columns
(``collapse_padding``, none at its edges), and a table too wide even then is left to rich, which keeps
every column by folding words. A cell wider than its column still
folds (a long name, an interval): it is the header that names the column.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table


class WholeWords:
    """``out.print(WholeWords(table))``: the table, its headers folded between words at the console's width."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.table
        words = [max((cell_len(w) for w in str(column.header).split()), default=0) for column in table.columns]

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
        if sum(narrowest) <= sum(widths):  # widen the columns rich made too narrow, from those with room to spare
            deficit = sum(max(n - w, 0) for w, n in zip(widths, narrowest, strict=True))
            widths = [max(w, n) for w, n in zip(widths, narrowest, strict=True)]
            for _ in range(deficit):
                widest = max(range(len(widths)), key=lambda i: (widths[i] > narrowest[i], widths[i]))
                widths[widest] -= 1
            for i, (column, width) in enumerate(zip(table.columns, widths, strict=True)):
                column.width = width - table._get_padding_width(i)
        yield table
