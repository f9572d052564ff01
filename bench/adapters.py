"""Decoding with a LoRA adapter: merged into the weights, or kept as a side path (what ``--adapter`` loads).

SmolLM2-135M (``gptzoo fetch smollm2-135m``) with an adapter in peft's format (``--adapter DIR``, e.g. a
`gptzoo finetune` run's) decodes ``--new-tokens`` tokens greedily, batch 1, in ``--dtype``, three ways, in
alternating rounds: (merged) the adapter merged into the weights on load (``merge_peft``); (side) as
``gptzoo generate --adapter`` loads it, each adapted projection a LoRALinear whose eager forward is
peft's unmerged computation and whose native lowering is one product with its merged weight, made at the
first plan and kept; (two-products) the same model with the side path lowered as it is computed: the base
product, then A's and B's products added into it (this script's own lowering, put in place of gptzoo's
for its rounds). Each round prints the load average, the time of a first 2-token generation (the plan and,
for (side), the merged weights), and the tokens per second of the next ``--new-tokens`` (their steps only),
and whether every side gave the (merged) side's tokens.

    python bench/adapters.py --adapter DIR [--rounds 3] [--new-tokens 128] [--dtype float32] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from gptzoo.inference import lowerings
from gptzoo.inference.generate import generate
from gptzoo.inference.native import cpu_flags
from gptzoo.inference.plan import Buffer, DecodePlan
from gptzoo.loader import load_any, with_adapter, with_precision

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village by the sea, there"
KEY = "gptzoo.adapters.lora:LoRALinear"


def lower_two_products(plan: DecodePlan, linear: Any, src: Buffer, dst: Buffer) -> None:
    """dst = src W^T + bias + src A^T (scale B)^T: every part's A stacked, its scaled B on its rows."""
    a = torch.cat([linear.lora_A[name].detach() for name, _, _ in linear.parts])
    b = torch.zeros(linear.out_features, a.shape[0])
    column = 0
    for name, start, stop in linear.parts:
        rank = linear.lora_A[name].shape[0]
        b[start:stop, column : column + rank] = linear.scales[name] * linear.lora_B[name].detach().float()
        column += rank
    dtype = linear.weight.dtype
    plan.linear(linear.weight, None, linear.bias, src, dst)
    low, lora = plan.buffer(a.shape[0]), plan.buffer(linear.out_features)
    plan.linear(a.to(dtype).contiguous(), None, None, src, low)
    plan.linear(b.to(dtype).contiguous(), None, None, low, lora)
    plan.add(dst, lora, dst)


@contextmanager
def two_products() -> Iterator[None]:
    kept = lowerings.BUILTIN_LOWERINGS
    lowerings.BUILTIN_LOWERINGS = tuple(
        dataclasses.replace(row, value=lower_two_products) if row.key == KEY else row for row in kept
    )
    try:
        yield
    finally:
        lowerings.BUILTIN_LOWERINGS = kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = load_any("smollm2-135m")
    prompt = base.tokenizer().encode(PROMPT)
    models = {
        "merged": with_precision(with_adapter(base, args.adapter, merge=True), args.dtype),
        "side": with_precision(with_adapter(load_any("smollm2-135m"), args.adapter), args.dtype),
        "two-products": with_precision(with_adapter(load_any("smollm2-135m"), args.adapter), args.dtype),
    }
    rows = []
    for round_ in range(args.rounds):
        tokens = {}
        for name, loaded in models.items():
            with two_products() if name == "two-products" else nullcontext():
                load = os.getloadavg()[0]
                start = time.perf_counter()
                generate(loaded.model, [prompt], 2)
                first = time.perf_counter() - start
                start = time.perf_counter()
                tokens[name] = generate(loaded.model, [prompt], args.new_tokens + 2)[0]
                steps = time.perf_counter() - start - first
            row = {"round": round_, "side": name, "load": load, "first_ms": 1000 * first}
            row["tokens_per_s"] = args.new_tokens / steps
            rows.append(row)
            if not args.json:
                print(
                    f"round {round_} {name:>12}: load {load:.2f}, first 2 tokens {row['first_ms']:.0f} ms, "
                    f"{row['tokens_per_s']:.1f} tok/s",
                    flush=True,
                )
        same = {name: t == tokens["merged"] for name, t in tokens.items()}
        rows.append({"round": round_, "same_tokens": same})
        if not args.json:
            print(f"round {round_}: the merged side's tokens: {same}", flush=True)
    flags = sorted({f for f in cpu_flags().split() if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")})
    report = {"dtype": args.dtype, "new_tokens": args.new_tokens, "cpu_flags": flags, "rows": rows}
    print(json.dumps(report, indent=2) if args.json else f"flags {flags}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
