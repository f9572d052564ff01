"""Gated DeltaNet (Yang, Kautz and Hatamizadeh, 2024), the linear-attention token mixer of Qwen3-Next,
Qwen3.5 and OLMo Hybrid, in an attention's place.

Two projections give, per token: ``in_proj`` queries and keys (``key_heads`` heads of ``key_dim``),
values and an output gate z (``heads`` heads of ``value_dim``), in that order, and ``gate_proj`` per value
head a write strength b and a decay input a (two projections as Qwen3-Next stores them, each of whose
interleaves its parts per key head). Queries, keys and values go through a causal depthwise
convolution of ``kernel`` taps (no bias) and SiLU; queries and keys are L2-normalized per head (the
query also scaled by key_dim^-1/2) and each key head serves ``heads // key_heads`` consecutive value
heads. Then the gated delta rule (plugins/_delta_rule.py) with

    beta = sigmoid(b)          (times 2 with ``neg_eigval``: OLMo Hybrid's allow_neg_eigval, beta in (0, 2))
    g = -exp(A_log) * softplus(a + dt_bias)          (the log decay, <= 0)

and its output, per value head, RMS-normalized (``norm_eps``), scaled by ``norm.weight`` and gated by
SiLU(z), is projected back by ``c_proj``.

Its cache (gptzoo_plugins._recurrent.RecurrentState) is of constant size: the last ``kernel - 1`` inputs of the
convolution and the (B, heads, key_dim, value_dim) state, in float32, whatever the length. A prompt goes through
the chunked form (``chunk`` tokens at a time), a single cached token through the recurrence; the two
give the same numbers (tests/model/test_gated_deltanet.py). Left padding is zeroed at the
convolution's input, so a padded row's state is exactly the zeros a lone row starts from.

A_log and dt_bias start deterministic (no random numbers drawn): A spread evenly over [1, 16] and the
time step dt log-evenly over [0.001, 0.1] across heads, the ranges flash-linear-attention draws from.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptzoo.flops import linear_flops
from gptzoo.interfaces import AttentionContext
from gptzoo_plugins import _delta_rule
from gptzoo_plugins._recurrent import RecurrentMixer, RecurrentState, count_problems, eps_problems, size_problems


class GatedRMSNorm(nn.Module):
    """RMSNorm over each head's output, scaled by ``weight`` and gated by SiLU(z) (flash-linear-attention's
    FusedRMSNormGated, norm before gate): normalized in float32, scaled in the input's dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        x = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)
        return (x * F.silu(z.float())).to(dtype)


class GatedDeltaNet(RecurrentMixer):
    """Gated DeltaNet (Qwen3-Next, Qwen3.5, OLMo Hybrid): the gated delta rule, a constant-size state per sequence.

    Short-convolved, L2-normalized queries and keys, a gated RMSNorm output; the module docstring says the rest.

    ``heads``, ``key_heads``, ``key_dim``, ``value_dim``: 0 takes the recipe's n_head, heads, head_dim
    and key_dim. ``kernel``: the convolution's taps. ``chunk``: tokens per chunk of the chunked form.
    ``neg_eigval``: beta in (0, 2). ``norm_eps``: the output norm's epsilon."""

    examples = [
        {"heads": 3, "key_heads": 1, "key_dim": 5, "value_dim": 7, "chunk": 3},
        {"neg_eigval": True, "kernel": 1, "chunk": 2},
    ]

    def __init__(
        self,
        d_model: int,
        n_head: int,
        *,
        n_kv_head: int,
        head_dim: int,
        bias: bool,
        heads: int = 0,
        key_heads: int = 0,
        key_dim: int = 0,
        value_dim: int = 0,
        kernel: int = 4,
        chunk: int = 64,
        neg_eigval: bool = False,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        sizes = {"heads": heads, "key_heads": key_heads, "key_dim": key_dim, "value_dim": value_dim}
        problems = self.check(n_head=n_head, kernel=kernel, chunk=chunk, norm_eps=norm_eps, **sizes)
        if problems:
            raise ValueError("; ".join(problems))
        heads = heads or n_head
        key_heads = key_heads or heads
        key_dim = key_dim or head_dim
        value_dim = value_dim or key_dim
        self.heads, self.key_heads, self.key_dim, self.value_dim = heads, key_heads, key_dim, value_dim
        self.kernel, self.chunk, self.neg_eigval = kernel, chunk, neg_eigval
        self.channels = 2 * key_heads * key_dim + heads * value_dim  # q, k and v: what the convolution sees
        self.in_proj = nn.Linear(d_model, self.channels + heads * value_dim, bias=bias)
        self.gate_proj = nn.Linear(d_model, 2 * heads, bias=bias)
        self.conv = nn.Conv1d(self.channels, self.channels, kernel, groups=self.channels, bias=False)
        A = torch.linspace(1.0, 16.0, heads)
        dt = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), heads))
        self.A_log = nn.Parameter(A.log())
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
        self.norm = GatedRMSNorm(value_dim, norm_eps)
        self.c_proj = nn.Linear(heads * value_dim, d_model, bias=bias)

    @staticmethod
    def check(
        *,
        n_head: int = 1,
        heads: int = 0,
        key_heads: int = 0,
        key_dim: int = 0,
        value_dim: int = 0,
        kernel: int = 4,
        chunk: int = 64,
        norm_eps: float = 1e-6,
        **_: object,
    ) -> list[str]:
        """What is wrong with these parameters (the recipe's validation reads it, with the recipe's sizes)."""
        problems = size_problems(
            ("heads", heads, "recipe's n_head"),
            ("key_heads", key_heads, "value heads"),
            ("key_dim", key_dim, "recipe's head_dim"),
            ("value_dim", value_dim, "key_dim"),
        )
        problems += count_problems(kernel=kernel, chunk=chunk)
        value_heads = heads or n_head
        shared = key_heads or value_heads
        if value_heads >= 1 and shared >= 1 and value_heads % shared:
            problems.append(
                f"heads={value_heads} must be a multiple of key_heads={shared} (each key head serves as many)"
            )
        problems += eps_problems(norm_eps)
        return problems

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.heads, self.key_dim, self.value_dim)

    def forward(self, x: Tensor, ctx: AttentionContext, cache: RecurrentState | None = None) -> Tensor:
        B, T, _ = x.shape
        H, dk, dv = self.heads, self.key_dim, self.value_dim
        qkv, z = self.in_proj(x).split([self.channels, H * dv], dim=-1)
        b, a = self.gate_proj(x).split([H, H], dim=-1)
        qkv, fresh, _ = self.convolve(qkv, ctx, cache)  # (B, channels, T)
        q, k, v = qkv.float().split([self.key_heads * dk, self.key_heads * dk, H * dv], dim=1)
        q, k = (_delta_rule.l2_normalize(t.view(B, self.key_heads, dk, T).transpose(2, 3)) for t in (q, k))
        q, k = (t.repeat_interleave(H // self.key_heads, dim=1) for t in (q * dk**-0.5, k))  # (B, H, T, dk)
        v = v.view(B, H, dv, T).transpose(2, 3)  # (B, H, T, dv)
        beta = torch.sigmoid(b.float()).transpose(1, 2) * (2.0 if self.neg_eigval else 1.0)  # (B, H, T)
        g = (-self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)).transpose(1, 2)
        state = q.new_zeros(B, H, dk, dv) if fresh else cache.state
        if T == 1 and not fresh:
            o, state = _delta_rule.recurrent(q, k, v, g, beta, state)
        else:
            o, state = _delta_rule.chunked(q, k, v, g, beta, state, min(self.chunk, T))  # a short prompt: one chunk
        if cache is not None:
            cache.state.copy_(state)
        o = self.norm(o.transpose(1, 2).to(x.dtype), z.view(B, T, H, dv))  # (B, T, H, dv)
        return self.c_proj(o.reshape(B, T, H * dv))

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        """What the chunked form executes (tests/testing holds it to FlopCounterMode's count): per chunk of C
        tokens and value head, k k^T and q k^T (C x C x key_dim each), the scores times the writes (C x C x
        value_dim), and the state's read by the writes and the queries and its update (C x key_dim x
        value_dim each); the triangular solve, which FlopCounterMode does not count, is left out too."""
        tokens = batch * seq_len
        C, dk, dv = min(self.chunk, max(seq_len, 1)), self.key_dim, self.value_dim
        chunks = -(-seq_len // C)
        return {
            "in_proj": linear_flops(tokens, self.in_proj, self.gate_proj),
            "conv": 2 * tokens * self.channels * self.kernel,
            "delta_rule": batch * self.heads * chunks * 2 * (2 * C * C * dk + C * C * dv + 3 * C * dk * dv),
            "c_proj": linear_flops(tokens, self.c_proj),
        }
