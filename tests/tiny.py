"""Tiny models for tests, every attention x position pair of the registry to run them with, and the
overrides of a tiny training run."""

from __future__ import annotations

import itertools

import pytest
import torch

import gptzoo
from gptzoo.errors import RecipeError

BASES = ("gpt2-tiny", "llama-tiny")  # MHA + LayerNorm + dense GELU; GQA + RMSNorm + SwiGLU + untied


def _pair(base: str, attention: str, position: str) -> object:
    """The pair as parameters, or skipped with the reason when the components refuse the base (a latent
    attention, which expands keys and values for every head, refuses llama-tiny's grouped heads)."""
    try:
        gptzoo.load_recipe(base, [f"model.attention={attention}", f"model.position={position}"])
    except RecipeError as exc:
        return pytest.param(base, attention, position, marks=pytest.mark.skip(reason=f"{base} refuses it: {exc}"))
    return (base, attention, position)


PAIRS = [
    _pair(*pair)
    for pair in itertools.product(
        BASES, gptzoo.get_registry().names("attention"), gptzoo.get_registry().names("position")
    )
]
"""(base recipe, attention, position) for every registered attention and position (each base runs every
one that accepts it, and gpt2-tiny's full heads are accepted by all built-ins)."""
TRAIN = [
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "model.d_ff=64",
    "train.seq_len=32",
    "train.micro_batch_size=2",
    "train.eval_batches=2",
    "train.warmup_steps=2",
]
"""Overrides that make a recipe a one-layer, width-32 model that trains on 2 x 32 tokens in moments."""


def tiny_model(base: str, *overrides: str) -> gptzoo.GPT:
    """A base recipe with overrides, deterministically initialized, in eval mode."""
    torch.manual_seed(0)
    return gptzoo.build_model(gptzoo.load_recipe(base, overrides)).eval()
