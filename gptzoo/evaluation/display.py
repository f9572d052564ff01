"""What a person sees of `gptzoo eval`: a progress bar over the windows (when stderr is not a terminal,
a plain line every few seconds: gptzoo.status_lines), then one table row per text and length (a refused
length shows its reason)."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from gptzoo.errors import terminal_text
from gptzoo.status_lines import StatusLines
from gptzoo.tables import WholeWords


def _text(value: object) -> str:
    return escape(terminal_text(str(value)))


class EvalProgress:
    """A context manager and a gptzoo.evaluation.perplexity.Progress: the bar appears at the first window."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("[bold]eval"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("windows"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self.task = self.progress.add_task("eval", total=None)
        self.started = False
        self.lines = StatusLines(console)

    def __enter__(self) -> EvalProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.started:
            self.progress.stop()

    def __call__(self, done: int, total: int) -> None:
        if self.lines.plain:
            if self.lines.due():
                self.lines.print(f"eval: {done:,}/{total:,} windows, {self.lines.times(done, total)}")
            return
        if not self.started:
            self.progress.start()
            self.started = True
        self.progress.update(self.task, completed=done, total=total)


def _ci(ci: list[float] | None) -> str:
    return f"{ci[0]:.4f}–{ci[1]:.4f}" if ci else "-"


def render_eval(report: dict[str, Any], out: Console) -> None:
    limit = f", positions up to {report['max_positions']}" if report["max_positions"] is not None else ""
    texts = {s["text"] for s in report["scores"]}
    one_text = len(texts) == 1  # said once in the title, not folded into a narrow column on every row
    table = Table(
        title=f"{_text(report['recipe'])} ({_text(report['weights'])}, {report['dtype']}): context "
        f"{report['context_length']}{limit}" + (f"; text {_text(next(iter(texts)))}" if one_text else ""),
        title_justify="left",
    )
    if not one_text:
        table.add_column("text", overflow="fold")
    for name in ("length", "tokens", "loss", "95% CI", "perplexity", "bits/byte"):
        table.add_column(name, justify="right", overflow="fold")
    refused = []
    for s in report["scores"]:
        if s["refused"] is not None:
            refused.append(s)
            continue
        length = str(s["length"]) if s["longest"] == s["length"] else f"{s['length']} (text {s['longest']})"
        table.add_row(
            *([] if one_text else [_text(s["text"])]),
            length,
            f"{s['tokens']:,}",
            f"{s['loss']:.4f}",
            _ci(s["loss_ci"]),
            f"{s['perplexity']:.3f}",
            f"{s['bits_per_byte']:.4f}" if s["bits_per_byte"] is not None else "-",
        )
    if table.rows:
        out.print(WholeWords(table))
        out.print("[dim]loss in nats per token; 95% CI: bootstrap over windows; bits per byte: per UTF-8 byte[/dim]")
    for s in refused:
        out.print(f"[yellow]length {s['length']} refused:[/yellow] {_text(s['refused'])}")
