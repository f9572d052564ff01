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

    rows = []
    names = None
    if args.uses:
        from gptzoo import catalog  # matches the recipes' component names against the registry

        registry = command_registry(err)
        names = {r.name for r in catalog.recipes_using(registry, args.uses, catalog.shipped(registry))}
    for name, path in shipped_recipes().items():
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
        },
        empty=f"no shipped recipe uses {text(' and '.join(args.uses))}",
    )
