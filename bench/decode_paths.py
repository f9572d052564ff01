"""CPU decoding speed by decoding path, when one component of a model has no lowering.

SmolLM2-135M (``gptzoo fetch smollm2-135m``) decodes ``--new-tokens`` tokens greedily, batch 1, in
``--dtype`` (float32), three ways, in alternating rounds: (native) as loaded, every step one native call;
(split) with each of its RMSNorms replaced by a copy of a plugin's (the same forward, a class
without a lowering), which generate decodes on the split path, the norms' eager forward between
native calls; (eager) the same copy on the path generate took before the split plan: the whole
model's eager forward (compile_step without ``split``). Each round prints the load average
(``os.getloadavg``), since other processes share the cores, the tokens per second (prefill
included) and the median time from one token to the next, and which sides gave the native side's
greedy tokens (in float32 all do; in bfloat16 the eager forward's attention rounds otherwise here
and there, tests/inference/test_decode_plan.py).
``--position alibi`` (any registered position with an attention bias) measures instead the model of
that shape with that position, random weights: the native plan has no attention bias, so (split)
runs its attentions' eager forward inside the native step and (eager) the whole eager forward; no
native side. ``--torch-compile`` adds, once, the generic alternative: the copy's whole forward through
``torch.compile(dynamic=True)`` (torch's own kernels: gptzoo's native products are opaque calls to
it), its compile time counted, as a generation pays it.

    python bench/decode_paths.py [--rounds 3] [--new-tokens 128] [--dtype float32] [--position alibi]
        [--torch-compile] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import transformers
from torch import nn

from gptzoo.fetch import cache_root
from gptzoo.hf import load_hf
from gptzoo.inference import engine as engine_module
from gptzoo.inference.decode_plan import compile_step
from gptzoo.inference.generate import generate
from gptzoo.inference.matvec import native_decoding
from gptzoo.inference.native import cpu_flags
from gptzoo.inference.paths import DecodePath
from gptzoo.loader import load_model
from gptzoo_plugins._norms import RMSNorm

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village by the sea, there"


class CopiedRMSNorm(nn.Module):
    """A plugin's copy of the built-in RMSNorm: the same forward, no lowering registered."""

    forward = RMSNorm.forward


def run(model: nn.Module, prompt: list[int], n: int, *, split: bool) -> tuple[list[int], float, float, DecodePath]:
    """The tokens, the tokens per second (prefill included, as ``gptzoo generate`` reports), the
    median milliseconds from one new token to the next (a decoding step and its sampling) and the path."""
    paths: list[DecodePath] = []
    times: list[float] = []

    def step(*args: object, **kwargs: object) -> object:
        return compile_step(*args, **{**kwargs, "split": split})

    def on_step(new: list[int | None]) -> list[int]:
        times.append(time.perf_counter())
        return []

    engine_module.compile_step = step
    start = time.perf_counter()
    tokens = generate(model, [prompt], n, on_decode_path=paths.append, on_step=on_step)[0]
    seconds = time.perf_counter() - start
    engine_module.compile_step = compile_step
    return tokens, len(tokens) / seconds, 1e3 * statistics.median(b - a for a, b in itertools.pairwise(times)), paths[0]


@contextmanager
def torch_kernels(model: nn.Module) -> Iterator[None]:
    """No native kernels in the block: generate decodes with torch's (what torch.compile can trace)."""
    yield None


def compiled_run(model: nn.Module, prompt: list[int], n: int) -> tuple[list[int], float, float]:
    """The tokens, the tokens per second and the seconds of the first token (compiling) of the model's
    forward through torch.compile."""
    compiled = torch.compile(model, dynamic=True)
    first: list[float] = []
    start = time.perf_counter()

    def on_step(new: list[int | None]) -> list[int]:
        if not first:
            first.append(time.perf_counter() - start)
        return []

    engine_module.native_decoding = torch_kernels
    try:
        tokens = generate(compiled, [prompt], n, on_step=on_step)[0]  # type: ignore[arg-type]
    finally:
        engine_module.native_decoding = native_decoding
    return tokens, len(tokens) / (time.perf_counter() - start), first[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--position", help="a position with an attention bias: split against eager only")
    parser.add_argument("--torch-compile", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    directory = cache_root() / "smollm2-135m"
    if not (directory / "config.json").exists():
        sys.exit(f"{directory} has no model: run `gptzoo fetch smollm2-135m` first")
    prompt = transformers.AutoTokenizer.from_pretrained(directory)(PROMPT, add_special_tokens=False)["input_ids"]
    dtype = getattr(torch, args.dtype)
    sides: dict[str, Callable[[], tuple[list[int], float, float, DecodePath]]] = {}
    if args.position is None:
        native = load_hf(directory).eval().to(dtype)
        copied = load_hf(directory).eval().to(dtype)
        norms = [m for m in copied.modules() if type(m) is RMSNorm]
        for norm in norms:
            norm.__class__ = CopiedRMSNorm
        sides["native"] = lambda: run(native, prompt, args.new_tokens, split=True)
    else:
        overrides = [f"model.position={args.position}"]
        copied = load_model("smollm2-135m", overrides=overrides, recipe_weights=False, seed=0).model.eval().to(dtype)
        norms = []
    sides["split"] = lambda: run(copied, prompt, args.new_tokens, split=True)
    sides["eager"] = lambda: run(copied, prompt, args.new_tokens, split=False)
    with torch.no_grad():
        for side in sides.values():  # warm up: the kernels' build, the first allocations
            side()
        rounds, tokens = [], {}
        for i in range(args.rounds):
            row: dict[str, object] = {"round": i + 1, "load": os.getloadavg()[0]}
            for name, side in sides.items():
                tokens[name], speed, step_ms, path = side()
                row[name] = {"tokens_per_s": speed, "step_ms": step_ms, "path": path.path}
            rounds.append(row)
            if not args.json:
                shown = "  ".join(
                    f"{name} {row[name]['tokens_per_s']:5.1f} tokens/s {row[name]['step_ms']:5.1f} ms/step"
                    f" ({row[name]['path']})"
                    for name in sides
                )
                print(f"round {i + 1}  load {row['load']:.2f}  {shown}", flush=True)
        if args.torch_compile:
            tokens["compiled"], speed, first = compiled_run(copied, prompt, args.new_tokens)
            compiled = {"load": os.getloadavg()[0], "tokens_per_s": speed, "first_token_s": first}
            if not args.json:
                print(
                    f"torch.compile  load {compiled['load']:.2f}  {speed:.1f} tokens/s, first token after {first:.1f} s"
                )
    first = next(iter(sides))
    same = {name: t == tokens[first] for name, t in tokens.items() if name != first}
    flags = sorted({f for f in cpu_flags().split() if f in ("avx2", "avx512_bf16", "amx_bf16")})
    report = {"model": "smollm2-135m", "position": args.position, "dtype": args.dtype, "new_tokens": args.new_tokens}
    report |= {"rounds": rounds}
    report |= {"torch_compile": compiled if args.torch_compile else None, "same_tokens": same}
    report |= {"replaced_norms": len(norms), "cpu_flags": flags, "threads": torch.get_num_threads()}
    print(
        json.dumps(report, indent=2) if args.json else f"the {first} tokens: {same}; {len(norms)} norms; flags {flags}"
    )


if __name__ == "__main__":
    main()
