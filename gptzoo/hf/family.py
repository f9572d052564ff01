"""What a Hugging Face architecture ("family") is to gptzoo: how its config.json maps to a recipe,
and where each component's tensors live in its checkpoints.

A family owns only the skeleton of a checkpoint (``transformer.h.3.attn.`` is GPT-2's layer 3
attention); the tensors inside each part are described by the component that owns them
(its ``hf_weights(family)`` method, see gptzoo.interfaces.TensorMap). A component without an
equivalent in a family returns None, and export refuses the recipe with that reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from gptzoo.errors import CheckpointError, GptzooError, did_you_mean
from gptzoo.interfaces import TensorMap
from gptzoo.model.gpt import GPT
from gptzoo.recipe import Recipe
from gptzoo.untrusted import WEIGHT_DTYPES_TEXT


class NoEquivalentError(GptzooError):
    """A recipe that a Hugging Face architecture cannot express."""


@dataclass(frozen=True)
class Part:
    """A module of ours and the key prefixes of its tensors on both sides."""

    module: nn.Module
    ours: str
    theirs: str
    maps: list[TensorMap] | None = None
    """Explicit maps (for plain torch modules such as the embedding); None asks the module."""


class Family:
    """Base class of the Hugging Face architectures gptzoo reads and writes."""

    name: str
    """The family key components use in ``hf_weights`` ("gpt2", "llama")."""
    model_type: str
    """config.json ``model_type``."""
    architecture: str
    """config.json ``architectures[0]`` and the transformers class."""
    embedding: str
    """Their key of the token embedding."""
    ignored_tensors: tuple[str, ...] = ()
    """Suffixes of non-weight tensors some files carry (masks, rotary tables); dropped on import."""
    expected: dict[str, tuple[tuple[str, ...], str]] = {}
    """[model] key -> (the values this architecture can express, why), checked by ``reasons``."""

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Recipe data equivalent to config.json; GptzooError naming any unsupported field."""
        raise NotImplementedError

    def config(self, recipe: Recipe) -> dict[str, Any]:
        """config.json fields equivalent to the recipe; NoEquivalentError naming what is not."""
        raise NotImplementedError

    def parts(self, model: GPT) -> list[Part]:
        raise NotImplementedError

    def reasons(self, recipe: Recipe) -> list[str]:
        """Why the recipe's components (and norm placement) have no equivalent here, if they don't."""
        reasons = []
        for key, (allowed, why) in self.expected.items():
            value = getattr(recipe.model, key)
            name = getattr(value, "name", value)
            if name not in allowed:
                reasons.append(f"{key} {name!r} ({why})")
        return reasons

    def tensor_map(self, model: GPT) -> list[tuple[str, tuple[str, ...], TensorMap]]:
        """(our key, their keys, map) for every tensor of the model's state dict."""
        rows = []
        for part in self.parts(model):
            maps = part.maps
            if maps is None:
                hf_weights = getattr(part.module, "hf_weights", None)
                maps = hf_weights(self.name) if hf_weights is not None else None
            if maps is None:
                raise NoEquivalentError(
                    f"{type(part.module).__name__} ({part.ours.rstrip('.')}) has no equivalent in Hugging Face "
                    f"{self.architecture}"
                )
            rows += [(part.ours + m.ours, tuple(part.theirs + t for t in m.theirs), m) for m in maps]
        covered = {ours for ours, _, _ in rows}
        expected = set(model.state_dict()) - ({"lm_head.weight"} if model.tied else set())
        if covered != expected:
            raise CheckpointError(
                f"the {self.architecture} weight map does not cover {sorted(expected - covered)} "
                f"(and maps unknown {sorted(covered - expected)}); a component's hf_weights is incomplete"
            )
        return rows

    def normalize(self, tensors: dict[str, Tensor], model: GPT, source: Path) -> dict[str, Tensor]:
        """Their tensors (of the checkpoint directory ``source``, dtypes checked) in the layout
        ``parts`` expects: known non-weights dropped, and a tied head stored anyway checked against
        the embedding and dropped."""
        tensors = {k: v for k, v in tensors.items() if not k.endswith(self.ignored_tensors)}
        if model.tied and "lm_head.weight" in tensors:
            head = tensors.pop("lm_head.weight")
            embedding = tensors.get(self.embedding)
            if embedding is not None and not head.equal(embedding):
                raise CheckpointError(
                    f"{source}: lm_head.weight differs from the token embedding {self.embedding}, but config.json "
                    "ties them (tie_word_embeddings); set tie_word_embeddings to false if the head is its own"
                )
        return tensors


def show(value: Any, limit: int = 60) -> str:
    """A config value for a message: its repr, cut to ``limit`` characters (an integer beyond 128
    bits by its magnitude)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"{'-' if value < 0 else ''}~1e{int(math.log10(abs(value)))}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refuse(config: Mapping[str, Any], supported: Mapping[str, Any]) -> list[str]:
    """Problems for config fields set to values gptzoo does not implement, and for quantized weights."""
    problems = [
        f"config.json {key}={show(config[key])} is not supported (gptzoo implements {key}={value!r} only)"
        for key, value in supported.items()
        if key in config and config[key] is not None and config[key] != value
    ]
    if config.get("quantization_config") is not None:
        problems.append(
            f"config.json quantization_config={show(config['quantization_config'])} is not supported (gptzoo "
            f"reads plain {WEIGHT_DTYPES_TEXT} weights); use the checkpoint's unquantized weights"
        )
    return problems


class Fields:
    """Typed reads of config.json fields; each wrong one adds a problem naming it. An absent field
    takes its default (null too for integers and objects, where Hugging Face writes null for unset)."""

    def __init__(self, config: Mapping[str, Any], prefix: str = "config.json ") -> None:
        self.config, self.prefix = config, prefix
        self.problems: list[str] = []

    def _wrong(self, key: str, what: str) -> None:
        self.problems.append(f"{self.prefix}{key}={show(self.config[key])} is not {what}")

    def integer(self, key: str, default: int | None = None) -> int:
        """A positive integer; without a default the field is required."""
        value = self.config.get(key)
        if value is None:
            if default is None:
                self.problems.append(f"{self.prefix}has no {key!r}")
            return 1 if default is None else default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self._wrong(key, "a positive integer")
            return 1
        return value

    def number(self, key: str, default: float) -> float:
        if key not in self.config:
            return default
        value = self.config[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self._wrong(key, "a finite number")
            return default
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits
            self._wrong(key, "a finite number (it is beyond a float's range)")
            return default
        if not math.isfinite(number):
            self._wrong(key, "a finite number")
            return default
        return number

    def flag(self, key: str, default: bool) -> bool:
        if key not in self.config:
            return default
        if not isinstance(self.config[key], bool):
            self._wrong(key, "true or false")
            return default
        return self.config[key]

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.config.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self._wrong(key, "an object")
            return {}
        return value

    def choice(self, key: str, default: str, table: Mapping[str, str]) -> str:
        """table[the field's value], or a problem naming the value and what is supported."""
        value = self.config.get(key, default)
        if isinstance(value, str) and value in table:
            return table[value]
        hint = did_you_mean(value, list(table)) if isinstance(value, str) else f" (available: {', '.join(table)})"
        self.problems.append(f"{self.prefix}{key} {show(value)} is not supported{hint}")
        return next(iter(table.values()))

    def check(self) -> None:
        """GptzooError with every problem found so far."""
        if self.problems:
            raise GptzooError("; ".join(self.problems))
