"""Finding and reading recipes: a shipped name or a path -> TOML data, ``extends`` merged and
``--set`` overrides applied; then gptzoo.recipe.validate makes it a Recipe (imported when a recipe is loaded, so that
finding and reading recipes stays light for the command line's listings).

``extends = "NAME_OR_PATH"`` inherits from another recipe: each section's keys override the
parent's. A component value is replaced whole, unless it is a table without a name
(``position = { theta = 5e5 }``), which changes those parameters of the parent's component and keeps
its name and other parameters. Overrides ``model.n_layer=6`` apply last; a value is one TOML value,
falling back to a bare string (``model.norm=rmsnorm``); a third part sets a [model] component's
parameter (``model.norm.eps=1e-6``), and a table without a name changes parameters as in a child
recipe. A layer type's component is reached the same way below ``model.layer_types.TYPE``
(``model.layer_types.sliding.attention.window=256``). ``[model] layer_types`` is replaced whole by a
child recipe's. A problem that an override causes names that override (``--set model.norm=nope: ...``),
not the recipe file it was applied to.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gptzoo.errors import ComponentLookupError, GptzooWarning, RecipeError, did_you_mean
from gptzoo.recipe.schema import (
    COMPONENT_KEYS,
    LAYER_TYPES,
    PROVENANCE,
    SAMPLERS,
    SECTIONS,
    TOP_LEVEL_KEYS,
    Recipe,
    describe,
    merge_component,
    show,
)
from gptzoo.registry import Registry, split_name

_TOO_LONG = f"an integer of more than {sys.get_int_max_str_digits()} digits"


def recipes_dir() -> Path:
    """The directory of shipped recipes: recipes/ (installed as gptzoo_recipes)."""
    import gptzoo_recipes

    return Path(gptzoo_recipes.__file__).resolve().parent


def shipped_recipes() -> dict[str, Path]:
    return {p.stem: p for p in sorted(recipes_dir().glob("*.toml"))}


def resolve_recipe_path(
    name_or_path: str | Path, *, relative_to: Path | None = None, registry: Registry | None = None
) -> Path:
    """A recipe file: an existing path (relative to ``relative_to`` if given), a shipped name, or the
    name of one a plugin registers (``registry``'s, by default the default registry's: consulted only
    for a name that is neither a file nor shipped)."""
    text = str(name_or_path)
    if not text:
        raise RecipeError(repr(text), ["give a recipe: a shipped name (see `gptzoo recipes`) or a .toml file"])
    candidate = Path(text)
    try:
        candidate = candidate.expanduser()
    except RuntimeError:  # ~user of no such user: the path as written
        pass
    if relative_to is not None and not candidate.is_absolute():
        candidate = relative_to / candidate
    shipped = shipped_recipes()
    try:
        if candidate.is_file():
            return candidate.resolve()
        if text in shipped:  # e.g. a checkpoint directory named after the recipe it was built from
            return shipped[text]
        if candidate.is_dir():
            raise RecipeError(text, [f"{str(candidate)!r} is a directory, not a recipe file"])
        if candidate.is_symlink() and not candidate.exists():
            raise RecipeError(text, [f"{str(candidate)!r} is a symbolic link to nothing (broken, or a loop)"])
        if candidate.exists():
            raise RecipeError(text, [f"{str(candidate)!r} is not a regular file"])
    except OSError as exc:  # a name too long, a directory that may not be searched
        raise RecipeError(text, [f"cannot look at {str(candidate)!r}: {exc.strerror}"]) from None
    if text.endswith(".toml") or "/" in text or "\\" in text:
        raise RecipeError(text, [f"no such recipe file {show(str(candidate))}"])
    if registry is None:
        from gptzoo.registry import default_registry

        registry = default_registry()
    found = registry.recipe(text)
    if found is not None:
        return found.path
    known = [*shipped, *(r.name for r in registry.recipes if not r.sweep)]
    raise RecipeError(text, [f"unknown recipe {show(text)}{did_you_mean(text, known)}"])


def shadowed_recipe(name: str, registry: Registry) -> str | None:
    """The warning for a shipped recipe's name that a plugin registers too (the shipped one is used), or None."""
    others = [r for r in registry.recipes if not r.sweep and r.name == name]
    if name not in shipped_recipes() or not others:
        return None
    qualified = " or ".join(repr(r.qualified_name) for r in others)
    plugins = ", ".join(str(r.provenance) for r in others)
    return f"recipe {name!r} is the shipped one; {plugins} registers one of that name too: name it {qualified}"


def _read_toml(path: Path, real: Path | None = None) -> dict[str, Any]:
    """The TOML of the file ``path`` (read at ``real``, where symlinks lead, when given)."""
    try:
        text = (real or path).read_text(
            encoding="utf-8-sig"
        )  # a byte-order mark (some editors write one) is no content
    except UnicodeDecodeError as exc:
        raise RecipeError(str(path), [f"invalid TOML: {exc}; save it as UTF-8"]) from None
    except OSError as exc:
        raise RecipeError(str(path), [f"cannot read: {exc.strerror}"]) from None
    except ValueError as exc:  # a NUL in the path
        raise RecipeError(str(path), [f"cannot read: {exc}"]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(str(path), [f"invalid TOML: {exc}"]) from None
    except ValueError:  # tomllib wraps every other ValueError in TOMLDecodeError
        raise RecipeError(str(path), [f"invalid TOML: {_TOO_LONG}"]) from None
    except RecursionError:
        raise RecipeError(str(path), ["invalid TOML: arrays or tables nested too deeply"]) from None


def read_recipe_data(path: Path, registry: Registry | None = None) -> dict[str, Any]:
    """The TOML of ``path`` merged over everything it extends (without the ``extends`` key); each file
    of the chain that a plugin registers (``register_recipes``, in ``registry``) read as that plugin
    means it (:func:`plugins_own`).

    The chain is followed without recursion, so its length has no limit; a file met twice (by any
    path, symbolic links included) is a cycle."""
    owners = {} if registry is None else _recipe_owners(registry)
    chain: list[Path] = []
    layers: list[dict[str, Any]] = []
    while True:
        chain.append(path)
        data = _read_toml(path)
        parent = data.pop("extends", None)
        owner = owners.get(os.path.realpath(path))
        if owner is not None and registry is not None:
            data = plugins_own(data, owner, registry)
        layers.append(_paths_from(data, path))
        if parent is None:
            break
        if not isinstance(parent, str) or not parent:
            raise RecipeError(
                str(path), [f"extends must be a recipe name or path (a non-empty string), got {describe(parent)}"]
            )
        try:
            path = resolve_recipe_path(parent, relative_to=path.parent)
        except RecipeError as exc:
            raise RecipeError(str(path), [f"extends = {show(parent)}: {problem}" for problem in exc.problems]) from None
        if os.path.realpath(path) in map(os.path.realpath, chain):
            cycle = " -> ".join(p.name for p in (*chain, path))
            raise RecipeError(str(chain[0]), [f"extends cycle: {cycle}"])
    merged = layers.pop()
    for layer in reversed(layers):
        merged.pop("weights", None)
        merged.pop(PROVENANCE, None)  # where a parent's components came from says nothing of the child's
        merged = merge(merged, layer)
    return merged


def _recipe_owners(registry: Registry) -> dict[str, str]:
    """The real path of each model recipe a plugin registers -> the plugin's distribution."""
    return {os.path.realpath(r.path): r.provenance.distribution for r in registry.recipes if not r.sweep}


def plugins_own(data: dict[str, Any], distribution: str, registry: Registry) -> dict[str, Any]:
    """A plugin's recipe as the plugin means it: each component it names bare that ``distribution``
    registers (of that kind), where the bare name now means another (a later gptzoo gave a built-in that
    name, another plugin took it with ``override=True``, or it became ambiguous), named
    ``DISTRIBUTION:NAME``, so that it keeps meaning the plugin's component; a bare name that means the
    plugin's stays as written. A bare name the plugin does not register (a built-in it uses, another plugin's)
    stays as written, and what the recipe extends is read as its own file says."""

    def own(kind: str, value: Any) -> Any:
        name = value.get("name") if isinstance(value, dict) else value
        if not isinstance(name, str) or split_name(name)[0] is not None:
            return value
        qualified = f"{distribution}:{name}"
        try:
            mine = registry.get(kind, qualified)
        except ComponentLookupError:
            return value
        try:
            if registry.get(kind, name) is mine:  # the bare name means the plugin's today: it stays as written
                return value
        except ComponentLookupError:  # ambiguous
            pass
        return {**value, "name": qualified} if isinstance(value, dict) else qualified

    data = dict(data)
    model = data.get("model")
    if isinstance(model, dict):
        model = {key: own(key, value) if key in COMPONENT_KEYS else value for key, value in model.items()}
        types = model.get(LAYER_TYPES)
        if isinstance(types, dict):
            model[LAYER_TYPES] = {
                name: {k: own(k, v) if k in COMPONENT_KEYS else v for k, v in table.items()}
                if isinstance(table, dict)
                else table
                for name, table in types.items()
            }
        data["model"] = model
    generate = data.get("generate")
    if isinstance(generate, dict) and isinstance(generate.get(SAMPLERS), list):
        data["generate"] = {**generate, SAMPLERS: [own("sampler", step) for step in generate[SAMPLERS]]}
    return data


def read_resolved_recipe_data(path: Path, *, real: Path | None = None) -> dict[str, Any]:
    """The TOML of a resolved recipe, as a checkpoint's recipe.toml is written (read at ``real``,
    where symlinks lead, when given). It extends nothing: following ``extends`` would read a file
    that the checkpoint names, so it is refused."""
    data = _read_toml(path, real)
    if "extends" in data:
        raise RecipeError(
            str(path),
            [
                f"extends = {show(data['extends'])}: a checkpoint's recipe.toml is written resolved (with what its "
                "recipe extended merged in) and extends nothing; remove the extends line"
            ],
        )
    return _paths_from(data, path)


def _paths_from(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """The recipe data of the file ``path`` with its relative ``[train] data`` made absolute: a path in a
    recipe is relative to the file that writes it, wherever the recipe that extends it lives."""
    train = data.get("train")
    if isinstance(train, dict) and isinstance(train.get("data"), str) and train["data"]:
        data["train"] = {**train, "data": os.path.join(os.path.abspath(path.parent), train["data"])}
    return data


def merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """Child over base, section by section; values are replaced whole, but for a [model] component
    given as a table without a name (see :func:`merge_component`)."""
    merged = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key in SECTIONS:
            section = {**merged[key], **value}
            if key == "model":
                for component in COMPONENT_KEYS:
                    if component in value:
                        section[component] = merge_component(merged[key].get(component), value[component])
            merged[key] = section
        else:
            merged[key] = value
    return merged


def parse_override(text: str) -> tuple[list[str], Any]:
    """'model.n_layer=6' -> (['model', 'n_layer'], 6); a value is one TOML value, else a bare string.

    Raises ValueError with the problem for anything that is not SECTION.KEY[.PARAM]=VALUE.
    """
    key, sep, value = text.partition("=")
    path = [part.strip() for part in key.split(".")]
    layer = path[:2] == ["model", LAYER_TYPES]
    if not sep or not 2 <= len(path) <= (5 if layer else 3) or not all(path):
        raise ValueError(
            f"--set {show(text)} is not SECTION.KEY=VALUE or SECTION.KEY.PARAM=VALUE (e.g. model.n_layer=6)"
        )
    placement = layer and len(path) == 4 and path[3] == "norm_placement"
    if layer and len(path) > 3 and path[3] not in COMPONENT_KEYS and not placement:
        raise ValueError(
            f"--set {show(text)}: a layer type is model.{LAYER_TYPES}.TYPE={{...}}, its component "
            f"model.{LAYER_TYPES}.TYPE.COMPONENT[.PARAM]=VALUE (COMPONENT one of {', '.join(COMPONENT_KEYS)}), its "
            f"norm placement model.{LAYER_TYPES}.TYPE.norm_placement=VALUE"
        )
    if not layer and len(path) == 3 and (path[0] != "model" or path[1] not in COMPONENT_KEYS):
        raise ValueError(
            f"--set {show(text)}: only a [model] component takes a parameter"
            f" (model.COMPONENT.PARAM=VALUE, COMPONENT one of {', '.join(COMPONENT_KEYS)})"
        )
    try:
        document = tomllib.loads(f"v = {value.strip()}")
    except tomllib.TOMLDecodeError:
        return path, value.strip()
    except ValueError:  # tomllib wraps every other ValueError in TOMLDecodeError
        raise ValueError(f"--set {show(text)}: cannot read the value: {_TOO_LONG}") from None
    except RecursionError:
        raise ValueError(f"--set {show(text)}: cannot read the value: arrays or tables nested too deeply") from None
    return path, document["v"] if len(document) == 1 else value.strip()


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
        section = data.setdefault(path[0], {}) if path[0] not in TOP_LEVEL_KEYS else None
        if isinstance(section, dict) and path[:2] == ["model", LAYER_TYPES] and len(path) == 3:  # a whole type
            types = section.get(LAYER_TYPES, {})
            section[LAYER_TYPES] = {**types, path[2]: value} if isinstance(types, dict) else {path[2]: value}
            continue
        in_layer_type = isinstance(section, dict) and len(path) > 3
        if in_layer_type:  # model.layer_types.TYPE.COMPONENT[.PARAM]
            section = _layer_type_table(section, path[2])
            if section is None:
                problems.append(f"--set {show(text)}: [model] {LAYER_TYPES} or its {show(path[2])} is not a table")
                continue
            if len(path) == 4:
                _forget_layer_origin(data, path[2], path[3])
            path = ["model", *path[3:]]
        if not isinstance(section, dict):
            problems.append(f"--set {show(text)}: {show(path[0])} is not a section")
        elif len(path) == 2:
            component = path[0] == "model" and path[1] in COMPONENT_KEYS
            section[path[1]] = merge_component(section.get(path[1]), value) if component else value
            if not in_layer_type:  # a layer type's component forgot its own origin above
                _forget_origin(data, path)
        else:  # a component parameter: model.norm.eps=1e-6
            current = section.get(path[1])
            component = dict(current) if isinstance(current, dict) else {} if current is None else {"name": current}
            component[path[2]] = value
            section[path[1]] = component
    return data, problems


def _layer_type_table(model: dict[str, Any], name: str) -> dict[str, Any] | None:
    """A copy of [model.layer_types.NAME] put in place of the original (created if absent), for an override
    to change; None when the data there is not a table."""
    types = model.get(LAYER_TYPES, {})
    if not isinstance(types, dict) or not isinstance(types.get(name, {}), dict):
        return None
    table = dict(types.get(name, {}))
    model[LAYER_TYPES] = {**types, name: table}
    return table


def _forget_layer_origin(data: dict[str, Any], layer_type: str, key: str) -> None:
    """Drop what [provenance] layer_types says of a layer type's component an override renames."""
    provenance = data.get(PROVENANCE)
    if not isinstance(provenance, dict) or not isinstance(provenance.get(LAYER_TYPES), dict):
        return
    types = dict(provenance[LAYER_TYPES])
    if isinstance(types.get(layer_type), dict):
        types[layer_type] = {k: v for k, v in types[layer_type].items() if k != key}
    data[PROVENANCE] = {**provenance, LAYER_TYPES: types}


def _forget_origin(data: dict[str, Any], path: list[str]) -> None:
    """Drop what [provenance] says of a component an override renames: it was the old one's."""
    provenance = data.get(PROVENANCE)
    if not isinstance(provenance, dict):
        return
    if path[0] == "model" and path[1] in COMPONENT_KEYS:
        data[PROVENANCE] = {k: v for k, v in provenance.items() if k != path[1]}
    elif path == ["generate", "samplers"]:
        data[PROVENANCE] = {k: v for k, v in provenance.items() if k != SAMPLERS}


def override_paths(overrides: Iterable[str]) -> dict[tuple[str, str], str]:
    """(section, key) -> the last override that sets it (or one of its parameters)."""
    paths = {}
    for text in overrides:
        try:
            path, _ = parse_override(text)
        except ValueError:
            continue
        paths[(path[0], path[1])] = text
    return paths


def attributed(exc: RecipeError, overrides: Iterable[str]) -> RecipeError:
    """The error with each problem an override caused named by that override: all of them (the
    recipe file is not at fault), as the source; some, each prefixed with its override."""
    paths = override_paths(overrides)
    if not paths:
        return exc
    problems: list[tuple[str | None, str]] = []
    for problem in exc.problems:
        if problem.startswith("--set "):  # an override that could not be applied says so itself
            problems.append(("", problem))
            continue
        match = re.match(r"\[(\w+)\] (?:unknown key '(\w+)'|(\w+)(?=$|[ .=:\[(]))", problem)
        key = match and (match.group(1), match.group(2) or match.group(3))
        problems.append((paths.get(key) if key else None, problem))
    if all(text is not None for text, _ in problems):
        named = dict.fromkeys(text for text, _ in problems if text)
        if not named:
            return exc
        source = ", ".join(f"--set {t}" for t in named)
        return RecipeError(source, [p if not t or len(named) == 1 else f"--set {t}: {p}" for t, p in problems])
    return RecipeError(exc.source, [f"--set {t}: {p}" if t else p for t, p in problems])


def load_recipe(name_or_path: str | Path, overrides: Iterable[str] = (), *, registry: Registry | None = None) -> Recipe:
    """Load, merge (extends), override and validate a recipe by shipped name or file path."""
    from gptzoo.recipe.validate import validate  # with the contracts and factories: only when a recipe is loaded

    if registry is None:
        from gptzoo.registry import default_registry

        registry = default_registry()
    path = resolve_recipe_path(name_or_path, registry=registry)
    if (warning := shadowed_recipe(str(name_or_path), registry)) is not None:
        warnings.warn(warning, GptzooWarning, stacklevel=2)
    overrides = list(overrides)
    data, problems = apply_overrides(read_recipe_data(path, registry), overrides)
    try:
        return validate(data, str(path), name=path.stem, registry=registry, problems=problems)
    except RecipeError as exc:
        raise attributed(exc, overrides) from None


def override_recipe(recipe: Recipe, overrides: Iterable[str], *, registry: Registry | None = None) -> Recipe:
    """A resolved recipe with ``--set`` style overrides applied and validated again."""
    from gptzoo.recipe.validate import validate

    overrides = list(overrides)
    data, problems = apply_overrides(recipe.to_dict(), overrides)
    try:
        return validate(data, recipe.source, name=recipe.name, registry=registry, problems=problems)
    except RecipeError as exc:
        raise attributed(exc, overrides) from None
