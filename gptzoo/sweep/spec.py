"""A sweep spec (TOML): a base recipe, the data, a budget, the variants and the seeds; read and checked
whole, every problem reported at once, before anything runs.

```toml
description = "Pre-LN vs Post-LN"
base = "shakespeare-bytes"          # a shipped recipe or a file (relative to the spec)
set = ["model.n_layer=2"]           # --set overrides every variant starts from (optional)
seeds = [0, 1]                      # each variant trains once per seed (train.seed)
target_loss = 2.0                   # optional: the steps each run takes to reach this val loss

[data]                              # prepared data, or a source `gptzoo prepare` reads into SWEEP/data
prepare = "shakespeare"             # (or: path = "data/shakespeare-bytes")
tokenizer = "bytes"

[budget]                            # exactly one: steps, tokens (per run) or flops (training FLOPs per run)
steps = 300

[[variants]]                        # a named set of overrides ...
name = "post"
set = ["model.norm_placement=post"]
match = "params"                    # optional: "params", "active_params" or "flops", matched by [match] key

[grid]                              # ... and/or a grid: every combination (crossed with [[variants]])
"train.lr" = [1e-3, 3e-3]

[match]                             # optional: how a variant is matched (default model.d_ff, any multiple)
key = "model.d_ff"
multiple = 1

[eval]                              # optional: evaluate each final checkpoint on the data's val split
lengths = [128, 256, 512]
max_tokens = 20000                  # its first tokens scored (default EVAL_TOKENS, 16,384)
```
"""

from __future__ import annotations

import itertools
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptzoo.errors import GptzooError, RecipeError, did_you_mean
from gptzoo.recipe import Recipe, load_recipe, override_recipe, resolve_recipe_path
from gptzoo.recipe.schema import toml_value
from gptzoo.registry import Registry, default_registry
from gptzoo.sweep.names import BUDGETS, shipped_sweeps

MATCHES = ("params", "active_params", "flops")
EVAL_TOKENS = 16384
"""The tokens of the val split a run is scored on when [eval] max_tokens is not given: a few seconds a run on
two cores for a byte-level model, where the whole split of a prepared corpus (500k tokens for Shakespeare)
took minutes a run; every shipped sweep sets this number."""
TOP_KEYS = ("description", "base", "set", "seeds", "target_loss", "data", "budget", "variants", "grid", "match", "eval")
DATA_KEYS = ("path", "prepare", "tokenizer", "val_fraction")
VARIANT_KEYS = ("name", "set", "match")
MATCH_KEYS = ("key", "multiple")
EVAL_KEYS = ("lengths", "max_tokens", "stride")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=,+-]{0,99}")
"""A variant's name is its run directory's: letters, digits and . _ = , + - (at most 100)."""
MAX_RUNS = 10_000


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...]
    """The spec's ``set``, then the variant's own (and its grid point's)."""
    match: str | None = None


@dataclass(frozen=True)
class SweepSpec:
    name: str
    source: str
    """The spec file."""
    base: str
    """The base recipe's file."""
    overrides: tuple[str, ...]
    seeds: tuple[int, ...]
    budget: tuple[str, float]
    """("steps" | "tokens" | "flops", amount)."""
    variants: tuple[Variant, ...]
    data_path: str | None = None
    prepare: str | None = None
    tokenizer: str | None = None
    val_fraction: float | None = None
    match_key: str = "model.d_ff"
    match_multiple: int = 1
    eval_lengths: tuple[int, ...] = ()
    eval_max_tokens: int | None = EVAL_TOKENS
    eval_stride: int | None = None
    target_loss: float | None = None
    description: str = ""
    recipes: dict[str, Recipe] = field(default_factory=dict, compare=False)
    """Each variant's resolved recipe (matched, budget not yet applied), by variant name."""

    def identity(self) -> dict[str, Any]:
        """What decides the runs' results: a resumed sweep must have the same."""
        return {
            "overrides": list(self.overrides),
            "seeds": list(self.seeds),
            "budget": list(self.budget),
            "variants": [[v.name, list(v.overrides), v.match] for v in self.variants],
            "match": [self.match_key, self.match_multiple],
            "data": [self.data_path, self.prepare, self.tokenizer, self.val_fraction],
            "eval": [list(self.eval_lengths), self.eval_max_tokens, self.eval_stride],
            "recipes": {name: _content(recipe) for name, recipe in self.recipes.items()},
        }


def _content(recipe: Recipe) -> dict[str, Any]:
    """What a recipe decides, without where it came from (its file, the plugins' versions)."""
    data = recipe.to_dict()
    data.pop("provenance", None)
    return data


def _shown(value: Any) -> str:
    """A grid value in a variant's name."""
    if isinstance(value, dict):
        return str(value.get("name", "table"))
    return value if isinstance(value, str) else toml_value(value)


def find_spec(name_or_path: str | Path, registry: Registry | None = None) -> Path:
    """A spec file: an existing path, the name of a shipped sweep (recipes/sweeps/NAME.toml), or of one a
    plugin registers (``registry``'s, by default the default registry's: ``register_recipes``).

    Raises:
        GptzooError: none of them.
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = shipped_sweeps()
    if str(name_or_path) in shipped:
        return shipped[str(name_or_path)]
    if path.exists():
        raise GptzooError(f"{path} is not a sweep spec file; give a .toml file or a shipped sweep")
    registry = registry if registry is not None else default_registry()
    found = registry.recipe(str(name_or_path), sweep=True)
    if found is not None:
        return found.path
    known = [*shipped, *(r.qualified_name for r in registry.recipes if r.sweep)]
    raise GptzooError(
        f"no sweep spec {str(name_or_path)!r}: no such file, nor a shipped or a plugin's sweep"
        f"{did_you_mean(str(name_or_path), known)}"
    )


def _strings(value: Any, where: str, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f'{where} must be a list of --set overrides (strings such as "model.n_layer=2")')
        return ()
    return tuple(value)


def _unknown(table: dict[str, Any], allowed: tuple[str, ...], where: str, problems: list[str]) -> None:
    for key in table:
        if key not in allowed:
            problems.append(f"unknown key {where + key!r}{did_you_mean(key, list(allowed))}")


def _positive_int(value: Any, where: str, problems: list[str], low: int = 1) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        problems.append(f"{where} must be an integer >= {low}, not {value!r}")
        return None
    return value


def _table(data: dict[str, Any], key: str, problems: list[str]) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        problems.append(f"[{key}] must be a table")
        return {}
    return value


def _variants(data: dict[str, Any], common: tuple[str, ...], problems: list[str]) -> list[Variant]:
    named: list[Variant] = []
    raw = data.get("variants", [])
    if not isinstance(raw, list) or not all(isinstance(v, dict) for v in raw):
        problems.append("variants must be [[variants]] tables (name, set, match)")
        raw = []
    for i, v in enumerate(raw):
        where = f"variants[{i}]"
        _unknown(v, VARIANT_KEYS, f"{where}.", problems)
        name = v.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            problems.append(f"{where}.name must be a name of letters, digits and . _ = , + - (it names a directory)")
            continue
        match = v.get("match")
        if match is not None and match not in MATCHES:
            problems.append(f"variant {name!r}: match must be one of {', '.join(MATCHES)}, not {match!r}")
            match = None
        named.append(Variant(name, _strings(v.get("set", []), f"variant {name!r}: set", problems), match))
    grid = _table(data, "grid", problems)
    points: list[tuple[str, tuple[str, ...]]] = [("", ())]
    if grid:
        axes = []
        for key, values in grid.items():
            if isinstance(values, dict):
                problems.append(f'grid key {key!r} is a table: quote a dotted key, e.g. "train.lr" = [1e-3, 3e-3]')
                continue
            if not isinstance(values, list) or not values:
                problems.append(f"grid key {key!r} must list its values, e.g. [1e-3, 3e-3]")
                continue
            try:
                axes.append([(f"{key.rsplit('.', 1)[-1]}={_shown(v)}", f"{key}={toml_value(v)}") for v in values])
            except TypeError as exc:
                problems.append(f"grid key {key!r}: {exc} (give numbers, strings, booleans, arrays or tables)")
        points = [
            (",".join(n for n, _ in combo), tuple(o for _, o in combo)) for combo in itertools.product(*axes)
        ] or points
    if not named and not grid:
        problems.append("a sweep needs [[variants]] or a [grid] (or both: every variant at every grid point)")
        return []
    variants = []
    for v in named or [Variant("", ())]:
        for point, overrides in points:
            name = "+".join(n for n in (v.name, point) if n)
            variants.append(Variant(name, (*common, *v.overrides, *overrides), v.match))
    seen: set[str] = set()
    for v in variants:
        if v.name in seen:
            problems.append(f"two variants are named {v.name!r}; give each its own name")
        seen.add(v.name)
        if not NAME.fullmatch(v.name):
            problems.append(f"variant name {v.name!r} is not a directory name (letters, digits, . _ = , + -)")
    return variants


def _budget(data: dict[str, Any], problems: list[str]) -> tuple[str, float]:
    table = _table(data, "budget", problems)
    _unknown(table, BUDGETS, "budget.", problems)
    given = [(k, v) for k, v in table.items() if k in BUDGETS]
    if len(given) != 1:
        problems.append("[budget] needs exactly one of steps, tokens or flops")
        return ("steps", 0)
    kind, amount = given[0]
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount <= 0:
        problems.append(f"budget.{kind} must be a positive number, not {amount!r}")
    elif kind != "flops" and not isinstance(amount, int):
        problems.append(f"budget.{kind} must be a whole number, not {amount!r}")
    return kind, amount


def _data(data: dict[str, Any], folder: Path, problems: list[str]) -> tuple[str | None, str | None, str | None, Any]:
    """(prepared data path, a source to prepare, its tokenizer, val_fraction), checked as far as can be without
    reading the data: the source names a corpus or a path, the tokenizer is one `gptzoo prepare` knows."""
    from gptzoo.training.data import corpus_reader

    table = _table(data, "data", problems)
    _unknown(table, DATA_KEYS, "data.", problems)
    if ("path" in table) == ("prepare" in table):
        problems.append("[data] needs path (prepared data) or prepare (a source for `gptzoo prepare`), one of them")
    found: dict[str, str | None] = {}
    for key in ("path", "prepare", "tokenizer"):
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value or "\0" in value):
            problems.append(f"data.{key} must be a non-empty string (a name or a path)")
            value = None
        found[key] = value
    path, prepare, tokenizer = found["path"], found["prepare"], found["tokenizer"]
    if path is not None:
        path = str((folder / path).resolve())
    if prepare is not None:
        if (folder / prepare).exists():  # a file or folder beside the spec
            prepare = str((folder / prepare).resolve())
        try:
            corpus_reader(prepare)
        except GptzooError as exc:
            problems.append(f"data.prepare: {exc}")
    fraction = table.get("val_fraction")
    if fraction is not None and (
        isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 0.5
    ):
        problems.append(f"data.val_fraction must be a number in (0, 0.5], not {fraction!r}")
    return path, prepare, tokenizer, fraction


def _eval(data: dict[str, Any], problems: list[str]) -> tuple[tuple[int, ...], int | None, int | None]:
    table = _table(data, "eval", problems)
    _unknown(table, EVAL_KEYS, "eval.", problems)
    raw = table.get("lengths", [])
    if not isinstance(raw, list):
        problems.append("eval.lengths must be a list of lengths in tokens, e.g. [128, 256]")
        raw = []
    lengths = tuple(sorted({n for i, n in enumerate(raw) if _positive_int(n, f"eval.lengths[{i}]", problems)}))
    max_tokens = table.get("max_tokens", EVAL_TOKENS)
    max_tokens = _positive_int(max_tokens, "eval.max_tokens", problems, low=2)
    stride = table.get("stride")
    if stride is not None:
        stride = _positive_int(stride, "eval.stride", problems)
    if stride is not None and lengths and stride > lengths[0]:
        problems.append(f"eval.stride {stride} is longer than the length {lengths[0]}; give a stride <= every length")
    return lengths, max_tokens, stride


def read_spec(
    name_or_path: str | Path,
    *,
    registry: Registry | None = None,
    data: str | Path | None = None,
    budget: tuple[str, float] | None = None,
) -> SweepSpec:
    """The spec, with each variant's recipe resolved and matched; every problem at once. ``data`` (prepared
    data) and ``budget`` stand in for the spec's [data] and [budget] (`--data`, `--budget`).

    Raises:
        GptzooError: no such spec, or a :class:`gptzoo.errors.RecipeError` listing every problem.
    """
    from gptzoo.sweep.matching import match_variant
    from gptzoo.training.trainer import seq_len_of

    registry = registry if registry is not None else default_registry()
    path = find_spec(name_or_path, registry)
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RecipeError(str(path), [f"not valid TOML: {exc}"]) from None
    except OSError as exc:
        raise GptzooError(f"cannot read {path}: {exc.strerror}") from None
    if data is not None:
        spec["data"] = {"path": str(Path(data).resolve())}
    if budget is not None:
        spec["budget"] = {budget[0]: budget[1]}
    problems: list[str] = []
    _unknown(spec, TOP_KEYS, "", problems)
    common = _strings(spec.get("set", []), "set", problems)
    base_path: Path | None = None
    base = spec.get("base")
    if not isinstance(base, str) or not base or "\0" in base:
        problems.append('base must name the recipe every variant starts from, e.g. base = "shakespeare-bytes"')
    else:
        try:
            base_path = resolve_recipe_path(base, relative_to=path.parent if not Path(base).is_absolute() else None)
        except RecipeError as exc:
            try:
                base_path = resolve_recipe_path(base)  # a shipped name
            except RecipeError:
                problems.extend(f"base: {p}" for p in exc.problems)
    seeds_raw = spec.get("seeds", [0])
    if not isinstance(seeds_raw, list) or not seeds_raw:
        problems.append("seeds must be a list of integers, e.g. [0, 1]")
        seeds_raw = []
    seeds = tuple(s for i, s in enumerate(seeds_raw) if _positive_int(s, f"seeds[{i}]", problems, low=0) is not None)
    if len(set(seeds)) != len(seeds):
        problems.append(f"seeds repeat: {list(seeds)}")
    kind_amount = _budget(spec, problems)
    data_path, prepare, tokenizer, fraction = _data(spec, path.parent, problems)
    match_table = _table(spec, "match", problems)
    _unknown(match_table, MATCH_KEYS, "match.", problems)
    match_key = match_table.get("key", "model.d_ff")
    if not isinstance(match_key, str) or not match_key.startswith("model."):
        problems.append(f"match.key must be a [model] key such as model.d_ff, not {match_key!r}")
        match_key = "model.d_ff"
    multiple = _positive_int(match_table.get("multiple", 1), "match.multiple", problems) or 1
    lengths, max_tokens, stride = _eval(spec, problems)
    target = spec.get("target_loss")
    if target is not None and (
        isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target) or target <= 0
    ):
        problems.append(f"target_loss must be a positive number, not {target!r}")
        target = None
    description = spec.get("description", "")
    if not isinstance(description, str):
        problems.append("description must be a string")
        description = ""
    variants = _variants(spec, common, problems)
    for v in variants:
        for o in v.overrides:
            if o.partition("=")[0].strip() == "train.max_steps":
                problems.append(f"variant {v.name!r}: {o} is the budget's to set; give [budget] steps instead")
    recipes: dict[str, Recipe] = {}
    reference: Recipe | None = None
    if base_path is not None and len(variants) * max(1, len(seeds)) > MAX_RUNS:
        problems.append(f"{len(variants)} variants x {len(seeds)} seeds is more than {MAX_RUNS:,} runs")
    elif base_path is not None:
        try:
            reference = load_recipe(base_path, common, registry=registry)
        except RecipeError as exc:
            problems.extend(f"set: {p}" for p in exc.problems)
        for seed in seeds if reference is not None else ():
            try:
                override_recipe(reference, [f"train.seed={seed}"], registry=registry)
            except RecipeError as exc:
                problems.extend(f"seeds: {p}" for p in exc.problems)
        for v in variants:
            try:
                recipe = load_recipe(base_path, v.overrides, registry=registry)
            except RecipeError as exc:
                problems.extend(f"variant {v.name!r}: {p}" for p in exc.problems)
                continue
            if v.match is not None and reference is not None:
                try:
                    recipe = match_variant(recipe, reference, v.match, match_key, multiple, registry)
                except GptzooError as exc:
                    problems.append(f"variant {v.name!r}: {exc}")
                    continue
            if stride is not None and not lengths and stride > seq_len_of(recipe):
                problems.append(
                    f"variant {v.name!r}: eval.stride {stride} is longer than its training length, "
                    "the length it is evaluated at; give eval.lengths or a shorter stride"
                )
            recipes[v.name] = recipe
    if reference is not None and prepare is not None:
        tokenizer = tokenizer or (reference.tokenizer.name if reference.tokenizer is not None else "hf")
        names = {r.tokenizer.name if r.tokenizer is not None else "hf" for r in recipes.values()}
        if names - {tokenizer}:
            problems.append(
                f"the variants use the tokenizer(s) {', '.join(sorted(names))}, the data would be prepared with "
                f"{tokenizer!r}; give [data] tokenizer that every variant uses"
            )
    if problems:
        raise RecipeError(str(path), list(dict.fromkeys(problems)))
    assert base_path is not None
    return SweepSpec(
        name=path.stem,
        source=str(path),
        base=str(base_path),
        overrides=common,
        seeds=seeds,
        budget=kind_amount,
        variants=tuple(variants),
        data_path=data_path,
        prepare=prepare,
        tokenizer=tokenizer if prepare is not None else None,
        val_fraction=fraction,
        match_key=match_key,
        match_multiple=multiple,
        eval_lengths=lengths,
        eval_max_tokens=max_tokens,
        eval_stride=stride,
        target_loss=float(target) if target is not None else None,
        description=description,
        recipes=recipes,
    )
