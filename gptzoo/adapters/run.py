"""A `gptzoo finetune` run directory as other commands read it: RUN/adapter.json (what it adapts, on which
base) and RUN/adapter/ (the adapter, in peft's format)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from gptzoo.adapters.lora import LoRASpec
from gptzoo.errors import CheckpointError

SPEC = "adapter.json"
ADAPTER = "adapter"


@dataclass(frozen=True)
class FinetuneSpec:
    """What a run adapts (RUN/adapter.json): a resumed run must ask for the same."""

    base: str
    targets: tuple[str, ...]
    rank: int
    alpha: float
    dropout: float
    dora: bool
    rslora: bool

    @property
    def lora(self) -> LoRASpec:
        return LoRASpec(self.rank, self.alpha, self.dropout, self.dora, self.rslora)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "targets": list(self.targets)}


def read_spec(run: Path) -> FinetuneSpec | None:
    """RUN/adapter.json, if the run has one."""
    path = run / SPEC
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return FinetuneSpec(
            **{f.name: data[f.name] for f in fields(FinetuneSpec)} | {"targets": tuple(data["targets"])}
        )
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{path} cannot be read ({type(exc).__name__}: {exc}); it is not a fine-tuning run's"
        ) from None
