"""Components' statistics over a logging window (contract 5's ``stats``, gptzoo.hookspecs): a router's expert
load, averaged over the micro-batches since the last record and over the processes, as metrics.jsonl holds it.

A record gets, per statistic name, a table by the reporting component's path in the model::

    "expert_load_max_mean": {"blocks.0.mlp": 1.04, "blocks.1.mlp": 1.31},
    "expert_load": {"blocks.0.mlp": [0.26, 0.24, 0.27, 0.23], "blocks.1.mlp": [...]}

A scalar is logged as its window mean; a share (1-D, non-negative, summing to 1) as ``NAME_max_mean``, its
largest entry over its mean (1.0 when perfectly even), and, when it has at most STAT_VECTOR_LIMIT entries,
itself. The mean of the window's shares is the share of the window's choices, every micro-batch having as many
tokens. Nothing here waits for the device before :meth:`StatWindow.flush`, once per record.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from gptzoo.errors import PluginError
from gptzoo.hookspecs import RECORD_KEYS, STAT_MAX_MEAN, STAT_VECTOR_LIMIT
from gptzoo.training import distributed

DIGITS = 5
"""A share's entries in a record are rounded to this many decimals (its max/mean is not)."""


def stat_problem(name: object, value: object) -> str | None:
    """What is wrong with one entry of a ``stats()`` result, seen without reading the tensor's values (the
    kit checks those), or None."""
    if not isinstance(name, str) or not name.isidentifier():
        return f"its name {name!r} is not an identifier"
    if name in RECORD_KEYS or name.startswith("aux_") or name.endswith(STAT_MAX_MEAN):
        return f"its name {name!r} is taken by the training record (its own keys, aux_*, *{STAT_MAX_MEAN})"
    if not isinstance(value, Tensor) or not value.is_floating_point() or value.dim() > 1:
        shown = f"a {value.dim()}-D {value.dtype} tensor" if isinstance(value, Tensor) else type(value).__name__
        return f"{name!r} is {shown}, not a float scalar or 1-D share"
    return None


class StatWindow:
    """The sums of what the reporting components said since the last record."""

    def __init__(self, reporters: dict[str, nn.Module]) -> None:
        self.reporters = reporters
        """Path in the model -> the component (GPT.stat_reporters)."""
        self.sums: dict[tuple[str, str], Tensor] = {}
        self.counts: dict[tuple[str, str], int] = {}

    def add(self) -> None:
        """Read every reporter's ``stats()`` of the latest forward (after each micro-batch's)."""
        for path, module in self.reporters.items():
            reported = module.stats()
            if not isinstance(reported, dict):
                raise PluginError(self._bad(path, module, f"gave {type(reported).__name__}, not a dict"))
            for name, value in reported.items():
                problem = stat_problem(name, value)
                if problem is not None:
                    raise PluginError(self._bad(path, module, problem))
                key = (path, name)
                value = value.detach().float()
                self.sums[key] = self.sums[key] + value if key in self.sums else value
                self.counts[key] = self.counts.get(key, 0) + 1

    @staticmethod
    def _bad(path: str, module: nn.Module, problem: str) -> str:
        return (
            f"the stats() of {path} ({type(module).__module__}.{type(module).__name__}): {problem}; it returns "
            "{name: float scalar or 1-D share tensor} (gptzoo.hookspecs, contract 5): fix the component, or run "
            "`gptzoo test` on its plugin"
        )

    def flush(self, procs: distributed.Processes) -> dict[str, dict[str, Any]]:
        """The window's means as record entries (module docstring), averaged over the processes; starts a new
        window. Empty when nothing reported."""
        if not self.sums:
            return {}
        keys = list(self.sums)
        means = [self.sums[k] / self.counts[k] for k in keys]
        flat = distributed.mean(torch.cat([m.reshape(-1) for m in means]), procs).cpu().tolist()
        self.sums, self.counts = {}, {}
        record: dict[str, dict[str, Any]] = {}
        at = 0
        for (path, name), mean in zip(keys, means, strict=True):
            n = mean.numel()
            values, at = flat[at : at + n], at + n
            if not all(map(math.isfinite, values)):  # JSON has no NaN: the record says null
                record.setdefault(name if mean.dim() == 0 else name + STAT_MAX_MEAN, {})[path] = None
                continue
            if mean.dim() == 0:
                record.setdefault(name, {})[path] = values[0]
                continue
            average = sum(values) / n
            record.setdefault(name + STAT_MAX_MEAN, {})[path] = max(values) / average if average > 0 else None
            if n <= STAT_VECTOR_LIMIT:
                record.setdefault(name, {})[path] = [round(v, DIGITS) for v in values]
        return record
