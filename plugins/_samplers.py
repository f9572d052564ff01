"""Sampler-chain steps, with Hugging Face transformers' semantics (its LogitsProcessor classes).

Transforms: temperature, top_k, top_p (nucleus; Holtzman et al., 2020), min_p (Nguyen et al., 2024),
repetition_penalty (Keskar et al., 2019, CTRL). Selection: greedy picks the argmax; a chain that
does not end in greedy samples from the softmax of its transformed logits. Each transform has a
``gptzoo generate`` flag, in Hugging Face's order (repetition penalty, temperature, top-k, top-p,
min-p); all but the repetition penalty only apply when sampling (``sampling_only``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gptzoo.interfaces import Sampler, SamplerFlag


class Greedy(Sampler):
    """Pick the most likely token (argmax; the first one on ties)."""

    picks = True
    greedy = True

    def pick(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return logits.argmax(dim=-1)


class Temperature(Sampler):
    """Divide logits by temperature (> 0): below 1 sharpens, above 1 flattens.

    As HF's TemperatureLogitsWarper, except for rows that the division overflows (a temperature
    near 0 makes every logit infinite, and their softmax NaN): there the row's maximum is
    subtracted first, which keeps the most likely tokens at 0 and sends the others towards -inf:
    the limit of sampling as the temperature goes to 0, i.e. greedy.
    """

    flag = SamplerFlag(
        "temperature",
        20,
        "divide the logits by this (0 means greedy: the sampling steps are dropped)",
        zero_is_greedy=True,
    )
    sampling_only = True

    def __init__(self, temperature: float = 1.0) -> None:
        if not 0 < temperature < float("inf"):
            raise ValueError(f"temperature must be > 0 (use the greedy sampler for 0), got {temperature}")
        self.temperature = temperature

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        scaled = logits / self.temperature
        overflow = (scaled.isnan() | (scaled.isinf() & logits.isfinite())).any(dim=-1, keepdim=True)  # (B, 1)
        if not overflow.any():
            return scaled
        top = logits.max(dim=-1, keepdim=True).values
        ninf = torch.full_like(logits, float("-inf"))
        shifted = torch.where(
            logits == top, 0.0, torch.where(logits.isneginf(), ninf, (logits - top) / self.temperature)
        )
        return torch.where(overflow, shifted, scaled)


class TopK(Sampler):
    """Keep the k most likely tokens (and any tied with the k-th)."""

    flag = SamplerFlag("k", 30, "keep this many most likely tokens", int)
    sampling_only = True

    def __init__(self, k: int = 50) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"top_k k must be an integer >= 1, got {k!r}")
        self.k = k

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        kth = torch.topk(logits, min(self.k, logits.shape[-1]), dim=-1).values[..., -1:]  # (B, 1)
        return logits.masked_fill(logits < kth, float("-inf"))


class TopP(Sampler):
    """Keep the smallest set of most likely tokens whose probability mass reaches p (nucleus)."""

    flag = SamplerFlag("p", 40, "keep the most likely tokens whose probabilities sum to this (nucleus)")
    sampling_only = True

    def __init__(self, p: float = 0.9) -> None:
        if not 0 < p <= 1:
            raise ValueError(f"top_p p must be in (0, 1], got {p}")
        self.p = p

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        # As HF's TopPLogitsWarper: drop the least likely tokens whose total mass is at most 1 - p,
        # summing from the tail (so rounding cannot eat into the kept set), and keep the top one.
        sorted_logits, order = logits.sort(dim=-1)  # ascending
        tail_mass = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = tail_mass <= 1 - self.p
        drop_sorted[..., -1] = False
        return logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))


class MinP(Sampler):
    """Drop tokens whose probability is below p times that of the most likely token."""

    flag = SamplerFlag("p", 50, "drop tokens less likely than this times the most likely one")
    sampling_only = True

    def __init__(self, p: float = 0.05) -> None:
        if not 0 <= p <= 1:
            raise ValueError(f"min_p p must be in [0, 1], got {p}")
        self.p = p

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        probs = logits.float().softmax(dim=-1)
        threshold = self.p * probs.max(dim=-1, keepdim=True).values
        return logits.masked_fill(probs < threshold, float("-inf"))


class RepetitionPenalty(Sampler):
    """Penalize tokens already present: positive logits divided by penalty, negative multiplied (CTRL)."""

    flag = SamplerFlag("penalty", 10, "divide the logits of tokens already present by this (negative ones: multiply)")

    def __init__(self, penalty: float = 1.1) -> None:
        if not 0 < penalty < float("inf"):
            raise ValueError(f"repetition_penalty penalty must be a finite number > 0, got {penalty}")
        self.penalty = penalty

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        seen = logits.gather(-1, input_ids)  # (B, T)
        seen = torch.where(seen < 0, seen * self.penalty, seen / self.penalty)
        return logits.scatter(-1, input_ids, seen)
