"""The gated delta rule (Yang, Kautz and Hatamizadeh, "Gated Delta Networks", 2024), in two forms that
give the same numbers: a chunked one for training and prefill, and the step-by-step recurrence for
decoding (and for holding the chunked one to it).

Per head, a state S (dk, dv) maps keys to values. Token t decays it by alpha_t = exp(g_t), reads
what it predicts for the key, and writes beta_t times the error back at that key:

    S_t = alpha_t S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - (alpha_t S_{t-1})^T k_t),   o_t = S_t^T q_t

Chunked form. Within a chunk of C tokens after a state S0, with gamma_i the cumulative log decay from
the chunk's start to token i and D_ij = exp(gamma_i - gamma_j) for j <= i, unrolling gives

    u_i = beta_i v_i - beta_i exp(gamma_i) S0^T k_i - sum_{j<i} beta_i D_ij (k_i . k_j) u_j

a unit lower-triangular system (I + A) U = beta V - (beta exp(gamma) K) S0, solved once for both
right-hand sides (so U = U_v - W S0), then

    o_i = exp(gamma_i) S0^T q_i + sum_{j<=i} D_ij (q_i . k_j) u_j
    S_C = exp(gamma_C) S0 + sum_j exp(gamma_C - gamma_j) k_j u_j^T

so a prompt costs a few matmuls per chunk and a Python step per chunk, not per token. Every decay is
an exp of a difference that is <= 0, so nothing overflows. Both forms compute in float32 and take and
give the state in float32.

Shapes: q, k (B, H, T, dk) already normalized and scaled, v (B, H, T, dv), g and beta (B, H, T),
state (B, H, dk, dv).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(|x|^2 + eps) over the last dim (the flash-linear-attention kernels' definition)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """The recurrence, one token at a time: outputs (B, H, T, dv) and the state after the last token."""
    outputs = []
    for t in range(q.shape[2]):
        state = state * g[:, :, t, None, None].exp()
        k_t = k[:, :, t, None, :]  # (B, H, 1, dk)
        u = beta[:, :, t, None, None] * (v[:, :, t, None, :] - k_t @ state)  # (B, H, 1, dv)
        state = state + k_t.transpose(-1, -2) @ u
        outputs.append(q[:, :, t, None, :] @ state)
    return torch.cat(outputs, dim=2), state


def chunked(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, chunk: int
) -> tuple[Tensor, Tensor]:
    """The chunked form (the module docstring): outputs (B, H, T, dv) and the state after the last token.

    The last chunk is padded with tokens that change nothing (g = 0, beta = 0, zero keys)."""
    T = q.shape[2]
    pad = -T % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    B, H, n = q.shape[0], q.shape[1], q.shape[2] // chunk
    q, k, v = (x.reshape(B, H, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = (x.reshape(B, H, n, chunk) for x in (g, beta))
    gamma = g.cumsum(-1)  # (B, H, n, C)
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)  # j > i: no contribution
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(later, float("-inf")).exp()  # D (.., C, C)
    # I + A: solve_triangular(upper=False, unitriangular=True) reads the strict lower triangle only (A) and
    # takes the diagonal as ones (so do its gradients).
    system = beta[..., None] * (k @ k.transpose(-1, -2)) * decay
    rhs = torch.cat([beta[..., None] * v, (beta * gamma.exp())[..., None] * k], dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u_v, w = solved.split([v.shape[-1], k.shape[-1]], dim=-1)
    scores = (q @ k.transpose(-1, -2)) * decay  # (B, H, n, C, C), zero above the diagonal
    q_decayed = q * gamma.exp()[..., None]
    k_to_end = k * (gamma[..., -1:] - gamma).exp()[..., None]
    chunk_decay = gamma[..., -1].exp()[..., None, None]  # (B, H, n, 1, 1)
    outputs = []
    for i in range(n):
        u = u_v[:, :, i] - w[:, :, i] @ state  # (B, H, C, dv)
        outputs.append(q_decayed[:, :, i] @ state + scores[:, :, i] @ u)
        state = state * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ u
    return torch.cat(outputs, dim=2)[:, :, :T], state


def recurrent_channels(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """The recurrence with a decay per key channel (Kimi delta attention; g (B, H, T, dk)): each row of the
    state decays by its own exp(g); outputs (B, H, T, dv) and the state after the last token."""
    outputs = []
    for t in range(q.shape[2]):
        state = state * g[:, :, t, :, None].exp()
        k_t = k[:, :, t, None, :]  # (B, H, 1, dk)
        u = beta[:, :, t, None, None] * (v[:, :, t, None, :] - k_t @ state)  # (B, H, 1, dv)
        state = state + k_t.transpose(-1, -2) @ u
        outputs.append(q[:, :, t, None, :] @ state)
    return torch.cat(outputs, dim=2), state


def chunked_channels(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, chunk: int
) -> tuple[Tensor, Tensor]:
    """The chunked form with a decay per key channel (g (B, H, T, dk)): as :func:`chunked`, with
    D_ij a vector over the key channels, so k_i . k_j becomes sum_d k_id k_jd D_ijd (a (C, C, dk) product per
    chunk) and exp(gamma) scales q, k and the state channel by channel; outputs (B, H, T, dv) and the state
    after the last token. The last chunk is padded with tokens that change nothing."""
    T = q.shape[2]
    pad = -T % chunk
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, pad))
    B, H, n = q.shape[0], q.shape[1], q.shape[2] // chunk
    q, k, v, g = (x.reshape(B, H, n, chunk, x.shape[-1]) for x in (q, k, v, g))
    beta = beta.reshape(B, H, n, chunk)
    gamma = g.cumsum(-2)  # (B, H, n, C, dk)
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)[..., None]  # j > i
    decay = (gamma[..., :, None, :] - gamma[..., None, :, :]).masked_fill(later, float("-inf")).exp()  # (.., C, C, dk)
    system = beta[..., None] * (k[..., :, None, :] * k[..., None, :, :] * decay).sum(-1)
    rhs = torch.cat([beta[..., None] * v, beta[..., None] * k * gamma.exp()], dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u_v, w = solved.split([v.shape[-1], k.shape[-1]], dim=-1)
    scores = (q[..., :, None, :] * k[..., None, :, :] * decay).sum(-1)  # (B, H, n, C, C), zero above the diagonal
    q_decayed = q * gamma.exp()
    k_to_end = k * (gamma[..., -1:, :] - gamma).exp()
    chunk_decay = gamma[..., -1, :].exp()[..., None]  # (B, H, n, dk, 1)
    outputs = []
    for i in range(n):
        u = u_v[:, :, i] - w[:, :, i] @ state  # (B, H, C, dv)
        outputs.append(q_decayed[:, :, i] @ state + scores[:, :, i] @ u)
        state = state * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ u
    return torch.cat(outputs, dim=2)[:, :, :T], state
