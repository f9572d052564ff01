"""Batched decoding throughput, gptzoo vs Hugging Face transformers, side by side in one process.

B prompts of different lengths (left-padded on both sides), greedy, ``--new-tokens`` each, no EOS
stop; the total new tokens per second of the whole batch (prefill included), median of alternating
runs after a warm-up. Both sides must produce the same tokens for every row (checked, reported).

    python bench/batched.py [--model smollm2-135m] [--batches 8 32] [--dtype float32] [--runs 3]
        [--new-tokens 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import transformers

from gptzoo.fetch import cache_root
from gptzoo.hf import load_hf
from gptzoo.inference.generate import generate
from gptzoo.inference.native import cpu_flags


def prompts(tokenizer: transformers.PreTrainedTokenizerBase, batch: int) -> list[list[int]]:
    """``batch`` prompts of 4 to 40 tokens, cut from Python's own documentation."""
    import pydoc_data.topics

    text = " ".join(pydoc_data.topics.topics.values())
    ids = tokenizer(text[:200_000], add_special_tokens=False)["input_ids"]
    lengths = [4 + (7 * i) % 37 for i in range(batch)]
    return [ids[100 * i : 100 * i + n] for i, n in enumerate(lengths)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a name fetched with `gptzoo fetch`")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    directory = cache_root() / args.model
    if not (directory / "config.json").exists():
        sys.exit(f"{directory} has no model: run `gptzoo fetch {args.model}` first")
    dtype = getattr(torch, args.dtype)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    ours = load_hf(directory).eval().to(dtype)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    n = args.new_tokens
    rows = []
    for batch in args.batches:
        ps = prompts(tokenizer, batch)
        longest = max(map(len, ps))
        ids = torch.tensor([[pad] * (longest - len(p)) + p for p in ps])
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in ps])

        def run_hf(ids: torch.Tensor = ids, mask: torch.Tensor = mask, longest: int = longest) -> list[list[int]]:
            out = hf.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                eos_token_id=None,
                pad_token_id=pad,
            )
            return out[:, longest:].tolist()

        def run_ours(ps: list[list[int]] = ps) -> list[list[int]]:
            return generate(ours, ps, n)

        sides = {"transformers": run_hf, "gptzoo": run_ours}
        with torch.no_grad():
            tokens = {side: run() for side, run in sides.items()}
            times: dict[str, list[float]] = {side: [] for side in sides}
            for _ in range(args.runs):
                for side, run in sides.items():
                    start = time.perf_counter()
                    run()
                    times[side].append(time.perf_counter() - start)
        tps = {side: batch * n / statistics.median(t) for side, t in times.items()}
        same = sum(a == b for a, b in zip(tokens["gptzoo"], tokens["transformers"], strict=True))
        rows.append(
            {
                "batch": batch,
                "prompt_lengths": [len(p) for p in ps],
                "tokens_per_s": tps,
                "ratio": tps["gptzoo"] / tps["transformers"],
                "rows_with_same_tokens": same,
            }
        )
    result = {
        "model": args.model,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "cpu_flags": cpu_flags(),
        "new_tokens": n,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.model}, {args.dtype}, {n} new tokens per row, {torch.get_num_threads()} threads")
    print("| batch | transformers tokens/s | gptzoo tokens/s | gptzoo / transformers | rows with the same tokens |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        t = r["tokens_per_s"]
        print(
            f"| {r['batch']} | {t['transformers']:.1f} | {t['gptzoo']:.1f} | {r['ratio']:.2f}x | "
            f"{r['rows_with_same_tokens']} of {r['batch']} |"
        )


if __name__ == "__main__":
    main()
