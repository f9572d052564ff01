"""Finding and reading recipes: a shipped name or a path -> TOML data, ``extends`` merged and
``--set`` overrides applied; then gptzoo.recipe.validate makes it a Recipe.

``extends = "NAME_OR_PATH"`` inherits from another recipe: each section's keys override the
parent's (a component value is replaced whole). Overrides ``model.n_layer=6`` apply last; their
values are parsed as TOML, falling back to a bare string (``model.norm=rmsnorm``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gptzoo.errors import RecipeError, did_you_mean
from gptzoo.recipe.schema import SECTIONS, Recipe
from gptzoo.recipe.validate import validate
from gptzoo.registry import Registry


def recipes_dir() -> Path:
    """The directory of shipped recipes, gptzoo/zoo/."""
    return Path(__file__).resolve().parent.parent / "zoo"


def shipped_recipes() -> dict[str, Path]:
    return {p.stem: p for p in sorted(recipes_dir().glob("*.toml"))}


def resolve_recipe_path(name_or_path: str | Path, *, relative_to: Path | None = None) -> Path:
    """A recipe file: an existing path (relative to ``relative_to`` if given), or a shipped name."""
    text = str(name_or_path)
    candidate = Path(text).expanduser()
    if relative_to is not None and not candidate.is_absolute():
        candidate = relative_to / candidate
    if candidate.is_file():
        return candidate.resolve()
    if candidate.is_dir():
        raise RecipeError(text, [f"{str(candidate)!r} is a directory, not a recipe file"])
    shipped = shipped_recipes()
    if text in shipped:
        return shipped[text]
    if text.endswith(".toml") or "/" in text or "\\" in text:
        raise RecipeError(text, [f"no such recipe file {str(candidate)!r}"])
    raise RecipeError(text, [f"unknown recipe {text!r}{did_you_mean(text, list(shipped))}"])


def read_recipe_data(path: Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The TOML of ``path`` merged over everything it extends (without the ``extends`` key)."""
    if path in _chain:
        cycle = " -> ".join(p.name for p in (*_chain, path))
        raise RecipeError(str(_chain[0]), [f"extends cycle: {cycle}"])
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RecipeError(str(path), [f"invalid TOML: {exc}"]) from None
    except OSError as exc:
        raise RecipeError(str(path), [f"cannot read: {exc.strerror}"]) from None
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise RecipeError(str(path), [f"extends must be a recipe name or path, got {parent!r}"])
    try:
        parent_path = resolve_recipe_path(parent, relative_to=path.parent)
    except RecipeError as exc:
        raise RecipeError(str(path), [f"extends = {parent!r}: {problem}" for problem in exc.problems]) from None
    base = read_recipe_data(parent_path, (*_chain, path))
    base.pop("weights", None)
    return merge(base, data)


def merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """Child over base, section by section; values (components included) are replaced whole."""
    merged = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key in SECTIONS:
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def parse_override(text: str) -> tuple[list[str], Any]:
    """'model.n_layer=6' -> (['model', 'n_layer'], 6); values are TOML, else a bare string.

    Raises ValueError with the problem for anything that is not SECTION.KEY[.PARAM]=VALUE.
    """
    key, sep, value = text.partition("=")
    path = [part.strip() for part in key.split(".")]
    if not sep or not 2 <= len(path) <= 3 or not all(path):
        raise ValueError(f"--set {text!r} is not SECTION.KEY=VALUE or SECTION.KEY.PARAM=VALUE (e.g. model.n_layer=6)")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return path, parsed


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """The data with every override applied, and the problems of those that could not be."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    problems = []
    for text in overrides:
        try:
            path, value = parse_override(text)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        section = data.setdefault(path[0], {})
        if not isinstance(section, dict):
            problems.append(f"--set {text!r}: {path[0]!r} is not a section")
        elif len(path) == 2:
            section[path[1]] = value
        else:  # a component parameter: model.norm.eps=1e-6
            current = section.get(path[1])
            component = dict(current) if isinstance(current, dict) else {"name": current}
            component[path[2]] = value
            section[path[1]] = component
    return data, problems


def load_recipe(name_or_path: str | Path, overrides: Iterable[str] = (), *, registry: Registry | None = None) -> Recipe:
    """Load, merge (extends), override and validate a recipe by shipped name or file path."""
    path = resolve_recipe_path(name_or_path)
    data, problems = apply_overrides(read_recipe_data(path), overrides)
    return validate(data, str(path), name=path.stem, registry=registry, problems=problems)
