"""A lone stream's latency before and after a change, request by request: two ``gptzoo serve`` processes up
at once, one on a base revision's code and one on the working tree's, and single streamed greedy completions
sent to them in pairs, in alternating order.

Whole-process rounds (``before_after.py ... serve``) see a request of one or two seconds move by 10-15% with
the machine's read bandwidth between runs; a pair of requests a second apart shares that state, so the
after / before ratio of each pair, and its median and quartiles over many pairs, shows a change of a few
percent that rounds cannot. Each side answers two warm-up requests first (its decode plan and its thread
tuner). Prints each side's median request time, time to first token and time per later token, the median and
quartiles of the per-pair ratios, the load and the CPU flags.

    python bench/serve_pairs.py --base 539b5fd [--pairs 40] [--new-tokens 32] [--model smollm2-135m] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
from before_after import ROOT, load, packages
from serve import one, start

from gptzoo.inference.native import cpu_flags


def timed(client: openai.OpenAI, model: str, i: int, new_tokens: int) -> dict[str, float]:
    begun = time.perf_counter()
    result = one(client, model, i, new_tokens)
    total = time.perf_counter() - begun
    return {
        "total_s": total,
        "ttft_s": result["ttft"],
        "itl_s": (total - result["ttft"]) / max(result["tokens"] - 1, 1),
    }


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the revision measured as 'before' (default HEAD)")
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    flags = sorted({f for f in cpu_flags().split() if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")})
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    loads = []
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True)
        servers = {}
        try:
            trees = {"before": base, "after": ROOT}
            for side, tree in trees.items():
                process, port = start(args.model, str(packages(tree, Path(scratch) / side)))
                servers[side] = process
                client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
                trees[side] = client
                for _ in range(2):
                    timed(client, args.model, 0, args.new_tokens)
            for i in range(args.pairs):
                loads.append(load())
                for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    results[side].append(timed(trees[side], args.model, i, args.new_tokens))
        finally:
            for process in servers.values():
                process.terminate()
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    report: dict[str, Any] = {"base": args.base, "pairs": args.pairs, "flags": flags, "load": [min(loads), max(loads)]}
    for metric in ("total_s", "ttft_s", "itl_s"):
        before = [r[metric] for r in results["before"]]
        after = [r[metric] for r in results["after"]]
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        report[metric] = {
            "before_median": statistics.median(before),
            "after_median": statistics.median(after),
            "ratio_quartiles": quartiles(ratios),
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.pairs} pairs of one {args.new_tokens}-token stream, {args.model}: before = {args.base}, after = the")
    print(f"working tree; load {min(loads):.2f}-{max(loads):.2f}; flags {flags}")
    print("| metric | before median | after median | after / before per pair: q1, median, q3 |")
    print("| --- | --- | --- | --- |")
    for metric in ("total_s", "ttft_s", "itl_s"):
        row = report[metric]
        q1, q2, q3 = row["ratio_quartiles"]
        print(f"| {metric} | {row['before_median']:.4f} | {row['after_median']:.4f} | {q1:.3f}, {q2:.3f}, {q3:.3f} |")


if __name__ == "__main__":
    main()
