"""``gptzoo plugins``: plugins, where they come from and what they registered; ``--check`` runs the conformance kit."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from rich.table import Table

from gptzoo.cli.args import Parser, Subparsers
from gptzoo.cli.console import Console, emit, print_json
from gptzoo.cli.library import command_registry, importing
from gptzoo.cli.render import text
from gptzoo.errors import GptzooError
from gptzoo.plugin_manager import canonical_name
from gptzoo.registry import GPTZOO_DISTRIBUTION, get_registry
from gptzoo.tables import WholeWords


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser("plugins", parents=[common], help="list plugins, where they come from and what they registered")
    p.add_argument(
        "--check",
        nargs="?",
        const="",
        metavar="NAME",
        help="run the conformance kit (gptzoo.testing) instead of listing: on the components of one plugin (its "
        "entry-point name or distribution, e.g. gptzoo for the built-ins) or one component (KIND:NAME); without "
        "NAME, on every component that a third-party plugin registered. Exit 1 when a check fails",
    )
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> int | None:
    if args.check is not None:
        return check_plugins(args, out, err)
    registry = get_registry()
    registered: dict[str, list[str]] = {}
    notes: dict[str, list[str]] = {}
    for entry in registry.all_entries():
        registered.setdefault(entry.provenance.plugin, []).append(f"{entry.kind}:{entry.name}")
        if (note := registry.note(entry)) is not None:
            notes.setdefault(entry.provenance.plugin, []).append(f"{entry.kind} {entry.name!r} is {note}")
    rows = [
        {**asdict(info), "registered": registered.get(info.module, []), "notes": notes.get(info.module, [])}
        for info in registry.plugins
    ]
    emit(
        args,
        out,
        rows,
        "Plugins",
        {
            "plugin": lambda r: (
                text(r["name"]) + (f"\n[dim]{text(r['module'])}[/dim]" if r["module"] != r["name"] else "")
            ),
            "distribution": lambda r: text(f"{r['distribution']} {r['version']}"),
            "status": _plugin_status,
            "registered": lambda r: "\n".join(
                [", ".join(r["registered"]), *(f"[yellow]{text(n)}[/yellow]" for n in r["notes"])]
            ),
        },
    )


def check_plugins(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``gptzoo plugins --check [NAME]``: the conformance kit's results as a table (or JSON); exit 1
    when a check failed."""
    with importing():
        from gptzoo.testing import run_conformance

    registry = command_registry(err)
    entries = list(registry.all_entries())
    name = args.check
    if not name:
        chosen = [e for e in entries if e.provenance.distribution != GPTZOO_DISTRIBUTION]
    else:
        plugins = {info.name: info.module for info in registry.plugins}
        chosen = [
            e
            for e in entries
            if name in (f"{e.kind}:{e.name}", f"{e.kind}:{e.qualified_name}")
            or canonical_name(name) == canonical_name(e.provenance.distribution)
            or (name in plugins and e.provenance.plugin == plugins[name])
        ]
        if not chosen:
            known = sorted({*plugins, *(e.provenance.distribution for e in entries)})
            raise GptzooError(
                f"--check {name!r} names no plugin, distribution or component; plugins and distributions: "
                f"{', '.join(known)}; components: KIND:NAME as `gptzoo list` shows them"
            )
    results = run_conformance(registry, chosen)
    failed = sum(r.status == "failed" for r in results)
    if args.json:
        print_json(out, {"components": len(chosen), "failed": failed, "results": [asdict(r) for r in results]})
    elif not chosen:
        out.print("no third-party plugin registered a component; `--check gptzoo` checks the built-ins")
    else:
        colour = {"passed": "green", "failed": "red", "skipped": "yellow"}
        table = Table(title="Conformance", title_justify="left")
        for header in ("component", "provenance", "check", "status", "detail"):
            table.add_column(header, overflow="fold")
        for r in results:
            table.add_row(
                text(f"{r.kind}:{r.name}"),
                text(f"{r.distribution} {r.version}"),
                text(r.check),
                f"[{colour[r.status]}]{r.status}[/{colour[r.status]}]",
                text(r.detail),
            )
        out.print(WholeWords(table))
        counts = {status: sum(r.status == status for r in results) for status in colour}
        out.print(", ".join(f"{n} {status}" for status, n in counts.items()))
    return 1 if failed else 0


def _plugin_status(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"[red]failed[/red]: {text(row['error'] or '')}"
    notes = [f"\n[yellow]warning[/yellow]: {text(row['warning'])}"] if row["warning"] else []
    notes += [f"\n[yellow]refused[/yellow]: {text(refusal)}" for refusal in row.get("refused", ())]
    return "[green]ok[/green]" + "".join(notes)
