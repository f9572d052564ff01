"""Kimi delta attention (Kimi Team, "Kimi Linear", 2025), the linear-attention token mixer of Kimi Linear, in an
attention's place: gated DeltaNet (plugins/_gated_deltanet.py) with a decay per key channel instead of per head.

``in_proj`` gives, per token, queries, keys and values (``heads`` heads of ``head_size`` each, in that order),
which go through a causal depthwise convolution of ``kernel`` taps (no bias) and SiLU; queries and keys are
L2-normalized per head (the query also scaled by head_size^-1/2). Then the gated delta rule with a decay per
key channel (plugins/_delta_rule.py, ``chunked_channels`` and ``recurrent_channels``), where

    beta = sigmoid(b_proj(x))                                         (per head)
    g = -exp(A_log) * softplus(f_b_proj(f_a_proj(x)) + dt_bias)      (per head and key channel, <= 0)

the forget gate's two projections a low-rank product of rank head_size, as Kimi Linear's. The output, per head,
is RMS-normalized (``norm_eps``, in float32), scaled by ``norm.weight`` and gated by sigmoid(g_b_proj(g_a_proj(x)))
(another low-rank product), then projected back by ``c_proj``. A_log is stored (1, 1, heads, 1), as Kimi Linear
stores it.

Its cache (gptzoo_plugins._recurrent.RecurrentState) is of constant size: the convolution's last ``kernel - 1``
inputs and the (B, heads, head_size, head_size) state in float32. A prompt goes through the chunked form, a single
cached token through the recurrence; the two give the same numbers (tests/model/test_kda.py). Left padding is
zeroed at the convolution's input, so a padded row's state is exactly the zeros a lone row starts from.

A_log and dt_bias start deterministic (no random numbers drawn): A spread evenly over [1, 16] across heads, the
time step log-evenly over [0.001, 0.1] across each head's channels.
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


class SigmoidGatedRMSNorm(nn.Module):
    """RMSNorm over each head's output, scaled by ``weight`` and gated by sigmoid(gate), all in float32 (Kimi
    Linear's output norm)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        x = self.weight.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        return (x * torch.sigmoid(gate.float())).to(dtype)


class KimiDeltaAttention(RecurrentMixer):
    """Kimi delta attention (Kimi Linear): the gated delta rule with a decay per key channel, a constant-size state.

    Short-convolved, L2-normalized queries and keys, low-rank forget and output gates, a sigmoid-gated RMSNorm
    output; the module docstring says the rest.

    ``heads``, ``head_size``: 0 takes the recipe's n_head and head_dim. ``kernel``: the convolution's taps.
    ``chunk``: tokens per chunk of the chunked form. ``norm_eps``: the output norm's epsilon."""

    examples = [{"heads": 3, "head_size": 5, "chunk": 3}, {"kernel": 1, "chunk": 2}]

    def __init__(
        self,
        d_model: int,
        n_head: int,
        *,
        n_kv_head: int,
        head_dim: int,
        bias: bool,
        heads: int = 0,
        head_size: int = 0,
        kernel: int = 4,
        chunk: int = 64,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        problems = self.check(heads=heads, head_size=head_size, kernel=kernel, chunk=chunk, norm_eps=norm_eps)
        if problems:
            raise ValueError("; ".join(problems))
        heads, head_size = heads or n_head, head_size or head_dim
        self.heads, self.head_size, self.kernel, self.chunk = heads, head_size, kernel, chunk
        width = heads * head_size
        self.channels = 3 * width  # q, k and v: what the convolution sees
        self.in_proj = nn.Linear(d_model, self.channels, bias=bias)
        self.conv = nn.Conv1d(self.channels, self.channels, kernel, groups=self.channels, bias=False)
        self.f_a_proj = nn.Linear(d_model, head_size, bias=False)
        self.f_b_proj = nn.Linear(head_size, width, bias=False)
        self.b_proj = nn.Linear(d_model, heads, bias=False)
        self.g_a_proj = nn.Linear(d_model, head_size, bias=False)
        self.g_b_proj = nn.Linear(head_size, width, bias=False)
        dt = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), head_size)).repeat(heads)
        self.A_log = nn.Parameter(torch.linspace(1.0, 16.0, heads).log().view(1, 1, heads, 1))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
        self.norm = SigmoidGatedRMSNorm(head_size, norm_eps)
        self.c_proj = nn.Linear(width, d_model, bias=bias)

    @staticmethod
    def check(
        *, heads: int = 0, head_size: int = 0, kernel: int = 4, chunk: int = 64, norm_eps: float = 1e-5, **_: object
    ) -> list[str]:
        """What is wrong with these parameters (the recipe's validation reads it)."""
        problems = size_problems(("heads", heads, "recipe's n_head"), ("head_size", head_size, "recipe's head_dim"))
        return problems + count_problems(kernel=kernel, chunk=chunk) + eps_problems(norm_eps)

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.heads, self.head_size, self.head_size)

    def forward(self, x: Tensor, ctx: AttentionContext, cache: RecurrentState | None = None) -> Tensor:
        B, T, _ = x.shape
        H, d = self.heads, self.head_size
        qkv, fresh, _ = self.convolve(self.in_proj(x), ctx, cache)  # (B, channels, T)
        q, k, v = (t.view(B, H, d, T).transpose(2, 3) for t in qkv.float().split([H * d] * 3, dim=1))
        q, k = _delta_rule.l2_normalize(q) * d**-0.5, _delta_rule.l2_normalize(k)  # (B, H, T, d)
        beta = torch.sigmoid(self.b_proj(x).float()).transpose(1, 2)  # (B, H, T)
        forget = self.f_b_proj(self.f_a_proj(x)).float() + self.dt_bias.float()
        g = (-self.A_log.float().exp() * F.softplus(forget.view(B, T, H, d))).transpose(1, 2)  # (B, H, T, d)
        state = q.new_zeros(B, H, d, d) if fresh else cache.state
        if T == 1 and not fresh:
            o, state = _delta_rule.recurrent_channels(q, k, v, g, beta, state)
        else:
            o, state = _delta_rule.chunked_channels(q, k, v, g, beta, state, min(self.chunk, T))
        if cache is not None:
            cache.state.copy_(state)
        gate = self.g_b_proj(self.g_a_proj(x)).view(B, T, H, d)
        o = self.norm(o.transpose(1, 2).to(x.dtype), gate)  # (B, T, H, d)
        return self.c_proj(o.reshape(B, T, H * d))

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        """What the chunked form executes as matmuls (tests/testing holds it to FlopCounterMode's count): per chunk
        of C tokens and head, the writes times the scores (C x C x head_size), and the state's read by the writes
        and the queries and its update (C x head_size x head_size each); the per-channel products of the scores,
        elementwise, and the triangular solve are not counted, as FlopCounterMode does not count them."""
        tokens = batch * seq_len
        C, d = min(self.chunk, max(seq_len, 1)), self.head_size
        chunks = -(-seq_len // C)
        projections = (self.in_proj, self.f_a_proj, self.f_b_proj, self.b_proj, self.g_a_proj, self.g_b_proj)
        return {
            "in_proj": linear_flops(tokens, *projections),
            "conv": 2 * tokens * self.channels * self.kernel,
            "delta_rule": batch * self.heads * chunks * 2 * (C * C * d + 3 * C * d * d),
            "c_proj": linear_flops(tokens, self.c_proj),
        }
