"""Progress as plain lines, for a stderr that is not a terminal (a log file, ``nohup``, CI): one line every
:data:`STATUS_S` seconds with what is done, the time so far and the time left, as HF's Trainer and litgpt
log, where a terminal gets a live bar (a bar written to a file shows only when the command ends)."""

from __future__ import annotations

import time

from rich.console import Console

STATUS_S = 10.0
"""Seconds between two status lines."""


def duration(seconds: float) -> str:
    """A time as a person says it: ``40 s``, ``9 min``, ``2.5 h``."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


class StatusLines:
    """The status lines of one long command on ``console``: :meth:`due` says when the next is owed,
    :meth:`times` what to say of time."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.plain = not console.is_terminal
        """Whether lines replace the bar: the console is not a terminal."""
        self.start(0)

    def start(self, done: int) -> None:
        """The work starts now, with ``done`` units already done (a resumed run's steps)."""
        self.begun = self.last = time.monotonic()
        self.first = done

    def due(self) -> bool:
        """Whether a line is owed now (one every STATUS_S seconds, none before the first STATUS_S)."""
        now = time.monotonic()
        if now - self.last < STATUS_S:
            return False
        self.last = now
        return True

    def times(self, done: int, total: int | None) -> str:
        """``1 min elapsed, about 3 min left`` (the time left from the pace since :meth:`start`)."""
        elapsed = time.monotonic() - self.begun
        pace = (done - self.first) / elapsed if elapsed > 0 else 0.0
        left = f", about {duration((total - done) / pace)} left" if total and pace > 0 and done < total else ""
        return f"{duration(elapsed)} elapsed{left}"

    def print(self, text: str) -> None:
        self.console.print(text, highlight=False)
