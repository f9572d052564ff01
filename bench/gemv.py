"""The native few-row products alone: weight bytes and weights per second for each weight format.

For each shape (SmolLM2-135M's: the tied 49152 x 576 head, the MLP's 1536 x 576 and 576 x 1536, the
attention's 576 x 576) and each format (float32, bfloat16, int8, int4), enough copies of the weight
to exceed the caches are multiplied by one input row in turn, three passes, the fastest kept; ``hot``
repeats one copy instead (the weight in the cache: what the kernel computes, without memory).

    python bench/gemv.py [--threads 1 2] [--hot]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from gptzoo.inference.matvec import KINDS
from gptzoo.inference.native import library, unavailable_reason
from gptzoo.inference.quantize import QUANTIZED

SHAPES = ((49152, 576), (1536, 576), (576, 1536), (576, 576))
FORMATS = ("float32", "bfloat16", "int8", "int4")
CACHE_BYTES = 600_000_000
"""More weight bytes than the caches hold (the machines here have up to 480 MB of L3)."""


def weight(fmt: str, out: int, inp: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.dtype]:
    """The weight (and its scales) the kernels take for ``fmt``, and the activations' dtype."""
    linear = nn.Linear(inp, out, bias=False)
    if fmt in QUANTIZED:
        q = QUANTIZED[fmt].from_linear(linear)
        return q.qweight, q.scale, torch.float32
    dtype = getattr(torch, fmt)
    return linear.weight.detach().to(dtype).contiguous(), None, dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--hot", action="store_true", help="one copy of each weight, in the cache")
    args = parser.parse_args()
    lib = library()
    if lib is None:
        raise SystemExit(f"no native kernels: {unavailable_reason()}")
    print("| format | out x in | threads | us a product | GB/s | Gweights/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for fmt in FORMATS:
        for out, inp in SHAPES:
            w, scale, act = weight(fmt, out, inp)
            nbytes = w.numel() * w.element_size() + (0 if scale is None else scale.numel() * scale.element_size())
            copies = (
                [(w, scale)] if args.hot else [weight(fmt, out, inp)[:2] for _ in range(max(1, CACHE_BYTES // nbytes))]
            )
            x, y = torch.randn(1, inp).to(act), torch.empty(1, out, dtype=act)
            repeats = 200 if args.hot else 1
            for threads in args.threads:
                passes = []
                for _ in range(3):
                    start = time.perf_counter()
                    for _ in range(repeats):
                        for cw, cs in copies:
                            lib.gemv(
                                KINDS[cw.dtype],
                                cw.data_ptr(),
                                None if cs is None else cs.data_ptr(),
                                None,
                                KINDS[act],
                                x.data_ptr(),
                                KINDS[act],
                                y.data_ptr(),
                                1,
                                out,
                                inp,
                                threads,
                            )
                    passes.append((time.perf_counter() - start) / (len(copies) * repeats))
                t = min(passes)
                rates = f"{nbytes / t / 1e9:.1f} | {out * inp / t / 1e9:.1f}"
                print(f"| {fmt} | {out} x {inp} | {threads} | {t * 1e6:.1f} | {rates} |", flush=True)


if __name__ == "__main__":
    main()
