"""What a person sees while `gptzoo sweep` runs: a bar for the run in progress (its loss), and one line
per finished run."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from gptzoo.errors import terminal_text


class RunBar:
    """A context manager for one run; ``start`` (the step it starts from) shows the bar, then call it with
    each metrics record."""

    def __init__(self, console: Console, title: str, total_steps: int) -> None:
        self.progress = Progress(
            TextColumn(f"[bold]{escape(terminal_text(title))}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self.task = self.progress.add_task(title, total=total_steps, stats="")
        self.started = False

    def __enter__(self) -> RunBar:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.started:
            self.progress.stop()

    def start(self, step: int) -> None:
        self.progress.update(self.task, completed=step)
        self.progress.start()
        self.started = True

    def __call__(self, record: dict[str, Any]) -> None:
        if record.get("loss") is not None:
            self.progress.update(self.task, completed=record["step"], stats=f"loss {record['loss']:.4f}")
