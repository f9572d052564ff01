"""What one conformance check says about one component: :class:`CheckResult`, and the two ways a
check ends early (:class:`Failed`, :class:`Skipped`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["passed", "failed", "skipped"]


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check of one registered component."""

    kind: str
    name: str
    distribution: str
    version: str
    check: str
    """The check and its variant, e.g. ``causality[rope]`` or ``build[gqa,window=3]``."""
    status: Status
    detail: str
    """One line: why it failed or was skipped (what passed may say what it covered, or nothing)."""

    @property
    def id(self) -> str:
        """``attention:ring_window-causality[rope]``: the check's name in a test report."""
        return f"{self.kind}:{self.name}-{self.check}"


class Failed(Exception):
    """A check found a broken property; the message is the one-line detail for the plugin author."""


class Skipped(Exception):
    """A check does not apply (the component's own ``check`` refuses this size); the message says why."""
