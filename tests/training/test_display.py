"""`gptzoo train`'s live bar: it moves every step, and however narrow the terminal, the step count and
the times stay whole (the bar and then the least useful statistics go first)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gptzoo.training.display import TrainDisplay

RECORD = {"step": 5, "loss": 5.54521, "lr": 3e-3, "tokens_per_s": 12345.6, "mfu": 0.123, "skipped": False}


def shown(display: TrainDisplay) -> str:
    """The bar's line as the terminal shows it."""
    out = io.StringIO()
    Console(file=out, width=display.console.width, color_system=None).print(
        display.progress.make_tasks_table(display.progress.tasks)
    )
    return out.getvalue().rstrip("\n")


@pytest.mark.parametrize(
    ("width", "stats"),
    [
        (140, "loss 5.5452  12,346 tok/s  lr 3.00e-03  MFU 12.3%"),
        (80, "loss 5.5452  12,346 tok/s"),
        (60, "loss 5.5452"),
        (46, "loss 5.5452"),
        (40, ""),
    ],
)
def test_narrow_terminals_keep_the_step_count_and_the_times(width: int, stats: str) -> None:
    display = TrainDisplay(
        Console(file=io.StringIO(), width=width, force_terminal=True), total_steps=15, title="gpt2-tiny"
    )
    display(RECORD)
    line = shown(display)
    assert len(line) <= width and "…" not in line, line
    assert " 5/15 " in line and line.endswith("0:00:00 -:--:--") and f" {stats} " in line, line
    assert ("loss" in line) == bool(stats)


def test_the_bar_moves_every_step_and_after_an_evaluation() -> None:
    display = TrainDisplay(
        Console(file=io.StringIO(), width=100, force_terminal=True), total_steps=15, title="gpt2-tiny"
    )
    display.step(3)
    assert display.progress.tasks[0].completed == 3
    display({"step": 5, "val_loss": 4.2, "val_ppl": 66.7})
    assert display.progress.tasks[0].completed == 5
