"""The sampler chain: registered steps applied in order, then a choice of one token per row.

A chain ``[temperature(0.7), top_k(50), top_p(0.9)]`` transforms next-token logits step by step
(order matters: temperature before top_p changes which tokens top_p keeps) and samples from the
softmax of the result with a torch.Generator; a chain ending in ``greedy`` takes the argmax.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from gptzoo.errors import GptzooError
from gptzoo.interfaces import Sampler
from gptzoo.registry import Registry


class SamplerChain:
    def __init__(self, steps: Sequence[Sampler]) -> None:
        for i, step in enumerate(steps[:-1]):
            if step.picks:
                raise GptzooError(f"sampler step {i + 1} ({type(step).__name__}) chooses the token, so it must come last")
        self.steps = list(steps)

    @classmethod
    def from_registry(cls, registry: Registry, spec: Sequence[tuple[str, Mapping[str, Any]]]) -> SamplerChain:
        """A chain from (name, params) pairs; bad parameters become GptzooErrors naming the step."""
        steps = []
        for name, params in spec:
            try:
                steps.append(registry.get("sampler", name).factory(**params))
            except (TypeError, ValueError) as exc:
                raise GptzooError(f"sampler {name!r}: {exc}") from None
        return cls(steps)

    def transform(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        """Apply every step: logits (B, V) and tokens so far (B, T) -> logits (B, V)."""
        for step in self.steps:
            logits = step(logits, input_ids)
        return logits

    def __call__(self, logits: Tensor, input_ids: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The next token of each row, (B,)."""
        logits = self.transform(logits.float(), input_ids)
        if self.steps and self.steps[-1].picks:
            return self.steps[-1].pick(logits, generator)
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
