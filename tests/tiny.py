"""Tiny models for tests, every attention x position pair of the registry to run them with, and the
overrides of a tiny training run."""

from __future__ import annotations

import itertools

import torch

import gptzoo

BASES = ("gpt2-tiny", "llama-tiny")  # MHA + LayerNorm + dense GELU; GQA + RMSNorm + SwiGLU + untied
PAIRS = list(
    itertools.product(BASES, gptzoo.get_registry().names("attention"), gptzoo.get_registry().names("position"))
)
"""(base recipe, attention, position) for every registered attention and position."""
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
