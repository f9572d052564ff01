"""Training speed, gptzoo vs Hugging Face transformers, side by side in one process.

GPT-2 small's shape (HF initializes the weights; gptzoo loads the very same tensors; HF's dropout off,
as gptzoo has none), the same plain loop for both: forward, the mean float32 cross-entropy of the
logits, backward, gradient clipping, fused AdamW step. Same batch, same tokens. Each side computes
its loss as its library trains: HF as its ForCausalLMLoss does (the logits cast to float32, then
F.cross_entropy), gptzoo with its trainer's loss_of (gptzoo.training.loss, blockwise). Steps
alternate between the models after a warm-up step each; the median step time gives tokens/s, and
MFU is the achieved training FLOP/s (6N + attention, gptzoo.flops's count x 3) over a measured peak
matmul FLOP/s in the same precision.

    python bench/train.py [--batch 4] [--seq-len 128] [--steps 3] [--precision float32 bfloat16]
    [--compile] [--keep-freed-memory] [--nanogpt DIR] [--device cuda] [--json]

--keep-freed-memory sets glibc's malloc as ``gptzoo train`` sets it on a CPU
(gptzoo.training.host_memory): for the whole process, so for every side. --nanogpt DIR adds a
third side: the model.py of a nanoGPT checkout (github.com/karpathy/nanoGPT), with the same
weights, its own loss, in the same loop (nanoGPT's train.py runs this loop, with fused AdamW
on CUDA).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

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


SHOWN = {"hf": "HF", "gptzoo": "gptzoo", "nanogpt": "nanoGPT"}


def nanogpt_module(checkout: Path) -> ModuleType:
    """nanoGPT's model.py, imported from a checkout."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", checkout / "model.py")
    if spec is None or spec.loader is None or not (checkout / "model.py").is_file():
        raise SystemExit(f"--nanogpt {checkout}: no model.py there; give a nanoGPT checkout")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nanogpt_of(nanogpt: ModuleType, hf: transformers.GPT2LMHeadModel) -> torch.nn.Module:
    """nanoGPT's GPT with hf's very weights, copied as its from_pretrained copies them (Conv1D weights transposed)."""
    config = hf.config
    model = nanogpt.GPT(
        nanogpt.GPTConfig(
            block_size=config.n_positions,
            vocab_size=config.vocab_size,
            n_layer=config.n_layer,
            n_head=config.n_head,
            n_embd=config.n_embd,
            dropout=0.0,
            bias=True,
        )
    )
    theirs = hf.state_dict()
    transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith(".attn.bias"):  # nanoGPT's causal mask buffer (absent with flash attention)
                continue
            source = theirs[name]
            tensor.copy_(source.t() if name.endswith(transposed) else source)
    return model


def nanogpt_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """nanoGPT's own loss: its forward's F.cross_entropy of the logits (its train.py's loop)."""
    return model(x, y)[1]


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
    parser.add_argument("--compile", action="store_true", help="torch.compile every model")
    parser.add_argument(
        "--keep-freed-memory", action="store_true", help="malloc as gptzoo train sets it on a CPU, for every side"
    )
    parser.add_argument(
        "--nanogpt", metavar="DIR", type=Path, help="a nanoGPT checkout: its model.py trained as a third side"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    kept = keep_freed_memory() if args.keep_freed_memory else False
    nanogpt = nanogpt_module(args.nanogpt) if args.nanogpt else None
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    x = torch.randint(0, 50257, (args.batch, args.seq_len + 1), generator=torch.Generator().manual_seed(1)).to(device)
    x, y = x[:, :-1].contiguous(), x[:, 1:].contiguous()
    others = ["hf", *(["nanogpt"] if nanogpt else [])]
    rows = []
    if not args.json:
        print(
            f"GPT-2 small shape, batch {args.batch} x {args.seq_len} tokens, fused AdamW, {args.device}, "
            f"compile={args.compile}, freed memory kept={kept}; "
            f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads"
        )
        names = [SHOWN[side] for side in [*others, "gptzoo"]]
        head = [
            "precision",
            *(f"{name} tokens/s" for name in names),
            *(f"gptzoo / {SHOWN[side]}" for side in others),
            *(f"{name} MFU" for name in names),
            "measured peak",
        ]
        print("| " + " | ".join(head) + " |")
        print("|" + " --- |" * len(head), flush=True)
    for precision in args.precision:
        # no dropout, as gptzoo's models have none: the same function on every side
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(tmp)
            ours = load_hf(tmp)
        models = {"hf": (hf, hf_loss), "gptzoo": (ours, loss_of)}
        if nanogpt:
            models["nanogpt"] = (nanogpt_of(nanogpt, hf), nanogpt_loss)
        steps = {}
        for side, (model, loss_fn) in models.items():
            model.to(device).train()
            forward = torch.compile(model) if args.compile else model
            steps[side] = step_fn(model, loss_fn, forward, x, y, precision, device)
        first = {name: step() for name, step in steps.items()}  # warm-up (and compilation)
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.steps):
            for name, step in steps.items():
                times[name].append(timed(step, device))
        tokens = args.batch * args.seq_len
        flops_per_step = TRAIN_FORWARD_RATIO * sum(forward_flops(ours, args.batch, args.seq_len).values())
        peak = measure_peak_flops(device, precision)
        tps = {name: tokens / statistics.median(t) for name, t in times.items()}
        row: dict[str, object] = {"precision": precision}
        for side in [*others, "gptzoo"]:
            row[f"{side}_tokens_per_s"] = tps[side]
            row[f"{side}_mfu"] = tps[side] / tokens * flops_per_step / peak
        for side in others:
            row[f"gptzoo_over_{side}"] = tps["gptzoo"] / tps[side]
        row.update({"step_seconds": times, "first_loss": first, "peak_tflops": peak / 1e12})
        rows.append(row)
        del hf, ours, models, steps
        if not args.json:
            cells = [
                precision,
                *(f"{tps[side]:.3g}" for side in [*others, "gptzoo"]),
                *(f"{tps['gptzoo'] / tps[side]:.2f}x" for side in others),
                *(f"{row[f'{side}_mfu']:.1%}" for side in [*others, "gptzoo"]),
                f"{peak / 1e9:.3g} GFLOP/s",
            ]
            print("| " + " | ".join(cells) + " |", flush=True)
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
