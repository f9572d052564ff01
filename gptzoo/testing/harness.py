"""Tiny models and inputs the conformance checks run a component in, built exactly as gptzoo builds
any model: recipe data validated against the registry (so the component's own ``check`` and its
parameters are judged as a recipe's would be), then gptzoo.build_model.

The test model is the shipped ``gpt2-tiny`` recipe at a smaller size (:data:`SIZES`), with the
component under test (and, for pairings, a partner) in place of the recipe's own.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from gptzoo import plugin_code
from gptzoo.errors import GptzooError, RecipeError, exception_text
from gptzoo.hookspecs import CONTRACTS
from gptzoo.interfaces import Positions
from gptzoo.model.build import build_model
from gptzoo.model.gpt import GPT
from gptzoo.recipe import read_recipe_data, resolve_recipe_path, validate
from gptzoo.registry import Entry, Registry
from gptzoo.testing.results import Failed, Skipped

BASE_RECIPE = "gpt2-tiny"
VOCAB, CONTEXT, N_LAYER, D_FF = 64, 32, 2, 32
BATCH, SEQ = 2, 8
"""The batch and sequence length of the forward, FLOPs and round-trip checks."""


@dataclass(frozen=True)
class Size:
    """The attention shape of a test model, and whether its linear layers have biases."""

    label: str
    n_embd: int
    n_head: int
    n_kv_head: int
    head_dim: int
    bias: bool = True

    def model_values(self) -> dict[str, Any]:
        return {
            "n_embd": self.n_embd,
            "n_head": self.n_head,
            "n_kv_head": self.n_kv_head,
            "head_dim": self.head_dim,
            "bias": self.bias,
        }


SIZES = (
    Size("plain", 16, 4, 4, 4),
    Size("odd-heads", 24, 3, 3, 8),
    Size("head_dim", 16, 2, 2, 6),  # head_dim != n_embd / n_head
    Size("gqa", 16, 4, 2, 4),
    Size("mqa", 16, 4, 1, 4),
)
"""The sizes every component is built at."""
PLAIN = SIZES[0]
UNBIASED = Size("unbiased", 16, 4, 4, 4, bias=False)
"""The plain size without biases (Llama's linears): a lowering that only describes unbiased layers (and
refuses the others) is exercised there."""
PAIR_SIZE = SIZES[3]
"""The size of the causality and cache checks: grouped key/value heads, so that a cache of its own
shape meets n_kv_head < n_head."""

Choice = tuple[Entry, Mapping[str, Any]]
"""A component of the test model: its entry and recipe parameters."""


def model_data(size: Size, choices: Mapping[str, Choice]) -> dict[str, Any]:
    """Recipe data of the test model at ``size`` with these components (kind -> choice)."""
    data = read_recipe_data(resolve_recipe_path(BASE_RECIPE))
    model = {
        **data["model"],
        "vocab_size": VOCAB,
        "context_length": CONTEXT,
        "n_layer": N_LAYER,
        "d_ff": D_FF,
        **size.model_values(),
    }
    for kind, (entry, params) in choices.items():
        model[kind] = {"name": entry.qualified_name, **params}  # the entry itself, whatever else shares its name
    return {**data, "model": model}


def structural(kind: str, size: Size) -> dict[str, Any]:
    """What the model passes a factory of this kind at this size (as gptzoo.recipe.structural_args)."""
    values = {**size.model_values(), "d_ff": D_FF, "context_length": CONTEXT}
    return {arg: values[attr] for arg, attr in CONTRACTS[kind].structural}


def refused(entry: Entry, size: Size, params: Mapping[str, Any]) -> list[str]:
    """The problems the component's own ``check`` finds at this size."""
    return plugin_code.check(entry, {**structural(entry.kind, size), **params})


def pair_size(choices: Mapping[str, Choice]) -> Size:
    """The size of the causality and cache checks for these components: PAIR_SIZE, or, when one of them
    refuses grouped key/value heads (a latent attention expands its own for every head), the first of
    SIZES that all of them accept (PAIR_SIZE again when none does, whose check then skips with the reason)."""
    for size in (PAIR_SIZE, *SIZES):
        if not any(refused(entry, size, params) for entry, params in choices.values()):
            return size
    return PAIR_SIZE


def build_test_model(registry: Registry, size: Size, choices: Mapping[str, Choice], *, seed: int) -> GPT:
    """The test model, initialized from ``seed``, in eval mode.

    Raises:
        Skipped: a component's own check refuses this size.
        Failed: the recipe does not validate for another reason, or a component does not build.
    """
    for kind, (entry, params) in choices.items():
        problems = refused(entry, size, params)
        if problems:
            raise Skipped(f"{kind} {entry.name!r} refuses size {size.label}: {'; '.join(problems)}")
    data = model_data(size, choices)
    try:
        recipe = validate(data, f"the conformance test model ({size.label})", name="conformance", registry=registry)
    except RecipeError as exc:
        raise Failed(f"the test model does not validate: {'; '.join(exc.problems)}") from None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = build_model(recipe, device="cpu", registry=registry)
        except GptzooError as exc:
            raise Failed(one_line(exception_text(exc))) from None
    return model.eval()


def build_standalone(entry: Entry, params: Mapping[str, Any], *, seed: int) -> Any:
    """A component that takes nothing from the model (an activation, a sampler), built and held to its
    contract as the model and the sampler chain do.

    Raises:
        Skipped: its own check refuses the parameters.
        Failed: it does not build, or breaks its contract.
    """
    problems = plugin_code.check(entry, params)
    if problems:
        raise Skipped(f"its check refuses {dict(params)}: {'; '.join(problems)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            built = plugin_code.build(entry, params, user_errors=(TypeError, ValueError))
            plugin_code.check_contract(entry, built)
        except (TypeError, ValueError) as exc:
            raise Failed(f"the factory refused {dict(params)}: {one_line(exception_text(exc))}") from None
        except GptzooError as exc:
            raise Failed(one_line(exception_text(exc))) from None
    return built.eval() if isinstance(built, nn.Module) else built


def component_of(model: GPT, kind: str) -> nn.Module:
    """The component of this kind in the test model (the first block's, for per-block kinds)."""
    block = model.blocks[0]
    return {"norm": block.ln_1, "mlp": block.mlp, "attention": block.attn, "position": model.position}[kind]


def module_name(model: GPT, module: nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def run_in_model(model: GPT, kind: str, module: nn.Module, x: Tensor) -> Tensor:
    """The component's own forward on x (B, T, n_embd) as the model calls it; for a position, the
    model's logits for token ids x (B, T)."""
    if kind == "position":
        return model(x)
    if kind == "attention":
        pos = Positions.plain(0, x.shape[1], x.device)
        return module(x, model.attention_context(pos, x.dtype), None)
    return module(x)


def model_input(
    kind: str, n_embd: int, generator: torch.Generator, dtype: torch.dtype = torch.float32, *, batch: int = BATCH
) -> Tensor:
    """The input of a component's forward: token ids for a position (it runs in the model), else
    activations (batch, SEQ, n_embd)."""
    if kind == "position":
        return torch.randint(0, VOCAB, (batch, SEQ), generator=generator)
    return torch.randn(batch, SEQ, n_embd, generator=generator).to(dtype)


def in_bfloat16(module: nn.Module) -> nn.Module:
    return copy.deepcopy(module).to(torch.bfloat16)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def label(params: Mapping[str, Any]) -> str:
    """``window=3``: an example parameter set as a check's variant says it."""
    return ",".join(f"{k}={v}" for k, v in params.items())
