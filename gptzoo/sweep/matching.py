"""Matched variants: one [model] key (by default d_ff) chosen so that a variant has the base's parameter
count, its active parameters (those one token uses: a mixture of experts at a dense model's compute per
token), or its training FLOPs per token, as the GLU-variants paper sizes SwiGLU's hidden layer (2/3 of
the dense one's 4d). Computed from models built on the meta device (no weights), never hand-entered."""

from __future__ import annotations

from typing import Any

from gptzoo.errors import GptzooError, RecipeError
from gptzoo.flops import train_flops_per_token
from gptzoo.model.build import build_model
from gptzoo.model.gpt import GPT
from gptzoo.recipe import Recipe, override_recipe
from gptzoo.registry import Registry
from gptzoo.training.trainer import seq_len_of

TOLERANCE = 0.01
"""A matched variant is within 1% of its target."""
LARGEST = 1 << 24


def parameters(recipe: Recipe, registry: Registry) -> int:
    """Parameters of the recipe's model (a tied head once)."""
    return parameters_of(build_model(recipe, device="meta", registry=registry))


def parameters_of(model: GPT) -> int:
    return sum(p.numel() for p in model.parameters())


def active_parameters(recipe: Recipe, registry: Registry) -> int:
    """Parameters one token of the recipe's model uses (its components' ``active_parameters``; all of a
    component's that declares none)."""
    return active_parameters_of(build_model(recipe, device="meta", registry=registry))


def active_parameters_of(model: GPT) -> int:
    from gptzoo.model.summary import parameter_counts

    return int(parameter_counts(model)["active"])


def train_flops(recipe: Recipe, registry: Registry) -> float:
    """Training FLOPs per token at the recipe's training length (gptzoo.flops' convention)."""
    return train_flops_per_token(build_model(recipe, device="meta", registry=registry), seq_len_of(recipe))


MEASURES = {"params": parameters, "active_params": active_parameters, "flops": train_flops}


def _value(recipe: Recipe, key: str) -> Any:
    return recipe.to_dict()["model"].get(key.removeprefix("model."))


def match_variant(recipe: Recipe, reference: Recipe, by: str, key: str, multiple: int, registry: Registry) -> Recipe:
    """``recipe`` with ``key`` set to the multiple of ``multiple`` whose model comes closest to
    ``reference``'s by ``by`` ("params", "active_params" or "flops"), which must grow with the key.

    Raises:
        GptzooError: the key is not an integer of the recipe, or no value comes within 1%.
    """
    measure = MEASURES[by]
    if not isinstance(_value(recipe, key), int) or isinstance(_value(recipe, key), bool):
        raise GptzooError(f"match.key {key} is not an integer key of the recipe's [model]; match by model.d_ff")
    target = measure(reference, registry)

    def at(steps: int) -> float:
        try:
            return measure(override_recipe(recipe, [f"{key}={steps * multiple}"], registry=registry), registry)
        except RecipeError as exc:
            raise GptzooError(f"{key}={steps * multiple} does not build: {exc.problems[0]}") from None

    lo, hi = 1, 1
    while at(hi) < target:
        lo, hi = hi, hi * 2
        if hi * multiple > LARGEST:
            raise GptzooError(f"no {key} up to {LARGEST:,} reaches the base's {by} ({target:,.0f})")
    while hi - lo > 1:  # at(lo) < target <= at(hi), or lo == hi == 1
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) < target else (lo, mid)
    best = min((lo, hi), key=lambda s: abs(at(s) - target))
    reached = at(best)
    if abs(reached - target) > TOLERANCE * target:
        raise GptzooError(
            f"matching {by}: the closest {key} = {best * multiple} gives {reached:,.0f}, "
            f"{100 * (reached / target - 1):+.1f}% off the base's {target:,.0f} (more than 1%); "
            "use a finer match.multiple"
        )
    return override_recipe(recipe, [f"{key}={best * multiple}"], registry=registry)
