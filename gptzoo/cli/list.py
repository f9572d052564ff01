"""``gptzoo list``: the registered components and the shipped recipes that use them (without importing
any component's code); ``--parameters`` also shows the parameters a recipe may give each, with their
defaults, which imports the code of each listed component, as a build would."""

from __future__ import annotations

import argparse
import inspect
from dataclasses import asdict
from typing import Any

from gptzoo.cli.args import Parser, Subparsers
from gptzoo.cli.console import Console, emit
from gptzoo.cli.library import command_registry
from gptzoo.cli.render import few, text
from gptzoo.errors import GptzooError
from gptzoo.hookspecs import CONTRACTS, KINDS
from gptzoo.plugin_manager import canonical_name
from gptzoo.registry import Entry, Registry, split_name


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser("list", parents=[common], help="list registered components")
    p.add_argument("kind", nargs="?", choices=KINDS, help="only this kind")
    p.add_argument("name", nargs="?", help="only the components of this name (bare, or qualified: DIST:name)")
    p.add_argument(
        "--parameters",
        action="store_true",
        help="also show the parameters a recipe may give each component, with their defaults (imports their code)",
    )
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    from gptzoo import catalog  # the shipped recipes' component names, matched against the registry

    registry = command_registry(err)
    entries = list(registry.all_entries(args.kind))
    if args.name is not None:
        entries = _named(registry, args.kind, args.name, entries)
    recipes = catalog.shipped(registry)
    rows = [
        {
            "kind": e.kind,
            "name": e.name,
            "qualified_name": e.qualified_name,
            "doc": e.doc,
            **asdict(e.provenance),
            "overrides": str(e.overrides) if e.overrides else None,
            "note": registry.note(e),
            "recipes": catalog.used_by(e, recipes),
        }
        for e in entries
    ]
    columns = {
        "kind": lambda r: r["kind"],
        "name": lambda r: text(r["name"]) + (f"\n[dim]{text(r['qualified_name'])}[/dim]" if r["note"] else ""),
        "description": lambda r: text(r["doc"]),
    }
    if args.parameters:
        for row, e in zip(rows, entries, strict=True):
            row["parameters"] = parameters(e)
        columns["parameters"] = lambda r: text("\n".join(f"{k}={v!r}" for k, v in r["parameters"].items()))
    emit(
        args,
        out,
        rows,
        "Components",
        {
            **columns,
            "shipped recipes": lambda r: text(few(r["recipes"])),
            "from": lambda r: (
                origin(r)
                + (text(f", overrides {r['overrides']}") if r["overrides"] else "")
                + (f"\n[yellow]{text(r['note'])}[/yellow]" if r["note"] else "")
            ),
        },
        optional=("shipped recipes", "from"),
    )


def _named(registry: Registry, kind: str | None, name: str, entries: list[Any]) -> list[Any]:
    """The entries ``gptzoo list [KIND] NAME`` shows: the one a qualified name means, or every entry of
    a bare name (all of an ambiguous one); an unknown name is an error, as in a recipe."""
    dist, bare = split_name(name)
    matching = [
        e
        for e in entries
        if e.name == bare and (dist is None or canonical_name(e.provenance.distribution) == canonical_name(dist))
    ]
    if not matching and kind is not None:
        registry.get(kind, name)  # raises the unknown-name error, with what is available
    if not matching:
        raise GptzooError(f"no component is named {name!r}; see `gptzoo list`")
    return matching


def parameters(entry: Entry) -> dict[str, Any]:
    """The factory's parameters a recipe may give, with their defaults (those the model passes aside)."""
    from gptzoo import plugin_code  # imports the component's module, on request only

    sig = plugin_code.signature(entry)
    if sig is None:
        return {}
    given = CONTRACTS[entry.kind].given_by_model
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    plain = (str, int, float, bool, type(None))
    return {
        name: p.default if isinstance(p.default, plain) else repr(p.default)  # JSON can hold it
        for name, p in sig.parameters.items()
        if name not in given and p.kind in keyword and p.default is not p.empty
    }


def origin(row: dict[str, Any]) -> str:
    return text(f"{row['plugin']} ({row['distribution']} {row['version']})")
