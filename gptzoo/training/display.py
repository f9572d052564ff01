"""What a person sees while `gptzoo train` runs: a rich progress bar with step, loss, learning
rate, tokens/s and MFU, and one line per evaluation."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class TrainDisplay:
    """A context manager; call it with each metrics record."""

    def __init__(self, console: Console, *, total_steps: int, title: str) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self.task = self.progress.add_task(title, total=total_steps, stats="")

    def __enter__(self) -> TrainDisplay:
        self.progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.progress.stop()

    def __call__(self, record: dict[str, Any]) -> None:
        step = record["step"]
        if "val_loss" in record:
            self.progress.console.print(
                f"step {step}: val loss {record['val_loss']:.4f}, perplexity {record['val_ppl']:.2f}"
            )
            return
        mfu = record.get("mfu")
        loss = record["loss"]
        stats = (
            (f"loss {loss:.4f}" if loss is not None else "loss nan")
            + f"  lr {record['lr']:.2e}  {record['tokens_per_s']:,.0f} tok/s"
            + (f"  MFU {mfu:.1%}" if mfu is not None else "")
            + ("  [yellow]skipped (non-finite)[/yellow]" if record.get("skipped") else "")
        )
        self.progress.update(self.task, completed=step, stats=stats)
