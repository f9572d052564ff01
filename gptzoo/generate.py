"""Autoregressive generation with a KV cache: prefill the prompt once, then decode one token at a
time, each chosen by a sampler chain (greedy when none is given)."""

from __future__ import annotations

import torch
from torch import Tensor

from gptzoo.errors import GptzooError
from gptzoo.model import GPT
from gptzoo.sampling import SamplerChain


@torch.no_grad()
def generate(
    model: GPT,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    sampler: SamplerChain | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """input_ids (B, T) -> the (B, max_new_tokens) tokens that follow (no stopping on EOS)."""
    B, T = input_ids.shape
    context = model.recipe.model.context_length if model.recipe is not None else model.position.max_positions
    if context is not None and T + max_new_tokens > context:
        raise GptzooError(f"{T} prompt tokens + {max_new_tokens} new tokens exceed the context length {context}; ask for fewer")
    cache = model.init_cache(B, T + max_new_tokens)
    logits = model(input_ids, cache)[:, -1]  # (B, V)
    tokens = input_ids
    new = []
    for step in range(max_new_tokens):
        nxt = logits.float().argmax(dim=-1) if sampler is None else sampler(logits, tokens, generator)  # (B,)
        new.append(nxt)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        if step + 1 < max_new_tokens:
            logits = model(nxt[:, None], cache)[:, -1]
    return torch.stack(new, dim=1) if new else input_ids.new_zeros(B, 0)
