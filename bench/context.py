"""Batch-1 decoding speed as the context grows, a gated DeltaNet hybrid against full attention, gptzoo vs
Hugging Face transformers on the same weights.

Two models of about ``--width``'s size with random weights (transformers builds them from a config, saves them,
and gptzoo loads that directory): a Qwen3.5-shaped hybrid (three gated DeltaNet layers to one gated attention
layer) and its full-attention twin (every layer attention, the MLP widened to the hybrid's parameter count).
Each side extends one cache through the contexts (``--contexts``, a prefill each), and at each decodes
``--steps`` greedy tokens, timed one by one (median): gptzoo through its decoding step (compile_step, the
layers without a lowering run eagerly inside it), transformers through its forward with the cache. Rounds
alternate the order of the sides; each prints its load average, since other processes share the cores.
A hybrid's state does not grow, so its step should cost as much at 8,192 tokens as at 128; full attention's
reads every cached key.

    python bench/context.py [--rounds 2] [--contexts 128 512 2048 8192] [--steps 16] [--width 768]
        [--layers 12] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from gptzoo.hf import load_hf
from gptzoo.inference.decode_plan import compile_step
from gptzoo.inference.matvec import native_decoding
from gptzoo.inference.native import cpu_flags


def configs(width: int, layers: int) -> dict[str, transformers.PretrainedConfig]:
    """The hybrid and its full-attention twin of (nearly) the same parameter count."""
    heads = width // 128
    common = dict(
        vocab_size=32000,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 3),
        head_dim=128,
        linear_num_value_heads=heads,
        linear_num_key_heads=heads,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    )
    hybrid = transformers.Qwen3_5TextConfig(**common, intermediate_size=4 * width)
    with torch.device("meta"):
        count = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(hybrid).parameters())
        full = transformers.Qwen3_5TextConfig(
            **common, intermediate_size=4 * width, layer_types=["full_attention"] * layers
        )
        short = count - sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(full).parameters())
    full = transformers.Qwen3_5TextConfig(
        **common, intermediate_size=4 * width + short // (3 * width * layers), layer_types=["full_attention"] * layers
    )
    return {"hybrid": hybrid, "full": full}


def gptzoo_side(model: Any, ids: torch.Tensor, contexts: list[int], steps: int) -> list[float]:
    """Median milliseconds per decoding step at each context."""
    medians = []
    with torch.no_grad(), native_decoding(model):
        cache = model.init_cache(1, contexts[-1] + steps * len(contexts) + 1)
        done = 0
        for n in contexts:
            logits = model(ids[:, done:n], cache)
            done = n
            step, why = compile_step(model, cache, 1, split=True)
            assert step is not None, why
            token, times = logits[:, -1:].argmax(-1), []
            for _ in range(steps):
                start = time.perf_counter()
                token = step(token)[:, -1:].argmax(-1)
                times.append(time.perf_counter() - start)
            medians.append(1e3 * statistics.median(times))
    return medians


def transformers_side(model: Any, ids: torch.Tensor, contexts: list[int], steps: int) -> list[float]:
    medians = []
    with torch.no_grad():
        cache, done = None, 0
        for n in contexts:
            out = model(input_ids=ids[:, done:n], cache=cache, use_cache=True)
            cache, done = out.past_key_values, n
            token, times = out.logits[:, -1:].argmax(-1), []
            for _ in range(steps):
                start = time.perf_counter()
                out = model(input_ids=token, cache=cache, use_cache=True)
                cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
                times.append(time.perf_counter() - start)
            medians.append(1e3 * statistics.median(times))
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048, 8192])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    ids = torch.randint(0, 32000, (1, args.contexts[-1]), generator=torch.Generator().manual_seed(0))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = {}
        for kind, config in configs(args.width, args.layers).items():
            torch.manual_seed(0)
            theirs = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
            theirs.save_pretrained(Path(tmp) / kind)
            models[kind] = (load_hf(Path(tmp) / kind).eval(), theirs)
            params = sum(p.numel() for p in theirs.parameters())
            print(f"{kind}: {params / 1e6:.0f}M parameters, layers {config.layer_types}", file=sys.stderr)
        print(f"CPU flags: {cpu_flags()}, {os.cpu_count()} cores, torch {torch.__version__}", file=sys.stderr)
        for r in range(args.rounds):
            for kind, (ours, theirs) in models.items():
                sides = [("gptzoo", gptzoo_side, ours), ("transformers", transformers_side, theirs)]
                ms = {}
                for name, side, model in sides if r % 2 == 0 else sides[::-1]:
                    load = os.getloadavg()[0]
                    ms[name] = side(model, ids, args.contexts, args.steps)
                    print(f"round {r + 1} {kind} {name}: load {load:.2f}, ms/token {ms[name]}", file=sys.stderr)
                rows += [
                    {
                        "round": r + 1,
                        "model": kind,
                        "context": n,
                        "gptzoo_tok_s": 1e3 / ms["gptzoo"][i],
                        "transformers_tok_s": 1e3 / ms["transformers"][i],
                        "ratio": ms["transformers"][i] / ms["gptzoo"][i],
                        "load": load,
                    }
                    for i, n in enumerate(args.contexts)
                ]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| round | model | context | gptzoo tok/s | transformers tok/s | ratio | load |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['round']} | {row['model']} | {row['context']} | {row['gptzoo_tok_s']:.1f} | "
            f"{row['transformers_tok_s']:.1f} | {row['ratio']:.2f}x | {row['load']:.2f} |"
        )


if __name__ == "__main__":
    main()
