"""AdamW with weight decay on matrices only, and the warmup + cosine learning-rate schedule.

As in GPT-2/3 practice (and nanoGPT's configure_optimizers), weight decay applies to the weight
matrices of linear layers; biases, norm gains and embeddings (including a head tied to the token
embedding) are not decayed. The schedule is nanoGPT's: linear warmup to lr, then a cosine to
min_lr at the last step (Loshchilov & Hutter, 2017).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from gptzoo.recipe import TrainSpec


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups, each with the parameter names it holds (``names``) for inspection."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay: dict[str, nn.Parameter] = {}
    rest: dict[str, nn.Parameter] = {}
    for name, p in model.named_parameters():  # a tied parameter appears once
        if p.requires_grad:
            (decay if p.ndim >= 2 and id(p) not in embeddings else rest)[name] = p
    return [
        {"params": list(decay.values()), "names": list(decay), "weight_decay": weight_decay},
        {"params": list(rest.values()), "names": list(rest), "weight_decay": 0.0},
    ]


def make_optimizer(model: nn.Module, spec: TrainSpec) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, fused (one kernel for all parameters) where torch has it."""
    groups = param_groups(model, spec.weight_decay)
    kwargs = {"lr": spec.lr, "betas": (spec.beta1, spec.beta2), "eps": spec.eps}
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except RuntimeError:  # a device or dtype without a fused kernel
        return torch.optim.AdamW(groups, foreach=True, **kwargs)


def lr_at(step: int, spec: TrainSpec) -> float:
    """The learning rate of optimizer step ``step`` (0-based)."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / (spec.warmup_steps + 1)
    if step >= spec.max_steps - 1 or spec.max_steps <= spec.warmup_steps:
        return spec.min_lr
    progress = (step - spec.warmup_steps) / (spec.max_steps - 1 - spec.warmup_steps)
    return spec.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (spec.lr - spec.min_lr)
