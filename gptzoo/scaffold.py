"""``gptzoo new-plugin``: a new plugin distribution for one component, ready to install and test.

:func:`new_plugin` writes a directory holding ``pyproject.toml`` (the entry point in group
``gptzoo``), the component's module (a working skeleton of its kind, from
gptzoo.scaffold_templates), ``tests/`` (one file running gptzoo's conformance kit on it) and a
``README.md``. The directory appears whole or not at all (gptzoo.atomic.new_directory).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from string import Template as Text

from gptzoo.atomic import new_directory
from gptzoo.errors import GptzooError, did_you_mean
from gptzoo.hookspecs import CONTRACT_VERSION, CONTRACTS, KINDS
from gptzoo.registry import Registry, default_registry
from gptzoo.scaffold_templates import CONTRACT, MODULE_DOC, PYPROJECT, README, TEMPLATES, TEST

PLUGIN_NAME = re.compile(r"[a-z](?:[a-z0-9_]{0,62}[a-z0-9])?")
"""A plugin's name: its component's registered name, ``gptzoo_NAME`` its module and
``gptzoo-NAME`` (underscores as dashes) its distribution, so a Python identifier that is also a
distribution name once prefixed (no trailing underscore), in lowercase, of at most 64 characters
(the longest component name)."""

NAME_RULE = "lowercase letters, digits and '_', starting with a letter and ending with a letter or digit"


@dataclass(frozen=True)
class Scaffold:
    """What :func:`new_plugin` wrote."""

    directory: Path
    kind: str
    name: str
    module: str
    distribution: str
    files: tuple[str, ...]
    """The files written, relative to ``directory``."""

    @property
    def next_steps(self) -> str:
        """The commands that install the new plugin and run its tests."""
        return f"cd {shlex.quote(str(self.directory))} && pip install -e . && python -m pytest"


def check_name(name: str) -> None:
    """Refuse a plugin name that cannot be a component, module and distribution name at once."""
    if PLUGIN_NAME.fullmatch(name):
        return
    fixed = re.sub(r"[-.\s]+", "_", name.strip()).lower().strip("_")
    hint = f"; did you mean {fixed!r}?" if fixed != name and PLUGIN_NAME.fullmatch(fixed) else ""
    raise GptzooError(
        f"{name!r} is not a plugin name: use {NAME_RULE}, at most 64 characters (e.g. 'ring_window'), "
        f"since it names the component, the module gptzoo_NAME and the distribution gptzoo-NAME{hint}"
    )


def check_kind(kind: str) -> None:
    """Refuse a kind that gptzoo.hookspecs.CONTRACTS does not have."""
    if kind not in CONTRACTS:
        raise GptzooError(f"unknown component kind {kind!r}{did_you_mean(kind, list(KINDS))}")


def names(name: str) -> tuple[str, str]:
    """The module and the distribution of the plugin ``name``."""
    return f"gptzoo_{name}", f"gptzoo-{name.replace('_', '-')}"


def plugin_files(name: str, kind: str) -> dict[str, str]:
    """The files of a new plugin for the ``kind`` component ``name``: relative path -> text."""
    check_kind(kind)
    check_name(name)
    if kind not in TEMPLATES:
        raise LookupError(f"gptzoo.scaffold_templates has no template for the kind {kind!r}: add one to TEMPLATES")
    template, contract = TEMPLATES[kind], CONTRACTS[kind]
    module, distribution = names(name)
    if contract.recipe_key is not None:
        usage = f"gptzoo build gpt2-tiny --set model.{contract.recipe_key}={name}"
    else:
        usage = f"gptzoo generate gpt2-tiny --prompt Hello --set 'generate.samplers=[{{ name = \"{name}\" }}]'"
    fields = {
        "name": name,
        "cls": "".join(part.capitalize() for part in name.split("_")),
        "kind": kind,
        "hook": contract.hook,
        "module": module,
        "dist": distribution,
        "flag": name.replace("_", "-"),
        "usage": usage,
        "summary": template.summary,
        "contract": str(CONTRACT_VERSION),
    }
    return {
        "pyproject.toml": PYPROJECT.substitute(fields),
        "README.md": README.substitute(fields),
        f"{module}.py": MODULE_DOC.substitute(fields)
        + Text(template.code).substitute(fields)
        + CONTRACT.substitute(fields),
        f"tests/test_{name}.py": TEST.substitute(fields),
    }


def new_plugin(name: str, kind: str, out: str | Path | None = None, *, registry: Registry | None = None) -> Scaffold:
    """Write a new plugin distribution for the ``kind`` component ``name`` into ``out`` (default:
    ``gptzoo-NAME`` in the current directory), which must not exist yet. A name that ``registry``
    (default: the installed plugins') already has for that kind is refused: the new plugin's tests
    would not reach its component by it. Bad input is a GptzooError, raised before anything is
    written; a failed write leaves nothing behind."""
    files = plugin_files(name, kind)
    registry = registry if registry is not None else default_registry()
    if name in registry.names(kind):
        taken = registry.get(kind, name).provenance
        raise GptzooError(
            f"{kind} {name!r} is already registered by {taken}: choose another name for the new plugin "
            f"(`gptzoo list {kind}` shows the names taken)"
        )
    module, distribution = names(name)
    directory = Path(out) if out is not None else Path(distribution)
    if os.path.lexists(directory):
        raise GptzooError(f"{directory} already exists; give --out a new directory, or remove that one")
    with new_directory(directory) as tmp:
        for relative, text in files.items():
            path = tmp / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    return Scaffold(directory, kind, name, module, distribution, tuple(files))
