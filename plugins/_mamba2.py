"""Mamba-2 (Dao and Gu, 2024), the state space token mixer of Granite 4.0-H and Falcon-H1, in an attention's
place.

One projection ``in_proj`` gives, per token and in this order: an output gate z (``heads`` heads of
``value_dim`` channels, I = heads x value_dim), the inputs x (I), the state projections B and C (``groups``
groups of ``state`` each, a group shared by ``heads // groups`` consecutive heads) and a time step per head.
x, B and C go through a causal depthwise convolution of ``kernel`` taps (with a bias unless ``conv_bias`` is
false) and SiLU. Then, per head, the selective scan of state space duality (plugins/_ssd.py) with

    dt = softplus(dt + dt_bias),   g = -exp(A_log) dt   (the log decay, <= 0),   inputs dt x

reading B as keys and C as queries, plus the skip D x. The scan's output is gated by SiLU(z), then
RMS-normalized over each group's channels (``norm_eps``; the gate before the norm, as Mamba-2's
RMSNormGated with norm_before_gate=False) and scaled by ``norm.weight``, and projected back by ``c_proj``.
``in_proj`` and ``c_proj`` have biases when the recipe's ``bias`` says so.

Its cache (gptzoo_plugins._recurrent.RecurrentState, as gated DeltaNet's) is of constant size: the last
``kernel - 1`` inputs of the convolution and the (B, heads, state, value_dim) state, in float32, whatever
the length. A prompt goes through the chunked form (``chunk`` tokens at a time), a single cached token
through the recurrence; the two give the same numbers (tests/model/test_mamba2.py). Left padding is zeroed
at the convolution's input and output, so a padded row's state is exactly the zeros a lone row starts from.

A_log, dt_bias and D start deterministic (no random numbers drawn): A spread evenly over [1, 16], the time
step log-evenly over [0.001, 0.1] across heads (Mamba-2's ranges), D ones.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gptzoo.flops import linear_flops
from gptzoo.interfaces import AttentionContext
from gptzoo_plugins import _ssd
from gptzoo_plugins._recurrent import RecurrentMixer, RecurrentState, count_problems, eps_problems, size_problems


class GroupedGatedRMSNorm(nn.Module):
    """x gated by SiLU(z), then RMS-normalized over each of ``groups`` equal groups of channels and scaled by
    ``weight`` (Mamba-2's RMSNormGated, gate before norm), in float32."""

    def __init__(self, dim: int, groups: int, eps: float) -> None:
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float() * F.silu(z.float())
        grouped = x.unflatten(-1, (self.groups, -1))
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * grouped.flatten(-2)).to(dtype)


class Mamba2(RecurrentMixer):
    """Mamba-2 (Granite 4.0-H, Falcon-H1): a selective state space scan, a constant-size state per sequence.

    Short-convolved inputs and state projections, a decay per head, a gated grouped RMSNorm output; the module
    docstring says the rest.

    ``heads``, ``value_dim``: 0 takes the recipe's n_head and head_dim. ``state``: the state size N per head.
    ``groups``: B and C groups. ``kernel``: the convolution's taps. ``conv_bias``: the convolution's bias.
    ``chunk``: tokens per chunk of the chunked form. ``norm_eps``: the output norm's epsilon."""

    examples = [
        {"heads": 4, "value_dim": 3, "state": 5, "groups": 2, "chunk": 3},
        {"state": 2, "kernel": 1, "conv_bias": False, "chunk": 2},
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
        value_dim: int = 0,
        state: int = 128,
        groups: int = 1,
        kernel: int = 4,
        conv_bias: bool = True,
        chunk: int = 64,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        problems = self.check(
            n_head=n_head, heads=heads, value_dim=value_dim, state=state, groups=groups, kernel=kernel, chunk=chunk,
            norm_eps=norm_eps,
        )  # fmt: skip
        if problems:
            raise ValueError("; ".join(problems))
        heads, value_dim = heads or n_head, value_dim or head_dim
        self.heads, self.value_dim, self.state, self.groups = heads, value_dim, state, groups
        self.kernel, self.chunk = kernel, chunk
        self.inner = heads * value_dim
        self.channels = self.inner + 2 * groups * state  # x, B and C: what the convolution sees
        self.in_proj = nn.Linear(d_model, self.inner + self.channels + heads, bias=bias)
        self.conv = nn.Conv1d(self.channels, self.channels, kernel, groups=self.channels, bias=conv_bias)
        A = torch.linspace(1.0, 16.0, heads)
        dt = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), heads))
        self.A_log = nn.Parameter(A.log())
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
        self.D = nn.Parameter(torch.ones(heads))
        self.norm = GroupedGatedRMSNorm(self.inner, groups, norm_eps)
        self.c_proj = nn.Linear(self.inner, d_model, bias=bias)

    @staticmethod
    def check(
        *,
        n_head: int = 1,
        heads: int = 0,
        value_dim: int = 0,
        state: int = 128,
        groups: int = 1,
        kernel: int = 4,
        chunk: int = 64,
        norm_eps: float = 1e-5,
        **_: object,
    ) -> list[str]:
        """What is wrong with these parameters (the recipe's validation reads it, with the recipe's sizes)."""
        problems = size_problems(("heads", heads, "recipe's n_head"), ("value_dim", value_dim, "recipe's head_dim"))
        problems += count_problems(
            ("state", state, "the state size per head"),
            ("groups", groups, "groups of B and C"),
            kernel=kernel,
            chunk=chunk,
        )
        count = heads or n_head
        if count >= 1 and groups >= 1 and count % groups:
            problems.append(f"heads={count} must be a multiple of groups={groups} (each group serves as many heads)")
        return problems + eps_problems(norm_eps)

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.heads, self.state, self.value_dim)

    def forward(self, x: Tensor, ctx: AttentionContext, cache: RecurrentState | None = None) -> Tensor:
        B, T, _ = x.shape
        H, P, N, G = self.heads, self.value_dim, self.state, self.groups
        z, xbc, dt = self.in_proj(x).split([self.inner, self.channels, H], dim=-1)
        xbc, fresh, real = self.convolve(xbc, ctx, cache)
        xbc = xbc.transpose(1, 2)  # (B, T, channels)
        if real is not None:  # left padding zeroed at the convolution's output too: a padded token writes nothing
            xbc = xbc * real[..., None].to(xbc.dtype)
        u, k, q = xbc.float().split([self.inner, G * N, G * N], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias)  # (B, T, H)
        g = (-self.A_log.float().exp() * dt).transpose(1, 2)  # (B, H, T)
        k, q = (t.view(B, T, G, N).transpose(1, 2).repeat_interleave(H // G, dim=1) for t in (k, q))  # (B, H, T, N)
        u = u.view(B, T, H, P)
        v = (u * dt[..., None]).transpose(1, 2)  # (B, H, T, P)
        state = q.new_zeros(B, H, N, P) if fresh else cache.state
        if T == 1 and not fresh:
            o, state = _ssd.recurrent(q, k, v, g, state)
        else:
            o, state = _ssd.chunked(q, k, v, g, state, min(self.chunk, T))  # a short prompt: one chunk
        if cache is not None:
            cache.state.copy_(state)
        y = o.transpose(1, 2) + self.D.float()[:, None] * u  # (B, T, H, P)
        return self.c_proj(self.norm(y.reshape(B, T, self.inner), z).to(x.dtype))

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        """What the chunked form executes (tests/testing holds it to FlopCounterMode's count): per chunk of C
        tokens and head, C^T B (C x C x state), the scores times the inputs (C x C x value_dim), and the state's
        read by the queries and its update (C x state x value_dim each)."""
        tokens = batch * seq_len
        C, N, P = min(self.chunk, max(seq_len, 1)), self.state, self.value_dim
        chunks = -(-seq_len // C)
        return {
            "in_proj": linear_flops(tokens, self.in_proj),
            "conv": 2 * tokens * self.channels * self.kernel,
            "ssd": batch * self.heads * chunks * 2 * (C * C * N + C * C * P + 2 * C * N * P),
            "c_proj": linear_flops(tokens, self.c_proj),
        }
