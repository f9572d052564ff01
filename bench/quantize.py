"""How long ``--dtype int4``'s block search takes: every plain linear of a model but its head (which int4 holds
in int8) made an Int4Linear, timed whole, several runs, each with the load; ``--load`` runs a competing
one-thread matmul loop meanwhile (cpu_decode.py's), as a machine shared with another job has.

    python bench/quantize.py [--model smollm2-135m] [--runs 3] [--load] [--json]
    python bench/before_after.py --base REV --rounds 3 quantize [-- --load]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
from cpu_decode import LOAD_SCRIPT
from torch import nn

from gptzoo.inference.native import cpu_flags
from gptzoo.inference.quantize import HEAD, Int4Linear
from gptzoo.loader import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="a model load_model finds (default smollm2-135m)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--load", action="store_true", help="run a competing one-thread matmul loop meanwhile")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model = load_model(args.model, dtype="float32").model
    linears = [m for name, m in model.named_modules() if type(m) is nn.Linear and name != HEAD]
    fit = [m for m in linears if Int4Linear.fits(m)]
    load = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT]) if args.load else None
    rows = []
    try:
        for run in range(args.runs):
            start = time.perf_counter()
            for linear in fit:
                Int4Linear.from_linear(linear)
            rows.append({"run": run + 1, "seconds": time.perf_counter() - start, "load": os.getloadavg()[0]})
            if not args.json:
                print(f"run {run + 1}: {rows[-1]['seconds']:.2f} s (load {rows[-1]['load']:.2f})", flush=True)
    finally:
        if load is not None:
            load.kill()
    report = {
        "model": args.model,
        "linears": len(fit),
        "weights": sum(m.weight.numel() for m in fit),
        "threads": torch.get_num_threads(),
        "competing_load": args.load,
        "cpu_flags": cpu_flags(),
        "rows": rows,
        "best_seconds": min(row["seconds"] for row in rows),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{args.model}: {report['weights']:,} weights in {len(fit)} linears, best {report['best_seconds']:.2f} s")


if __name__ == "__main__":
    main()
