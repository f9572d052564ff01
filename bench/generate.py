"""Greedy decoding speed, gptzoo vs Hugging Face transformers, side by side in one process.

GPT-2 small's shape with random weights (HF initializes them, gptzoo loads the very same tensors
through its GPT-2 weight map), batch 1, a 16-token prompt, 128 new tokens, greedy, no EOS stop.
Each configuration runs alternately, after a warm-up; the median of the timed runs is reported,
as tokens/s and as the gptzoo/HF ratio (the machine is shared and noisy: read the ratio).

The memory-bandwidth bound: at batch 1 every weight is read once per token, so tokens/s cannot
exceed (copy bandwidth) / (bytes of weights). Copy bandwidth is measured here by copying a 512 MiB
tensor and counting the bytes read and written.

    python bench/generate.py [--runs 3] [--new-tokens 128] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch
import transformers

from gptzoo.hf import load_hf
from gptzoo.inference.generate import generate


def copy_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes per second moved by a large tensor copy (read + write)."""
    src = torch.empty(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * nbytes / min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    hf32 = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf32.save_pretrained(tmp)
        ours32 = load_hf(tmp).eval()
    prompt = torch.randint(0, 50257, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(1))
    bandwidth = copy_bandwidth()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        hf, ours = hf32.to(dtype), ours32.to(dtype)
        n = args.new_tokens

        def run_hf(hf: torch.nn.Module = hf, n: int = n) -> list[int]:
            out = hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                eos_token_id=None,
                pad_token_id=0,
            )
            return out[0, prompt.shape[1] :].tolist()

        def run_ours(ours: torch.nn.Module = ours, n: int = n) -> list[int]:
            return generate(ours, prompt.tolist(), n)[0]

        times: dict[str, list[float]] = {"hf": [], "gptzoo": []}
        tokens = {"hf": run_hf(), "gptzoo": run_ours()}  # warm-up, and the outputs to compare
        for _ in range(args.runs):
            for name, run in (("hf", run_hf), ("gptzoo", run_ours)):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        weight_bytes = sum(p.numel() * p.element_size() for p in ours.parameters())
        tps = {name: n / statistics.median(t) for name, t in times.items()}
        rows.append(
            {
                "dtype": str(dtype).removeprefix("torch."),
                "hf_tokens_per_s": tps["hf"],
                "gptzoo_tokens_per_s": tps["gptzoo"],
                "ratio": tps["gptzoo"] / tps["hf"],
                "same_tokens": tokens["hf"] == tokens["gptzoo"],
                "weight_bytes": weight_bytes,
                "bandwidth_bound_tokens_per_s": bandwidth / weight_bytes,
            }
        )
    result = {
        "threads": torch.get_num_threads(),
        "copy_bandwidth_GBps": bandwidth / 1e9,
        "new_tokens": args.new_tokens,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"GPT-2 small shape, batch 1, {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens, greedy; "
        f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"copy bandwidth (read + write): {bandwidth / 1e9:.1f} GB/s")
    print("| dtype | HF tokens/s | gptzoo tokens/s | gptzoo / HF | same greedy tokens | weights | bandwidth bound |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['dtype']} | {r['hf_tokens_per_s']:.1f} | {r['gptzoo_tokens_per_s']:.1f} | {r['ratio']:.2f}x | "
            f"{r['same_tokens']} | {r['weight_bytes'] / 2**20:.0f} MiB | "
            f"{r['bandwidth_bound_tokens_per_s']:.1f} tokens/s |"
        )


if __name__ == "__main__":
    main()
