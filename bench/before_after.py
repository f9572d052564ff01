"""One benchmark before and after a change: the same script run on a base revision's code and on the
working tree's, in alternating order, each round reported with the load.

The base revision is checked out once into a temporary git worktree; each run is ``python SCRIPT --json``
with ``PYTHONPATH`` at a folder that names one tree's packages (``gptzoo``, and ``gptzoo_plugins`` and
``gptzoo_recipes`` as the installed names of its ``plugins/`` and ``recipes/``), so gptzoo and its built-in
plugins come from that tree, and so does a ``gptzoo serve`` the script starts; the script itself is the
working tree's in both, so both sides measure the same way. For each
metric of the script's JSON report, every round prints both sides' value and after / before, and the end
prints the range of those ratios over the rounds next to each side's own spread (max / min over the rounds):
a ratio inside the spread is no change that these rounds can show.

    python bench/before_after.py --base HEAD --rounds 3 generate [-- --runs 3]
    python bench/before_after.py --base HEAD --rounds 3 batched -- --batches 8 32
    python bench/before_after.py --base HEAD --rounds 3 serve -- --rounds 1 --clients 1,8
    python bench/before_after.py --base HEAD --rounds 3 quantize -- --load
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gptzoo.inference.native import cpu_flags

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _generate(report: dict[str, Any]) -> dict[str, float]:
    found = {f"decode {row['dtype']} tok/s": row["gptzoo_tokens_per_s"] for row in report["rows"]}
    found.update({f"decode {row['dtype']} gptzoo / transformers": row["ratio"] for row in report["rows"]})
    return found


def _batched(report: dict[str, Any]) -> dict[str, float]:
    found = {f"batch {row['batch']} tok/s": row["tokens_per_s"]["gptzoo"] for row in report["rows"]}
    found.update({f"batch {row['batch']} gptzoo / transformers": row["ratio"] for row in report["rows"]})
    return found


def _serve(report: dict[str, Any]) -> dict[str, float]:
    found: dict[str, list[float]] = {}
    for row in report["rows"]:
        found.setdefault(f"serve {row['clients']} clients {row['way']} tok/s", []).append(row["tokens_per_s"])
    return {name: sum(values) / len(values) for name, values in found.items()}


def _quantize(report: dict[str, Any]) -> dict[str, float]:
    return {"int4 search s (best run)": report["best_seconds"]}


METRICS: dict[str, Callable[[dict[str, Any]], dict[str, float]]] = {
    "generate": _generate,
    "batched": _batched,
    "serve": _serve,
    "quantize": _quantize,
}
"""bench script (bench/NAME.py) -> the numbers of its --json report compared."""


PACKAGES = {"gptzoo": "gptzoo", "gptzoo_plugins": "plugins", "gptzoo_recipes": "recipes"}
"""Import name -> the folder of a tree that holds it (pyproject.toml's package-dir)."""


def packages(tree: Path, folder: Path) -> Path:
    """``folder``, holding a link per import name to ``tree``'s package."""
    folder.mkdir()
    for name, path in PACKAGES.items():
        (folder / name).symlink_to(tree / path)
    return folder


def run(path: Path, script: str, extra: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(path)}
    command = [sys.executable, str(HERE / f"{script}.py"), "--json", *extra]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, cwd=path)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} with PYTHONPATH {path} failed:\n{done.stderr[-3000:]}")
    return METRICS[script](json.loads(done.stdout[done.stdout.index("{") :]))


def load() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the revision measured as 'before' (default HEAD)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("script", choices=sorted(METRICS))
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: the script's own arguments")
    args = parser.parse_args()
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    flags = sorted({f for f in cpu_flags().split() if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")})
    print(f"{args.script} {' '.join(extra)}: before = {args.base}, after = the working tree; flags {flags}")
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True)
        paths = {"before": packages(base, Path(scratch) / "before"), "after": packages(ROOT, Path(scratch) / "after")}
        try:
            results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for round_ in range(args.rounds):
                order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
                loads = {}
                for side in order:
                    loads[side] = load()
                    results[side].append(run(paths[side], args.script, extra))
                for name in results["before"][-1]:
                    before, after = results["before"][-1][name], results["after"][-1][name]
                    print(
                        f"round {round_ + 1} {name}: before {before:.3g} (load {loads['before']:.2f}), "
                        f"after {after:.3g} (load {loads['after']:.2f}), after / before {after / before:.3f}",
                        flush=True,
                    )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    print("| metric | after / before, each round | spread before | spread after |")
    print("| --- | --- | --- | --- |")
    for name in results["before"][0]:
        before = [r[name] for r in results["before"]]
        after = [r[name] for r in results["after"]]
        ratios = ", ".join(f"{a / b:.3f}" for a, b in zip(after, before, strict=True))
        print(f"| {name} | {ratios} | {max(before) / min(before):.3f} | {max(after) / min(after):.3f} |")


if __name__ == "__main__":
    main()
