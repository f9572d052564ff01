"""Training speed, gptzoo vs Hugging Face transformers, side by side in one process.

GPT-2 small's shape (HF initializes the weights; gptzoo loads the very same tensors; HF's dropout off,
as gptzoo has none), the same plain loop for both: forward, the mean float32 cross-entropy of the
logits, backward, gradient clipping, fused AdamW step. Same batch, same tokens. Each side computes its
loss as its library trains: HF as its ForCausalLMLoss does (the logits cast to float32, then
F.cross_entropy), gptzoo with its trainer's loss_of (gptzoo.training.loss, blockwise). Steps alternate between the
two models after a warm-up step each; the median step time gives tokens/s, and MFU is the achieved
training FLOP/s (6N + attention, gptzoo.flops's count x 3) over a measured peak matmul FLOP/s in the
same precision.

    python bench/train.py [--batch 4] [--seq-len 128] [--steps 3] [--precision float32 bfloat16]
    [--compile] [--keep-freed-memory] [--device cuda] [--json]

--keep-freed-memory sets glibc's malloc as ``gptzoo train`` sets it on a CPU
(gptzoo.training.host_memory): for the whole process, so for both sides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import transformers

from gptzoo.flops import TRAIN_FORWARD_RATIO, forward_flops
from gptzoo.hf import load_hf
from gptzoo.training.host_memory import keep_freed_memory
from gptzoo.training.trainer import autocast, loss_of, measure_peak_flops

PRECISIONS = ("float32", "bfloat16")


def hf_loss(model: transformers.PreTrainedModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean float32 cross-entropy as transformers' ForCausalLMLoss computes it."""
    logits = model(x).logits
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))


def step_fn(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor],
    forward: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    precision: str,
    device: torch.device,
) -> Callable[[], float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> float:
        with autocast(precision, device):
            loss = loss_fn(forward, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def timed(step: Callable[[], float], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    parser.add_argument(
        "--keep-freed-memory", action="store_true", help="malloc as gptzoo train sets it on a CPU, for both sides"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    kept = keep_freed_memory() if args.keep_freed_memory else False
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    x = torch.randint(0, 50257, (args.batch, args.seq_len + 1), generator=torch.Generator().manual_seed(1)).to(device)
    x, y = x[:, :-1].contiguous(), x[:, 1:].contiguous()
    rows = []
    if not args.json:
        print(
            f"GPT-2 small shape, batch {args.batch} x {args.seq_len} tokens, fused AdamW, {args.device}, "
            f"compile={args.compile}, freed memory kept={kept}; "
            f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads"
        )
        print("| precision | HF tokens/s | gptzoo tokens/s | gptzoo / HF | HF MFU | gptzoo MFU | measured peak |")
        print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for precision in args.precision:
        # no dropout, as gptzoo's models have none: the same function on both sides
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(tmp)
            ours = load_hf(tmp)
        hf, ours = hf.to(device).train(), ours.to(device).train()
        hf_fwd = torch.compile(hf) if args.compile else hf
        ours_fwd = torch.compile(ours) if args.compile else ours
        steps = {
            "hf": step_fn(hf, hf_loss, hf_fwd, x, y, precision, device),
            "gptzoo": step_fn(ours, loss_of, ours_fwd, x, y, precision, device),
        }
        first = {name: step() for name, step in steps.items()}  # warm-up (and compilation)
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.steps):
            for name, step in steps.items():
                times[name].append(timed(step, device))
        tokens = args.batch * args.seq_len
        flops_per_step = TRAIN_FORWARD_RATIO * sum(forward_flops(ours, args.batch, args.seq_len).values())
        peak = measure_peak_flops(device, precision)
        tps = {name: tokens / statistics.median(t) for name, t in times.items()}
        rows.append(
            {
                "precision": precision,
                "hf_tokens_per_s": tps["hf"],
                "gptzoo_tokens_per_s": tps["gptzoo"],
                "ratio": tps["gptzoo"] / tps["hf"],
                "hf_mfu": tps["hf"] / tokens * flops_per_step / peak,
                "gptzoo_mfu": tps["gptzoo"] / tokens * flops_per_step / peak,
                "first_loss": first,
                "peak_tflops": peak / 1e12,
            }
        )
        del hf, ours, hf_fwd, ours_fwd, steps
        if not args.json:
            r = rows[-1]
            print(
                f"| {r['precision']} | {r['hf_tokens_per_s']:.3g} | {r['gptzoo_tokens_per_s']:.3g} | "
                f"{r['ratio']:.2f}x | "
                f"{r['hf_mfu']:.1%} | {r['gptzoo_mfu']:.1%} | {r['peak_tflops'] * 1000:.3g} GFLOP/s |",
                flush=True,
            )
    result = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "seq_len": args.seq_len,
        "compile": args.compile,
        "freed_memory_kept": kept,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
