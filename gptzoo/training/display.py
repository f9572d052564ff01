"""What a person sees while `gptzoo train` runs: a rich progress bar with step, loss, learning
rate, tokens/s and MFU (when stderr is not a terminal, the same as a plain line every few seconds:
gptzoo.status_lines), and one line per evaluation."""

from __future__ import annotations

import math
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from gptzoo.status_lines import StatusLines, duration

if TYPE_CHECKING:
    from gptzoo.training.trainer import Plan, Timing


def _shown(value: float | None, spec: str) -> str:
    """A logged number; null is what a non-finite one became (JSON has no NaN)."""
    return "nan" if value is None else format(value, spec)


def start_line(plan: Plan) -> str:
    """What `gptzoo train` says before its first step: the run directory, the steps and the estimated time."""
    verb = f"resuming {plan.out} at step {plan.step:,} of" if plan.step else f"training into {plan.out}:"
    return (
        f"{verb} {plan.steps:,} steps of {plan.tokens_per_step:,} tokens, about {duration(plan.seconds)} ({plan.basis})"
    )


def timed_line(timing: Timing) -> str:
    """What `gptzoo train` says once it has timed a step: the time left from it, and what the estimate before
    the first step said (FLOPs miss what a model spends beyond its matmuls)."""
    evals = f"{timing.evals} evaluation{'s' if timing.evals != 1 else ''} of {timing.eval_seconds:.2g} s"
    said = (
        f"; the estimate before the first step said {duration(timing.estimate)}"
        if math.isfinite(timing.estimate)
        else ""
    )
    return (
        f"step {timing.step:,} took {timing.step_seconds:.2g} s: about {duration(timing.seconds)} left with "
        f"{evals}, {duration(timing.elapsed + timing.seconds)} in all{said}"
    )


TIME_WIDTH = 7
"""What elapsed and remaining time take each (``0:01:23``, ``-:--:--``)."""
BAR_WIDTH = 40
"""The bar's width when the terminal has room; it shrinks first, then the least useful statistics go."""
MIN_BAR = 10


class TrainDisplay:
    """A context manager; :meth:`start` shows the bar once the run has started (not while its checks may
    still refuse it), :meth:`step` moves it after each optimizer step; call it with each metrics record.
    However narrow the terminal, the step count and the remaining time stay whole: the bar shrinks and
    goes first, then the statistics from the least useful (MFU, learning rate, tokens/s; never the loss)."""

    def __init__(self, console: Console, *, total_steps: int, title: str, transient: bool = False) -> None:
        self.console = console
        self.bar = BarColumn(bar_width=BAR_WIDTH)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            self.bar,
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=transient,
        )
        self.title = title
        self.total_steps = total_steps
        self.task = self.progress.add_task(title, total=total_steps, stats="")
        self.started = False
        self.lines = StatusLines(console)

    def __enter__(self) -> TrainDisplay:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.started:
            self.progress.stop()

    def start(self, step: int) -> None:
        """Show the bar at ``step``, where the run starts (a resumed one at its checkpoint's step)."""
        self.progress.update(self.task, completed=step)
        self.lines.start(step)
        if not self.lines.plain:
            self.progress.start()
            self.started = True

    def planned(self, steps: int) -> None:
        """The run trains to ``steps`` (for a display made before the run's recipe was resolved)."""
        self.total_steps = steps
        self.progress.update(self.task, total=steps)

    def step(self, step: int) -> None:
        """The run has finished optimizer step ``step``."""
        self.progress.update(self.task, completed=step)

    def fit(self, parts: list[str]) -> str:
        """The statistics that fit beside the title, the step count and the two times (most useful first),
        and the bar's width set to what is left."""
        fixed = len(self.title) + 2 * len(str(self.total_steps)) + 1 + 2 * TIME_WIDTH + 5  # 5 gaps between 6 columns
        room = self.console.width - fixed - 1
        stats = ""
        for k, part in enumerate(parts):
            wider = f"{stats}  {part}" if stats else part
            if Text.from_markup(wider).cell_len + (MIN_BAR if k else 0) > room:
                break
            stats = wider
        self.bar.bar_width = max(0, min(BAR_WIDTH, room - Text.from_markup(stats).cell_len))
        return stats

    def __call__(self, record: dict[str, Any]) -> None:
        step = record["step"]
        if "val_loss" in record:
            self.progress.console.print(
                f"step {step}: val loss {_shown(record['val_loss'], '.4f')}, "
                f"perplexity {_shown(record.get('val_ppl'), '.2f')}"
            )
            self.progress.update(self.task, completed=step)
            return
        mfu = record.get("mfu")
        loss = f"loss {_shown(record['loss'], '.4f')}" + (
            " [yellow]skipped (non-finite)[/yellow]" if record.get("skipped") else ""
        )
        parts = [
            loss,
            f"{_shown(record['tokens_per_s'], ',.0f')} tok/s",
            f"lr {_shown(record['lr'], '.2e')}",
            *([f"MFU {mfu:.1%}"] if mfu is not None else []),
        ]
        if self.lines.plain:
            if self.lines.due():
                times = self.lines.times(step, self.total_steps)
                self.lines.print(f"{self.title}: step {step:,}/{self.total_steps:,}  {'  '.join(parts)}  {times}")
            return
        self.progress.update(self.task, completed=step, stats=self.fit(parts))
