"""Mamba-2's state space duality (Dao and Gu, "Transformers are SSMs", 2024), in two forms that give the same
numbers: a chunked one for training and prefill, and the step-by-step recurrence for decoding (and for holding
the chunked one to it).

Per head, a state S (N, P) maps the state dimension to the head's channels. Token t decays it by
alpha_t = exp(g_t) (g = dt A <= 0) and adds its input:

    S_t = alpha_t S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t

where k is B, q is C (N each) and v is dt x (P). It is the gated delta rule (plugins/_delta_rule.py) without
the delta correction, so the chunked form needs no solve: within a chunk of C tokens after a state S0, with
gamma_i the cumulative log decay from the chunk's start to token i and D_ij = exp(gamma_i - gamma_j) for j <= i,

    o_i = exp(gamma_i) S0^T q_i + sum_{j<=i} D_ij (q_i . k_j) v_j
    S_C = exp(gamma_C) S0 + sum_j exp(gamma_C - gamma_j) k_j v_j^T

a few matmuls and a Python step per chunk, not per token; every decay is an exp of a difference <= 0. Both
forms compute in float32 and take and give the state in float32.

Shapes: q, k (B, H, T, N), v (B, H, T, P), g (B, H, T), state (B, H, N, P).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """The recurrence, one token at a time: outputs (B, H, T, P) and the state after the last token."""
    outputs = []
    for t in range(q.shape[2]):
        state = state * g[:, :, t, None, None].exp() + k[:, :, t, :, None] * v[:, :, t, None, :]
        outputs.append(q[:, :, t, None, :] @ state)
    return torch.cat(outputs, dim=2), state


def chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, state: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """The chunked form (the module docstring): outputs (B, H, T, P) and the state after the last token.

    The last chunk is padded with tokens that change nothing (g = 0, zero keys and inputs)."""
    T = q.shape[2]
    pad = -T % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g = F.pad(g, (0, pad))
    B, H, n = q.shape[0], q.shape[1], q.shape[2] // chunk
    q, k, v = (x.reshape(B, H, n, chunk, x.shape[-1]) for x in (q, k, v))
    gamma = g.reshape(B, H, n, chunk).cumsum(-1)  # (B, H, n, C)
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)  # j > i: no contribution
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(later, float("-inf")).exp()  # D (.., C, C)
    within = ((q @ k.transpose(-1, -2)) * decay) @ v  # (B, H, n, C, P): each chunk's own tokens
    q_decayed = q * gamma.exp()[..., None]
    k_to_end = k * (gamma[..., -1:] - gamma).exp()[..., None]
    chunk_decay = gamma[..., -1].exp()[..., None, None]  # (B, H, n, 1, 1)
    outputs = []
    for i in range(n):
        outputs.append(q_decayed[:, :, i] @ state + within[:, :, i])
        state = state * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ v[:, :, i]
    return torch.cat(outputs, dim=2)[:, :, :T], state
