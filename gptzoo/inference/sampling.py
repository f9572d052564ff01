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

from gptzoo import factories
from gptzoo.errors import GptzooError, exception_text
from gptzoo.interfaces import Sampler
from gptzoo.registry import Registry

Spec = list[tuple[str, dict[str, Any]]]
"""A chain as (sampler name, parameters) pairs, in order."""

FLAG_ORDER = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")
"""Where a step given by a command-line flag goes when the chain lacks it (HF's order)."""
SAMPLING_STEPS = ("temperature", "top_k", "top_p", "min_p")


class SamplerChain:
    def __init__(self, steps: Sequence[Sampler], spec: Spec | None = None) -> None:
        for i, step in enumerate(steps[:-1]):
            if step.picks:
                raise GptzooError(
                    f"sampler step {i + 1} ({type(step).__name__}) chooses the token, so it must come last"
                )
        self.steps = list(steps)
        self.spec = spec or []

    @classmethod
    def from_registry(cls, registry: Registry, spec: Sequence[tuple[str, Mapping[str, Any]]]) -> SamplerChain:
        """A chain from (name, params) pairs: each step's check runs, then its factory; bad parameters
        become GptzooErrors naming the step, a broken sampler a PluginError naming its plugin."""
        steps = []
        for name, params in spec:
            entry = registry.get("sampler", name)
            note = factories.overridden(entry)
            problems = factories.check(entry, params)
            if problems:
                raise GptzooError(f"sampler {name!r}: {'; '.join(problems)}{note}")
            try:
                step = factories.build(entry, params, user_errors=(TypeError, ValueError))
            except (TypeError, ValueError) as exc:
                raise GptzooError(f"sampler {name!r}: {exception_text(exc)}{note}") from None
            factories.check_contract(entry, step)
            steps.append(step)
        return cls(steps, [(name, dict(params)) for name, params in spec])

    def describe(self) -> str:
        """e.g. ``temperature(temperature=0.8) -> top_k(k=50) -> sample``."""
        parts = [
            f"{name}({', '.join(f'{k}={v}' for k, v in params.items())})" if params else name
            for name, params in self.spec
        ]
        if not (self.steps and self.steps[-1].picks):
            parts.append("sample")
        return " -> ".join(parts)

    def transform(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        """Apply every step: logits (B, V) and tokens so far (B, T) -> logits (B, V)."""
        for step in self.steps:
            logits = step(logits, input_ids)
        return logits

    def __call__(self, logits: Tensor, input_ids: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The next token of each row, (B,).

        Raises:
            GptzooError: the steps turned a row's logits into NaN or +inf, or masked all of them.
        """
        logits = self.transform(logits.float(), input_ids)
        broken = (logits.isnan() | logits.isposinf()).any(dim=-1) | logits.isneginf().all(dim=-1)
        if broken.any():
            raise GptzooError(
                f"the sampler chain {self.describe()} turned the logits of {prompts_of(broken)} into NaN or "
                "infinity (or masked every token): a parameter is too extreme for them (e.g. a penalty near 0)"
            )
        if self.steps and self.steps[-1].picks:
            return self.steps[-1].pick(logits, generator)
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def prompts_of(rows: Tensor) -> str:
    """``"prompt 2"`` or ``"prompts 1, 3"``: the rows set in a (B,) bool mask, counted from 1."""
    picked = [str(i + 1) for i in rows.nonzero().flatten().tolist()]
    return f"prompt{'s' if len(picked) > 1 else ''} {', '.join(picked)}"


def chain_spec(recipe_steps: Spec, flags: Mapping[str, float | int | None]) -> Spec:
    """The effective chain: the recipe's steps, with command-line flags replacing the parameters of
    a step they name or inserting it in HF's order; temperature 0 means greedy. A chain with no
    other step than a repetition penalty (or none at all) ends in greedy, as HF's default does.

    flags: temperature, top_k, top_p, min_p, repetition_penalty (None: not given).
    """
    params = {"repetition_penalty": "penalty", "temperature": "temperature", "top_k": "k", "top_p": "p", "min_p": "p"}
    steps = [(name, dict(p)) for name, p in recipe_steps]
    for name in FLAG_ORDER:
        value = flags.get(name)
        if value is None:
            continue
        found = [i for i, (step, _) in enumerate(steps) if step == name]
        if found:
            steps[found[0]] = (name, {params[name]: value})
            continue
        rank = FLAG_ORDER.index(name)
        at = next(
            (i for i, (step, _) in enumerate(steps) if step not in FLAG_ORDER or FLAG_ORDER.index(step) > rank),
            len(steps),
        )
        steps.insert(at, (name, {params[name]: value}))
    if flags.get("temperature") == 0:
        steps = [(name, p) for name, p in steps if name not in SAMPLING_STEPS and name != "greedy"] + [("greedy", {})]
    elif any(flags.get(name) is not None for name in SAMPLING_STEPS) and steps[-1][0] == "greedy":
        steps.pop()  # asking for sampling overrides a recipe that ends in greedy
    elif all(name == "repetition_penalty" for name, _ in steps):
        steps.append(("greedy", {}))
    return steps
