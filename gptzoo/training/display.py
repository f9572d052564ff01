"""What a person sees while `gptzoo train` runs: a rich progress bar with step, loss, learning
rate, tokens/s and MFU, and one line per evaluation."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def _shown(value: float | None, spec: str) -> str:
    """A logged number; null is what a non-finite one became (JSON has no NaN)."""
    return "nan" if value is None else format(value, spec)


class TrainDisplay:
    """A context manager; :meth:`start` shows the bar once the run has started (not while its checks may
    still refuse it), then call it with each metrics record."""

    def __init__(self, console: Console, *, total_steps: int, title: str, transient: bool = False) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=transient,
        )
        self.task = self.progress.add_task(title, total=total_steps, stats="")
        self.started = False

    def __enter__(self) -> TrainDisplay:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.started:
            self.progress.stop()

    def start(self, step: int) -> None:
        """Show the bar at ``step``, where the run starts (a resumed one at its checkpoint's step)."""
        self.progress.update(self.task, completed=step)
        self.progress.start()
        self.started = True

    def __call__(self, record: dict[str, Any]) -> None:
        step = record["step"]
        if "val_loss" in record:
            self.progress.console.print(
                f"step {step}: val loss {_shown(record['val_loss'], '.4f')}, "
                f"perplexity {_shown(record.get('val_ppl'), '.2f')}"
            )
            return
        mfu = record.get("mfu")
        stats = (
            f"loss {_shown(record['loss'], '.4f')}"
            + f"  lr {_shown(record['lr'], '.2e')}  {_shown(record['tokens_per_s'], ',.0f')} tok/s"
            + (f"  MFU {mfu:.1%}" if mfu is not None else "")
            + ("  [yellow]skipped (non-finite)[/yellow]" if record.get("skipped") else "")
        )
        self.progress.update(self.task, completed=step, stats=stats)
