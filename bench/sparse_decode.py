"""CPU decoding of the sparse families, gptzoo vs Hugging Face transformers, on the same random weights.

For each family, a random-init transformers model at a shape of ~0.5-1 B total parameters (its own
config class, saved once under ``--dir``) is loaded by both sides, which decode the same prompt greedily,
batch 1, ``--new-tokens`` tokens, in alternating rounds. Reported for every round: the load average
(``os.getloadavg``, other processes share the cores), decode tokens/s (prefill excluded: the median time
from one new token to the next), whether the greedy tokens agree, and the bound memory bandwidth puts on
decoding: the bytes one token reads (gptzoo.decode_cost at the mean cache length: the active parameters
— router, shared experts and top_k experts of each layer, attention, norms, the head — and the cache),
against the read bandwidth measured here.

transformers runs each of its experts implementations in ``--hf-experts`` (a loop over the chosen experts,
"eager", and "grouped_mm", its default); the ratio is against the faster of them in that round.

    python bench/sparse_decode.py [--families mixtral qwen3_moe olmoe deepseek_v2 deepseek_v3 gpt_oss]
        [--rounds 3] [--new-tokens 64] [--dtype float32] [--hf-experts eager grouped_mm]
        [--dir /tmp/gptzoo-sparse] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

from gptzoo.decode_cost import decode_cost
from gptzoo.hf import load_hf
from gptzoo.inference.generate import generate
from gptzoo.inference.native import cpu_flags

sys.path.insert(0, str(Path(__file__).parent))
from cpu_decode import read_bandwidth  # noqa: E402

COMMON = {"vocab_size": 32000, "hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 16}
SHAPES: dict[str, tuple[type, dict]] = {
    "mixtral": (
        transformers.MixtralConfig,
        {
            **COMMON,
            "num_key_value_heads": 4,
            "intermediate_size": 1536,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
        },
    ),
    "qwen3_moe": (
        transformers.Qwen3MoeConfig,
        {
            **COMMON,
            "num_key_value_heads": 4,
            "head_dim": 64,
            "intermediate_size": 2816,
            "moe_intermediate_size": 512,
            "num_experts": 32,
            "num_experts_per_tok": 4,
            "norm_topk_prob": True,
        },
    ),
    "olmoe": (
        transformers.OlmoeConfig,
        {**COMMON, "intermediate_size": 512, "num_experts": 32, "num_experts_per_tok": 4, "pad_token_id": 0},
    ),
    "deepseek_v2": (
        transformers.DeepseekV2Config,
        {
            **COMMON,
            "intermediate_size": 2816,
            "moe_intermediate_size": 512,
            "n_routed_experts": 32,
            "num_experts_per_tok": 4,
            "n_shared_experts": 2,
            "first_k_dense_replace": 1,
            "num_key_value_heads": 16,
            "q_lora_rank": None,
            "kv_lora_rank": 256,
            "qk_nope_head_dim": 64,
            "qk_rope_head_dim": 32,
            "v_head_dim": 64,
        },
    ),
    "deepseek_v3": (
        transformers.DeepseekV3Config,
        {
            **COMMON,
            "intermediate_size": 2816,
            "moe_intermediate_size": 512,
            "n_routed_experts": 32,
            "num_experts_per_tok": 4,
            "n_group": 4,
            "topk_group": 2,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "num_key_value_heads": 16,
            "q_lora_rank": 384,
            "kv_lora_rank": 256,
            "qk_nope_head_dim": 64,
            "qk_rope_head_dim": 32,
            "v_head_dim": 64,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
    "gpt_oss": (
        transformers.GptOssConfig,
        {
            **COMMON,
            "num_key_value_heads": 4,
            "head_dim": 64,
            "intermediate_size": 512,
            "num_local_experts": 32,
            "num_experts_per_tok": 4,
            "sliding_window": 16,
            "pad_token_id": 0,
        },
    ),
}
"""Each family's shape: 12 layers of width 1024, 16 heads, a vocabulary of 32000, experts making 0.5-1 B in all."""


ROUTER_STD = {"deepseek_v3": 2 / COMMON["hidden_size"] ** 0.5}
"""Router weights' spread where 1 is too wide: sigmoid scores of logits of spread 32 saturate to 1.0, and
experts tied at 1.0 are chosen by how each side breaks ties (torch.topk's order is unspecified)."""


def checkpoint(family: str, root: Path) -> Path:
    """The family's random checkpoint (routers drawn wide, so that routing rests on margins), made once."""
    path = root / family
    if not (path / "config.json").exists():
        config_cls, fields = SHAPES[family]
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config_cls(**fields), dtype=torch.float32)
        with torch.no_grad():
            for key, p in model.named_parameters():
                if key.endswith("gate.weight") or key.endswith("router.weight"):
                    p.normal_(std=ROUTER_STD.get(family, 1.0))
        model.save_pretrained(path)
    return path


def ours(model: torch.nn.Module, prompt: list[int], n: int) -> tuple[list[int], float]:
    """gptzoo's greedy tokens and median milliseconds from one new token to the next."""
    times: list[float] = []

    def on_step(new: list[int | None]) -> list[int]:
        times.append(time.perf_counter())
        return []

    tokens = generate(model, [prompt], n, on_step=on_step)[0]
    return tokens, 1e3 * statistics.median(b - a for a, b in zip(times, times[1:], strict=False))


class Timer(transformers.LogitsProcessor):
    """Records when transformers asks for each new token's logits to be processed."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return scores


def theirs(model: transformers.PreTrainedModel, prompt: list[int], n: int) -> tuple[list[int], float]:
    timer = Timer()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            logits_processor=transformers.LogitsProcessorList([timer]),
        )
    steps = [b - a for a, b in zip(timer.times, timer.times[1:], strict=False)]
    return out[0, len(prompt) :].tolist(), 1e3 * statistics.median(steps)


def measure(family: str, args: argparse.Namespace, bandwidth: float) -> dict:
    path = checkpoint(family, args.dir)
    dtype = getattr(torch, args.dtype)
    mine = load_hf(path).to(dtype).eval()
    hfs = {
        impl: transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, experts_implementation=impl).eval()
        for impl in args.hf_experts
    }
    prompt = torch.randint(0, COMMON["vocab_size"], (16,), generator=torch.Generator().manual_seed(1)).tolist()
    cost = decode_cost(mine, len(prompt) + args.new_tokens // 2, dtype)
    read = sum(part["bytes"] for part in cost.values())
    total = sum(p.numel() for p in mine.parameters())
    rounds = []
    for _ in range(args.rounds):
        a_tokens, a_ms = ours(mine, prompt, args.new_tokens)
        sides = {impl: theirs(hf, prompt, args.new_tokens) for impl, hf in hfs.items()}
        fastest = min(ms for _, ms in sides.values())
        rounds.append(
            {
                "load": os.getloadavg()[0],
                "gptzoo_tok_s": 1e3 / a_ms,
                "transformers_tok_s": {impl: 1e3 / ms for impl, (_, ms) in sides.items()},
                "ratio": fastest / a_ms,
                "same_tokens": all(a_tokens == tokens for tokens, _ in sides.values()),
            }
        )
    return {
        "family": family,
        "total_params": total,
        "bytes_per_token": read,
        "bound_tok_s": bandwidth / read,
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--hf-experts", nargs="+", default=["eager", "grouped_mm"])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/gptzoo-sparse"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    bandwidth = read_bandwidth()
    rows = [measure(family, args, bandwidth) for family in args.families]
    result = {
        "cpu_flags": cpu_flags(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": args.dtype,
        "read_bandwidth_GBps": bandwidth / 1e9,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{args.dtype}, {torch.get_num_threads()} threads, torch {torch.__version__}, transformers "
        f"{transformers.__version__}; read bandwidth {bandwidth / 1e9:.1f} GB/s; flags {cpu_flags()}"
    )
    print(f"| family | total params | MB read a token | bound tok/s | round | load | gptzoo tok/s | transformers tok/s "
          f"({' / '.join(args.hf_experts)}) | ratio | of bound | same tokens |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        for i, x in enumerate(r["rounds"], 1):
            print(
                f"| {r['family']} | {r['total_params'] / 1e6:.0f}M | {r['bytes_per_token'] / 1e6:.0f} | "
                f"{r['bound_tok_s']:.1f} | {i} | {x['load']:.2f} | {x['gptzoo_tok_s']:.1f} | "
                f"{' / '.join(f'{v:.1f}' for v in x['transformers_tok_s'].values())} | {x['ratio']:.2f}x | "
                f"{100 * x['gptzoo_tok_s'] / r['bound_tok_s']:.0f}% | {'yes' if x['same_tokens'] else 'no'} |"
            )


if __name__ == "__main__":
    main()
