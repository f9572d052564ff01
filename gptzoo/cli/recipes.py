"""``gptzoo recipes``: the shipped recipes, or those that use a component."""

from __future__ import annotations

import argparse

from gptzoo.cli.args import Parser, Subparsers
from gptzoo.cli.console import Console, emit
from gptzoo.cli.library import command_registry
from gptzoo.cli.render import text


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser("recipes", parents=[common], help="list shipped recipes")
    p.add_argument(
        "--uses",
        action="append",
        default=[],
        metavar="NAME",
        help="only recipes with a component of this name, in any layer (bare or DIST:name; repeat to ask for several)",
    )
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    from gptzoo.recipe import read_recipe_data, shipped_recipes

    registry = command_registry(err)  # its plugins' recipes are listed too
    names = None
    if args.uses:
        from gptzoo import catalog  # matches the recipes' component names against the registry

        names = {r.name for r in catalog.recipes_using(registry, args.uses, catalog.shipped(registry))}
    shipped = shipped_recipes()
    listed = [(name, path, "gptzoo") for name, path in shipped.items()]
    listed += [  # by the name that reaches it: bare, unless a shipped recipe or another plugin's has it
        (
            r.name if registry.recipe(r.name) is r and r.name not in shipped else r.qualified_name,
            r.path,
            r.provenance.distribution,
        )
        for r in registry.recipes
        if not r.sweep
    ]
    rows = []
    for name, path, distribution in listed:
        if names is not None and name not in names:
            continue
        data = read_recipe_data(path)
        model = data.get("model", {})
        rows.append(
            {
                "name": name,
                "description": data.get("description", ""),
                "n_layer": model.get("n_layer"),
                "n_embd": model.get("n_embd"),
                "path": str(path),
                "distribution": distribution,
            }
        )
    emit(
        args,
        out,
        rows,
        "Recipes",
        {
            "name": lambda r: r["name"],
            "n_layer": lambda r: str(r["n_layer"]),
            "n_embd": lambda r: str(r["n_embd"]),
            "description": lambda r: text(r["description"]),
            "from": lambda r: text(r["distribution"]),
        },
        empty=f"no shipped recipe uses {text(' and '.join(args.uses))}",
    )
