"""What a person sees while `gptzoo sweep` runs: `gptzoo train`'s bar for the run in progress (gone when
the run ends), and one line per finished run (gptzoo.sweep.runner's ``say``)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from gptzoo.errors import terminal_text
from gptzoo.training.display import TrainDisplay


class RunBar(TrainDisplay):
    """A run's bar; its evaluations are not printed (the sweep says how each run ended)."""

    def __init__(self, console: Console, title: str, total_steps: int) -> None:
        super().__init__(console, total_steps=total_steps, title=escape(terminal_text(title)), transient=True)

    def __call__(self, record: dict[str, Any]) -> None:
        if "val_loss" not in record:
            super().__call__(record)

    def evaluating(self, done: int, total: int) -> None:
        """The final checkpoint's evaluation: the bar counts its windows (gptzoo.evaluation's Progress)."""
        if not self.started:  # a run trained before and only evaluated now
            self.start(0)
        description = f"{self.title} [dim]evaluating[/dim]"
        self.progress.update(self.task, description=description, total=total, completed=done, stats="")
