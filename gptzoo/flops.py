"""Analytic FLOPs of a forward pass, counted from the components themselves.

Convention: one multiply-add is 2 FLOPs, and only matmuls count (norms, activations, softmax and
rotary tables are a few FLOPs per element and are left out, as torch's FlopCounterMode does).
Per layer at sequence length T this gives attention projections 8 T d^2 (MHA), scores and weighted
sum 4 T^2 d (the full T x T square, no causal halving), dense MLP 16 T d^2 (d_ff = 4d), and the LM
head 2 T V d. Training costs about 3x the forward pass (backward = 2x forward).
"""

from __future__ import annotations

from collections import defaultdict

from torch import nn

FLOPS_CONVENTION = "1 multiply-add = 2 FLOPs; matmuls only"
TRAIN_FORWARD_RATIO = 3
"""Training FLOPs / forward FLOPs: forward + backward (which costs twice the forward)."""


def linear_flops(n_tokens: int, *layers: nn.Linear) -> int:
    """FLOPs of applying these linear layers to n_tokens vectors."""
    return 2 * n_tokens * sum(layer.in_features * layer.out_features for layer in layers)


def forward_flops(model: nn.Module, batch: int, seq_len: int) -> dict[str, int]:
    """Matmul FLOPs of one cache-less forward pass of a gptzoo.GPT over (batch, seq_len) tokens, by part:
    every module of the model that declares ``flops`` reports its own (the contracts' ``flops``: each
    attention and mlp, and any norm, activation or position that counts its matmuls), plus the LM head."""
    parts: dict[str, int] = defaultdict(int)
    for module in model.declaring("flops"):
        for name, n in module.flops(batch, seq_len).items():
            parts[name] += n
    parts["lm head"] = linear_flops(batch * seq_len, model.lm_head)
    return dict(parts)


def train_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training FLOPs per token of a gptzoo.GPT on sequences of seq_len tokens (forward + backward)."""
    return TRAIN_FORWARD_RATIO * sum(forward_flops(model, 1, seq_len).values()) / seq_len
