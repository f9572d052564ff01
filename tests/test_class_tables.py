"""Every class named by a string in gptzoo resolves to a class (as vLLM's test_registry_imports holds its
registry's strings): the built-in rows of every subsystem's class table (gptzoo.class_table), and every
``"module:Qualname"`` literal of gptzoo's own modules. A built-in class renamed without its rows fails
here, instead of degrading to an eager path or to "no layout"."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import gptzoo
from gptzoo.adapters.targets import PARTS
from gptzoo.class_table import Row
from gptzoo.hf.convert import FAMILIES
from gptzoo.inference.batching import MOVERS
from gptzoo.inference.lowerings import BUILTIN_LOWERINGS, BUILTIN_ROTARY_TABLES
from gptzoo.plugin_manager import DEFAULT_PLUGINS, SUBSYSTEMS

TABLES: dict[str, tuple[Row, ...]] = {
    "decode lowerings": BUILTIN_LOWERINGS,
    "rotary tables": BUILTIN_ROTARY_TABLES,
    "cache movers": MOVERS,
    "adapter parts": PARTS,
    **{f"{name} layout": family.component_layouts for name, family in FAMILIES.items()},
}
"""Every table's built-in rows."""

REFERENCE = re.compile(r"(?:gptzoo|gptzoo_plugins)(?:\.\w+)*:[A-Za-z_]\w*(?:\.\w+)*")
"""A string naming a class of gptzoo's, as class tables key them: ``gptzoo_plugins._norms:RMSNorm``."""


def resolve(reference: str) -> object:
    module, _, attribute = reference.partition(":")
    found: object = importlib.import_module(module)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


def literals() -> list[tuple[str, int, str]]:
    """Every string constant of gptzoo's and the built-in plugins' modules that is a class reference."""
    roots = [Path(gptzoo.__file__).parent, Path(importlib.import_module("gptzoo_plugins").__file__).parent]
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and REFERENCE.fullmatch(node.value):
                    found.append((path.name, node.lineno, node.value))
    return found


@pytest.mark.parametrize("table", TABLES)
def test_every_built_in_row_names_a_class_that_imports(table: str) -> None:
    rows = TABLES[table]
    assert rows, table
    missing = []
    for row in rows:
        try:
            named = resolve(row.key)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{row.key} ({row.facet or 'its row'}): {exc}")
            continue
        assert isinstance(named, type), row.key
    assert not missing, f"the {table} name classes that do not exist: {missing}"


def test_every_class_reference_written_in_gptzoo_imports() -> None:
    found = literals()
    assert len(found) > 40  # the tables' keys at least
    missing = []
    for name, line, reference in found:
        try:
            resolve(reference)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{name}:{line} {reference!r}: {exc}")
    assert not missing, "references to classes that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_family_s_built_in_layouts_are_of_its_layout(name: str) -> None:
    family = FAMILIES[name]
    assert {row.facet for row in family.component_layouts} == {family.layout}


@pytest.mark.parametrize("name", [*DEFAULT_PLUGINS, *SUBSYSTEMS])
def test_every_module_the_plugin_manager_loads_by_name_imports(name: str) -> None:
    assert importlib.import_module(name).__name__ == name
