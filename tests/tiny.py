"""Tiny models for tests, and every attention x position pair of the registry to run them with."""

from __future__ import annotations

import itertools

import torch

import gptzoo

BASES = ("gpt2-tiny", "llama-tiny")  # MHA + LayerNorm + dense GELU; GQA + RMSNorm + SwiGLU + untied
PAIRS = list(
    itertools.product(BASES, gptzoo.get_registry().names("attention"), gptzoo.get_registry().names("position"))
)
"""(base recipe, attention, position) for every registered attention and position."""


def tiny_model(base: str, *overrides: str) -> gptzoo.GPT:
    """A base recipe with overrides, deterministically initialized, in eval mode."""
    torch.manual_seed(0)
    return gptzoo.build_model(gptzoo.load_recipe(base, overrides)).eval()
