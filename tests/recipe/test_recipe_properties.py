"""Recipe loading under generated input (hypothesis): valid recipes build and round-trip through TOML;
anything else (wrong types, unknown keys, odd Unicode, huge or non-finite numbers, nested --set
values, arbitrary bytes) is a gptzoo error whose message names each problem's key path.

Components come from the registry and its contracts, never from a list of built-in names.
Examples are bounded and derandomized (the profile below) so CI is fast and reproducible.
"""

from __future__ import annotations

import inspect
import math
import os
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import gptzoo
from gptzoo.defaults import TRAIN_PRECISIONS
from gptzoo.errors import GptzooError, RecipeError
from gptzoo.hookspecs import CONTRACTS
from gptzoo.model.summary import parameter_counts
from gptzoo.recipe import apply_overrides, load_recipe, read_recipe_data, resolve_recipe_path, validate
from gptzoo.recipe.schema import (
    COMPONENT_KEYS,
    NORM_PLACEMENTS,
    ON_NONFINITE,
    PARALLELISMS,
    SECTIONS,
    TOP_LEVEL_KEYS,
    Component,
)
from gptzoo.recipe.validate import key_text, show
from gptzoo.tokenizer import TOKENIZER_NAMES

settings.register_profile(
    "gptzoo-recipe",
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PROFILE = settings.get_profile("gptzoo-recipe")
INT64_MAX = 2**63 - 1

# --- text and numbers ----------------------------------------------------------------------------

SURROGATE = st.integers(0xD800, 0xDFFF).map(chr)
ODD_CHARS = st.sampled_from(["\x00", "\x7f", "\u200f", "\u202e", "\ufeff", "\u2028", "😀", "é", "名", "\t", "\n", '"'])
TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]) | ODD_CHARS, max_size=12)
"""Valid Unicode text (no lone surrogates), odd characters included."""
BAD_TEXT = st.builds(lambda a, s, b: a + s + b, TEXT, SURROGATE, TEXT)
"""Text that is not valid Unicode: a lone surrogate somewhere."""
ANY_TEXT = TEXT | BAD_TEXT
HUGE_INTS = st.sampled_from([2**63, -(2**63) - 1, 10**30, -(10**30), 10**400, -(10**400)])
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
DATES = st.dates() | st.datetimes() | st.times()
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | HUGE_INTS
    | st.floats()
    | ANY_TEXT
    | DATES
    | st.binary(max_size=4)
    | st.just(Component("x"))
)
ANY_DATA = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT | st.integers(), inner, max_size=3),
    max_leaves=8,
)


def gptzoo_errors_only(call: Callable[[], Any]) -> Any:
    """call() or None when it raised a GptzooError; any other exception fails the test."""
    try:
        return call()
    except GptzooError as exc:
        assert str(exc), "a gptzoo error without a message"
        return None


# --- valid recipes -------------------------------------------------------------------------------


def recipe_params(factory: Callable[..., Any], given_by_model: frozenset[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Parameters the recipe may set: bools either way, numbers scaled from the default toward 0
    (every component's default is valid; half to all of it stays valid for the shipped ones)."""
    options: dict[str, st.SearchStrategy[Any]] = {}
    for p in inspect.signature(factory).parameters.values():
        if p.name in given_by_model or p.kind not in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
            continue
        if isinstance(p.default, bool):
            options[p.name] = st.booleans()
        elif isinstance(p.default, int):
            options[p.name] = st.integers(1, max(p.default, 1))
        elif isinstance(p.default, float):
            options[p.name] = st.floats(0.5, 1.0).map(lambda f, d=p.default: f * d)
    return st.fixed_dictionaries({}, optional=options)


@st.composite
def component(draw: st.DrawFn, registry: gptzoo.Registry, kind: str, names: list[str] | None = None) -> Any:
    name = draw(st.sampled_from(names or registry.names(kind)))
    params = draw(recipe_params(registry.get(kind, name).factory, CONTRACTS[kind].given_by_model))
    return {"name": name, **params} if params or draw(st.booleans()) else name


@st.composite
def valid_recipes(draw: st.DrawFn, registry: gptzoo.Registry) -> dict[str, Any]:
    """Recipe data with consistent, small dimensions: every head dimension and width even, so any
    registered position fits; optional keys and sections drawn or left to their defaults."""
    n_head = draw(st.integers(1, 4))
    head_dim = 2 * draw(st.integers(1, 4))
    explicit_head_dim = draw(st.booleans())
    n_embd = 2 * draw(st.integers(1, 12)) if explicit_head_dim else n_head * head_dim
    context = draw(st.integers(1, 24))
    model: dict[str, Any] = {
        "vocab_size": draw(st.integers(1, 64)),
        "context_length": context,
        "n_layer": draw(st.integers(1, 2)),
        "n_head": n_head,
        "n_embd": n_embd,
        "d_ff": draw(st.integers(1, 24)),
        "bias": draw(st.booleans()),
        "tie_embeddings": draw(st.booleans()),
        **{key: draw(component(registry, CONTRACTS[key].kind)) for key in COMPONENT_KEYS},
    }
    model |= draw(
        st.fixed_dictionaries(
            {},
            optional={
                "norm_placement": st.sampled_from(NORM_PLACEMENTS),
                "n_kv_head": st.sampled_from([0, *(d for d in range(1, n_head + 1) if n_head % d == 0)]),
                "init_std": st.floats(1e-4, 1.0),
            },
        )
    )
    if explicit_head_dim:
        model["head_dim"] = head_dim
    lr = draw(st.floats(0, 1))
    unit = st.floats(0, 1, exclude_max=True)
    count = st.integers(1, INT64_MAX)
    train = st.fixed_dictionaries(
        {"lr": st.just(lr), "min_lr": st.floats(0, lr)},
        optional={
            "max_steps": count,
            "micro_batch_size": count,
            "grad_accum": count,
            "seq_len": st.integers(0, context),
            "warmup_steps": st.integers(0, INT64_MAX),
            "beta1": unit,
            "beta2": unit,
            "eps": st.floats(0, 1e300, exclude_min=True),  # AdamW divides by it
            "weight_decay": st.floats(0, 10),
            "grad_clip": st.floats(0, 1e6),
            "precision": st.sampled_from(TRAIN_PRECISIONS),
            "compile": st.booleans(),
            "eval_every": st.integers(0, INT64_MAX),
            "eval_batches": count,
            "checkpoint_every": st.integers(0, INT64_MAX),
            "keep_checkpoints": count,
            "log_every": count,
            "seed": st.integers(0, INT64_MAX),
            "on_nonfinite": st.sampled_from(ON_NONFINITE),
            "parallel": st.sampled_from(PARALLELISMS),
            "peak_tflops": st.floats(0, 1e4),
            "data": TEXT.filter(lambda s: "\x00" not in s),
        },
    )
    samplers = registry.names("sampler")
    picking = [n for n in samplers if getattr(registry.get("sampler", n).factory, "picks", False)]
    chain = st.lists(component(registry, "sampler", [n for n in samplers if n not in picking]), max_size=3)
    last = st.lists(component(registry, "sampler", picking), max_size=1) if picking else st.just([])
    generate = st.fixed_dictionaries(
        {},
        optional={
            "samplers": st.builds(lambda a, b: a + b, chain, last),
            "max_new_tokens": st.integers(1, 2**31 - 1),
            "stop": st.lists(TEXT.filter(bool), max_size=2),
        },
    )
    return draw(
        st.fixed_dictionaries(
            {"model": st.just(model)},
            optional={
                "description": TEXT,
                "tokenizer": st.fixed_dictionaries({"name": st.sampled_from(TOKENIZER_NAMES)}),
                "weights": st.fixed_dictionaries({"hf": TEXT.filter(lambda s: s and "\x00" not in s)}),
                "generate": generate,
                "train": train,
            },
        )
    )


@settings(PROFILE, max_examples=100)
@given(data=st.data())
def test_valid_recipes_build_on_meta_and_round_trip(
    data: st.DataObject, registry: gptzoo.Registry, tmp_path: Path
) -> None:
    recipe_data = data.draw(valid_recipes(registry))
    try:
        recipe = validate(recipe_data, "generated", name="generated", registry=registry)
    except RecipeError as exc:  # a component's own check may refuse some parameter values (rope's odd rotary part)
        assume(not all(re.match(r"\[model\] \w+ \(\w+\): ", p) for p in exc.problems))
        raise
    model = gptzoo.build_model(recipe, device="meta", registry=registry)
    spec = recipe.model
    assert len(model.blocks) == spec.n_layer == recipe_data["model"]["n_layer"]
    assert parameter_counts(model)["total"] >= spec.vocab_size * spec.n_embd > 0
    path = tmp_path / "written.toml"
    path.write_text(recipe.to_toml(), encoding="utf-8")
    again = load_recipe(path, registry=registry)
    if recipe.train.data:  # a path in a recipe file is relative to that file
        recipe = replace(recipe, train=replace(recipe.train, data=os.path.join(tmp_path, recipe.train.data)))
    assert replace(again, name=recipe.name, source=recipe.source) == recipe
    assert validate(read_recipe_data(path), "again", name="generated", registry=registry) == replace(
        recipe, source="again"
    )


# --- invalid recipes: each problem names its key path --------------------------------------------


def bad_value(expected: Any) -> st.SearchStrategy[Any]:
    """Values that no key of this type accepts (every recipe number is >= 0 and fits in int64)."""
    wrong_type = (
        st.none() | DATES | st.lists(st.integers(), max_size=2) | st.dictionaries(TEXT, st.integers(), max_size=2)
    )
    if expected is int:
        return (
            st.integers(max_value=-1)
            | HUGE_INTS.filter(lambda n: not 0 <= n <= INT64_MAX)
            | st.floats()
            | ANY_TEXT
            | st.booleans()
            | wrong_type
        )
    if expected is float:
        return (
            NON_FINITE
            | st.floats(max_value=-1e-300)
            | st.sampled_from([10**400, -1])
            | ANY_TEXT
            | st.booleans()
            | wrong_type
        )
    if expected is bool:
        return st.integers() | st.floats() | ANY_TEXT | wrong_type
    if expected is str:
        return BAD_TEXT | st.integers() | NON_FINITE | st.booleans() | wrong_type
    raise AssertionError(expected)


@st.composite
def bad_component(draw: st.DrawFn, registry: gptzoo.Registry, kind: str) -> Any:
    names = registry.names(kind)
    name = draw(st.sampled_from(names))
    factory = registry.get(kind, name).factory
    floats = [
        p.name
        for p in inspect.signature(factory).parameters.values()
        if isinstance(p.default, float) and p.name not in CONTRACTS[kind].given_by_model
    ]
    choices = [
        ANY_TEXT.filter(lambda s: s not in names),
        BAD_TEXT.map(lambda s: {"name": s}),
        st.integers() | NON_FINITE | st.booleans() | st.lists(st.just(name), max_size=2),
        st.dictionaries(st.sampled_from(["nam", "Name", ""]), st.just(name), min_size=1),
        TEXT.filter(lambda s: s not in inspect.signature(factory).parameters).map(lambda p: {"name": name, p: 1.0}),
        BAD_TEXT.map(lambda p: {"name": name, p: 1.0}),
    ]
    if floats:
        beyond_floats = st.sampled_from([10**400, -(10**400)])
        choices.append(
            st.builds(lambda p, v: {"name": name, p: v}, st.sampled_from(floats), NON_FINITE | beyond_floats)
        )
    return draw(st.one_of(choices))


def names_path(problem: str, section: str | None, key: str) -> bool:
    """Whether a problem names [section] key (or the top-level key) as its place: at its start, as a
    key path writes it, or quoted after the section (``[model] unknown key 'x'``)."""
    head = f"[{section}] " if section else ""
    place = head + key_text(key)
    if problem.startswith(place) and problem[len(place) :][:1] in ("", "=", " ", ":", ".", "["):
        return True
    if section is None and problem.startswith(f"[{key_text(key)}] "):  # within an unknown top-level table
        return True
    return problem.startswith(head) and show(key) in problem


@st.composite
def mutated_recipes(draw: st.DrawFn, registry: gptzoo.Registry) -> tuple[dict[str, Any], str | None, str | None]:
    """A valid recipe with one key (or a whole section) given a value no recipe accepts, or an unknown
    key added: (data, section or None for the top level, key or None for the whole section)."""
    data = draw(valid_recipes(registry))
    section = draw(st.sampled_from([None, *SECTIONS]))
    if section is None:
        key = draw(st.sampled_from(["description", "unknown"]))
        if key == "unknown":
            key = draw(ANY_TEXT.filter(lambda k: k not in SECTIONS and k not in TOP_LEVEL_KEYS))
            data[key] = draw(ANY_DATA)
        else:
            data[key] = draw(bad_value(str))
        return data, None, key
    table = data.setdefault(section, {})
    if section == "generate":
        known = {"samplers": list, "max_new_tokens": int, "stop": list}
    else:
        known = get_type_hints(SECTIONS[section])
    key = draw(st.sampled_from([*known, "(unknown)", "(table)"]))
    if key == "(table)":
        data[section] = draw(st.integers() | ANY_TEXT | st.lists(st.integers(), max_size=2))
        return data, section, None
    if key == "(unknown)":
        key = draw(ANY_TEXT.filter(lambda k: k not in known))
        table[key] = draw(ANY_DATA)
    elif known[key] is Component:
        table[key] = draw(bad_component(registry, key))
    elif key == "samplers":
        table[key] = draw(
            st.integers() | ANY_TEXT | st.lists(bad_component(registry, "sampler"), min_size=1, max_size=2)
        )
    elif key in ("stop", "layer_pattern"):
        table[key] = draw(st.integers() | st.lists(st.just("") | BAD_TEXT | st.integers(), min_size=1, max_size=2))
    elif key == "layer_types":
        table[key] = draw(st.integers() | ANY_TEXT | st.lists(st.integers(), min_size=1, max_size=2))
    elif section == "tokenizer":
        table[key] = draw(ANY_TEXT.filter(lambda s: s not in TOKENIZER_NAMES) | bad_value(str))
    else:
        table[key] = draw(bad_value(known[key]))
    return data, section, key


@settings(PROFILE, max_examples=300)
@given(data=st.data())
def test_invalid_recipes_name_each_problem_s_key_path(data: st.DataObject, registry: gptzoo.Registry) -> None:
    recipe_data, section, key = data.draw(mutated_recipes(registry))
    with pytest.raises(RecipeError) as info:
        validate(recipe_data, "mutated", name="mutated", registry=registry)
    problems = info.value.problems
    assert problems and all(p and "\n" not in p for p in problems)
    if key is None:
        assert any(p.startswith(f"[{section}] must be a table") or names_path(p, None, section) for p in problems)
    else:
        assert any(names_path(p, section, key) for p in problems), problems


# --- nothing but gptzoo errors --------------------------------------------------------------------


@settings(PROFILE, max_examples=200)
@given(top=ANY_DATA, section=st.sampled_from([*SECTIONS, *TOP_LEVEL_KEYS]), data=st.data())
def test_any_data_is_a_recipe_or_a_recipe_error(
    top: Any, section: str, data: st.DataObject, registry: gptzoo.Registry
) -> None:
    gptzoo_errors_only(lambda: validate(top, "any", name="any", registry=registry))
    recipe_data = data.draw(valid_recipes(registry))
    recipe_data[section] = top
    gptzoo_errors_only(lambda: validate(recipe_data, "any", name="any", registry=registry))
    table = recipe_data.setdefault("model", {})
    if isinstance(table, dict):
        table[data.draw(st.sampled_from([*COMPONENT_KEYS, "n_layer", "init_std"]))] = data.draw(ANY_DATA)
        gptzoo_errors_only(lambda: validate(recipe_data, "any", name="any", registry=registry))


HOSTILE_OVERRIDES = [
    "model.norm.eps=nan",
    "model.norm.eps=inf",
    "model.norm.eps=-inf",
    'model.norm={ name = "x" }',
    "model.norm={ name = 1 }",
    "train.x.y=1",
    "train.lr.x=1",
    "model.n_layer.x=1",
    "a.b.c.d=1",
    "=",
    "model.=1",
    ".=",
    "model.n_layer=",
    f"model.n_layer={2**63}",
    f"model.n_layer={-(2**63)}",
    f"model.n_layer={'9' * 5000}",
    f"model.n_layer={'[' * 3000}",
    "model.n_layer=" + "[" * 500 + "]" * 500,
    "model.init_std=" + str(10**400),
    "model.init_std=1e400",
    "train.lr=" + str(10**400),
    "train.seed=" + str(2**64),
    "train.max_steps=" + str(10**30),
    "generate.max_new_tokens=" + str(2**63),
    'generate.samplers=[{ name = "top_k", k = ' + str(10**30) + " }]",
    'generate.samplers=[{ name = "temperature", temperature = ' + str(10**400) + " }]",
    'generate.samplers=[{ name = "temperature", temperature = nan }]',
    "generate.stop=[1979-05-27]",
    "model.norm.eps=1979-05-27T07:32:00Z",
    "model.\ud800=1",
    "model.norm=\udcff",
    "model.norm.\udcff=1",
    "\udcff.x=1",
    "description.x=1",
    "tokenizer.name=gtp2",
    "weights.hf=",
    'weights.hf="a\\u0000b"',
    "model.n_layer=6\nv = 7",
    "model.n_layer=6\n[train]\nlr = 1",
]


@settings(PROFILE, max_examples=200)
@given(
    overrides=st.lists(
        st.sampled_from(HOSTILE_OVERRIDES)
        | st.text(alphabet=st.characters() | SURROGATE | st.sampled_from(".=[]{}\"'"), max_size=20)
        | st.builds(
            "{}.{}={}".format,
            st.sampled_from([*SECTIONS, *TOP_LEVEL_KEYS]) | ANY_TEXT,
            st.sampled_from([*COMPONENT_KEYS, "n_layer", "lr", "name", "hf", "samplers"]) | ANY_TEXT,
            ANY_TEXT
            | st.integers().map(str)
            | HUGE_INTS.map(str)
            | st.sampled_from(["nan", "inf", "-inf", "{}", "[]"]),
        ),
        max_size=3,
    )
)
def test_any_overrides_are_a_recipe_or_a_recipe_error(overrides: list[str], registry: gptzoo.Registry) -> None:
    base = read_recipe_data(resolve_recipe_path("gpt2-tiny"))
    data, problems = apply_overrides(base, overrides)
    gptzoo_errors_only(lambda: validate(data, "tiny", name="tiny", registry=registry, problems=problems))


TOML_TEXTS = [
    "[model]\nn_layer = " + "1" * 5000,
    "v = " + "[" * 3000 + "]" * 3000,
    "v = " + "{a=" * 2000 + "1" + "}" * 2000,
    "a." * 3000 + "b = 1",
    'extends = "gpt2-tiny"\n[model]\n' + "norm." * 500 + "eps = 1",
    'description = "\\ud800"',
    'description = "\\U0001F600\\u200f\\u0000"',
    'extends = ["gpt2-tiny"]',
    "extends = 1",
    'extends = ""',
    'extends = "."',
    'extends = "/dev/null"',
    'extends = "a\\u0000b"',
    "extends = 1979-05-27",
]


@settings(PROFILE, max_examples=200)
@given(
    content=st.binary(max_size=64)
    | st.sampled_from(TOML_TEXTS).map(str.encode)
    | st.text(alphabet=st.sampled_from("[]{}=\"'.,#\n \\abcdefilnrstu0123456789-+_:TZ"), max_size=60).map(
        lambda t: ('extends = "gpt2-tiny"\n' + t).encode()
    )
)
def test_any_file_is_a_recipe_or_a_recipe_error(content: bytes, registry: gptzoo.Registry, tmp_path: Path) -> None:
    path = tmp_path / "any.toml"
    path.write_bytes(content)
    gptzoo_errors_only(lambda: load_recipe(path, registry=registry))
    gptzoo_errors_only(lambda: read_recipe_data(path))


def test_hostile_examples_are_refused_with_their_key_path(registry: gptzoo.Registry) -> None:
    """Spot checks of what the properties above allow in general (exact messages: tests/recipe/test_recipe.py)."""
    base = read_recipe_data(resolve_recipe_path("gpt2-tiny"))
    for override, place in [
        ("model.norm=x\udcffy", "[model] norm: "),
        ("model.norm.eps=nan", "[model] norm.eps "),
        ("model.init_std=" + str(10**400), "[model] init_std="),
        ("train.seed=" + str(2**64), "[train] seed="),
        ("generate.max_new_tokens=" + str(2**63), "[generate] max_new_tokens "),
        ("tokenizer.name=gtp2", "[tokenizer] name: "),
    ]:
        data, problems = apply_overrides(base, [override])
        with pytest.raises(RecipeError) as info:
            validate(data, "tiny", name="tiny", registry=registry, problems=problems)
        assert [p[: len(place)] for p in info.value.problems] == [place], (override, info.value.problems)
