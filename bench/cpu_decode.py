"""CPU decoding, gptzoo vs Hugging Face transformers vs llama.cpp, on the same weights and tokens.

For each model (an HF directory from ``gptzoo fetch NAME``) and precision, the three sides load the
same weights — llama.cpp from GGUF files that llama.cpp's own ``convert_hf_to_gguf.py`` made of
that directory (``NAME-f32.gguf``, ``NAME-bf16.gguf``, ``NAME-q8_0.gguf`` in ``--gguf-dir``, and
``NAME-q4_1.gguf``, which its quantizer makes of the F32 file with every tensor Q4_1 but the head,
Q8_0: gptzoo's int4 mix) — and
decode the same prompt ids greedily, batch 1, ``--new-tokens`` tokens, no EOS stop, alternating
runs, median. Reported: decode tokens/s, prefill tokens/s of a ``--prefill``-token prompt, whether
the greedy tokens agree, and the memory-bandwidth bound (read bandwidth measured here over the
bytes of weights one token reads). ``int8`` runs gptzoo's weight-only int8 against llama.cpp's
Q8_0, ``int4`` gptzoo's Q4_1 blocks and int8 head against llama.cpp's Q4_1 with a Q8_0 head
(transformers has no CPU path for either); ``--gguf-type int4=q4_0`` compares with another GGUF
(``NAME-q4_0.gguf``) instead.

``--load`` runs a competing CPU-bound process (a one-thread matmul loop) during the measurement,
as when another job shares the cores. ``--perplexity`` adds each precision's perplexity on held-out
text (Python's own documentation, pydoc_data.topics), gptzoo's (in one forward, and fed token by token
through the decoding path) and llama.cpp's.

    python bench/cpu_decode.py --gguf-dir DIR [--models smollm2-135m gemma3-270m]
        [--precisions float32 bfloat16 int8 int4] [--runs 3] [--new-tokens 128] [--prefill 512]
        [--gguf-type PRECISION=TYPE ...] [--load] [--perplexity] [--json]

llama.cpp comes from ``llama-cpp-python`` (built from source, bench/README.md); without it, the
llama.cpp columns stay empty.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from gptzoo.defaults import PRECISIONS
from gptzoo.fetch import cache_root
from gptzoo.inference.decode_plan import compile_step
from gptzoo.inference.generate import generate
from gptzoo.inference.matvec import native_decoding
from gptzoo.inference.native import cpu_flags
from gptzoo.loader import load_model

GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "int8": "q8_0", "int4": "q4_1"}
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village by the sea, there"
LOAD_SCRIPT = """import os, torch
torch.set_num_threads(1)
a, parent = torch.randn(512, 512), os.getppid()
while os.getppid() == parent:  # ends with the benchmark, however that ends
    a @ a
"""


def read_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes per second read by a sum over a tensor far larger than the caches (all threads)."""
    src = torch.ones(nbytes // 4)
    src.sum()
    best = min(_seconds(lambda: src.sum()) for _ in range(repeats))
    return nbytes / best


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights one decoding step reads: every parameter and buffer once, except the rows
    of a token embedding that is not also the head (untied, or quantized apart) and is only looked up."""
    seen, total = set(), 0
    embedding = model.wte.weight
    head = getattr(model.lm_head, "weight", None)
    for t in (*model.parameters(), *model.buffers()):
        if id(t) in seen or (t is embedding and head is not embedding):
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def held_out_ids(tokenizer: transformers.PreTrainedTokenizerBase, n: int) -> list[int]:
    import pydoc_data.topics

    text = "\n".join(pydoc_data.topics.topics.values())
    return tokenizer(text[: n * 12], add_special_tokens=False)["input_ids"][:n]


class Llama:
    """llama.cpp through llama-cpp-python, with all cores, like the other sides, the weights read into
    its own memory (llama.cpp's --no-mmap): mapped from the file, its decoding speed follows the state
    of the file's pages in the page cache (31 against 42-44 tokens/s for SmolLM2-135M float32 on one
    machine, the same file before and after a fresh copy); read, it runs at the faster speed each time."""

    def __init__(self, path: Path, n_ctx: int, logits_all: bool = False, repack: bool = True) -> None:
        import llama_cpp

        if not repack:  # llama.cpp's --no-repack; llama-cpp-python has no argument for it
            defaults = llama_cpp.llama_model_default_params

            def no_repack() -> llama_cpp.llama_model_params:
                params = defaults()
                params.use_extra_bufts = False
                return params

            llama_cpp.llama.llama_cpp.llama_model_default_params = no_repack
        threads = torch.get_num_threads()
        self.llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=threads,
            n_threads_batch=threads,
            logits_all=logits_all,
            use_mmap=False,
            verbose=False,
        )

    def greedy(self, ids: list[int], n: int) -> list[int]:
        out = []
        for token in self.llm.generate(ids, temp=0.0, top_k=1, reset=True):
            out.append(token)
            if len(out) == n:
                break
        return out

    def prefill(self, ids: list[int]) -> None:
        self.llm.reset()
        self.llm.eval(ids)

    def nll(self, ids: list[int]) -> float:
        """Mean negative log-likelihood of ids[1:] given what precedes each."""
        self.prefill(ids)
        logits = torch.from_numpy(self.llm.scores[: len(ids) - 1]).float()
        return float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])))


def ours_nll(model: torch.nn.Module, ids: list[int]) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, :-1].float()
    return float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])))


def ours_decoded_nll(model: torch.nn.Module, ids: list[int]) -> float:
    """ours_nll with the text fed one token at a time through the decoding path generate takes (the
    native step and its kernels: for int8, products of int16 input blocks), not one forward."""
    with torch.no_grad():
        cache = model.init_cache(1, len(ids))
        logits = [model(torch.tensor([ids[:1]]), cache)[0, -1]]
        with native_decoding(model) as tuner:
            step = compile_step(model, cache, 1)[0] if tuner is not None else None
            for token in ids[1:-1]:
                t = torch.tensor([[token]])
                logits.append((step(t) if step is not None else model(t, cache))[0, -1])
    return float(torch.nn.functional.cross_entropy(torch.stack(logits).float(), torch.tensor(ids[1:])))


def measure(name: str, precision: str, args: argparse.Namespace, bandwidth: float) -> dict:
    directory = cache_root() / name
    if not (directory / "config.json").exists():
        sys.exit(f"{directory} has no model: run `gptzoo fetch {name}` first")
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    prompt = tokenizer(PROMPT, add_special_tokens=False)["input_ids"][: args.prompt_tokens]
    long_prompt = held_out_ids(tokenizer, args.prefill)
    ours = load_model(hf=directory, dtype=precision).model.eval()
    chosen = PRECISIONS[precision]
    sides: dict[str, dict[str, Callable[[], object]]] = {}
    n = args.new_tokens
    sides["gptzoo"] = {
        "decode": lambda: generate(ours, [prompt], n)[0],
        "prefill": lambda: ours(torch.tensor([long_prompt]), ours.init_cache(1, len(long_prompt)), logits_to_keep=1),
    }
    hf = None
    if not chosen.quantized:  # transformers has no CPU int8 or 4-bit path
        hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, chosen.dtype)).eval()
        ids = torch.tensor([prompt])
        sides["transformers"] = {
            "decode": lambda: hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(prompt) :].tolist(),
            "prefill": lambda: hf(torch.tensor([long_prompt]), logits_to_keep=1),
        }
    gguf = args.gguf_dir / f"{name}-{args.gguf_types[precision]}.gguf" if args.gguf_dir else None
    llama = None
    if gguf is not None and gguf.exists():
        llama = Llama(gguf, n_ctx=max(args.prefill, len(prompt) + n) + 8, repack=not args.no_repack)
        sides["llama.cpp"] = {"decode": lambda: llama.greedy(prompt, n), "prefill": lambda: llama.prefill(long_prompt)}
    load_at_start = os.getloadavg()[0]
    tokens, times = {}, {side: {"decode": [], "prefill": []} for side in sides}
    with torch.no_grad():
        for side, run in sides.items():  # warm-up, and the tokens to compare
            tokens[side] = run["decode"]()
            run["prefill"]()
        for _ in range(args.runs):
            for side, run in sides.items():
                for what in ("decode", "prefill"):
                    times[side][what].append(_seconds(run[what]))
    weight_bytes = bytes_per_token(ours)
    row = {
        "model": name,
        "precision": precision,
        "weight_bytes_per_token": weight_bytes,
        "bandwidth_bound_tokens_per_s": bandwidth / weight_bytes,
        "decode_tokens_per_s": {s: n / statistics.median(t["decode"]) for s, t in times.items()},
        "decode_tokens_per_s_by_round": {s: [n / seconds for seconds in t["decode"]] for s, t in times.items()},
        "load_at_start_and_end": [load_at_start, os.getloadavg()[0]],
        "prefill_tokens_per_s": {s: len(long_prompt) / statistics.median(t["prefill"]) for s, t in times.items()},
        "same_tokens_as_gptzoo": {s: tokens[s] == tokens["gptzoo"] for s in sides if s != "gptzoo"},
        "gguf": gguf.name if llama is not None else None,
    }
    if args.perplexity:
        size = args.prefill  # windows of text the prefill did not use
        text = held_out_ids(tokenizer, size * (args.windows + 1))
        windows = [text[size * k : size * (k + 1)] for k in range(1, args.windows + 1)]
        row["perplexity"] = {
            "gptzoo": math.exp(statistics.mean(ours_nll(ours, ids) for ids in windows)),
            "gptzoo decoded, first window": math.exp(ours_decoded_nll(ours, windows[0])),
        }
        if gguf is not None and gguf.exists():
            del llama, sides["llama.cpp"]
            scorer = Llama(gguf, n_ctx=size + 8, logits_all=True, repack=not args.no_repack)
            row["perplexity"]["llama.cpp"] = math.exp(statistics.mean(scorer.nll(ids) for ids in windows))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gguf-dir", type=Path, help="where NAME-f32.gguf, NAME-bf16.gguf, NAME-q8_0.gguf, NAME-q4_1.gguf are"
    )
    parser.add_argument(
        "--gguf-type",
        action="append",
        default=[],
        metavar="PRECISION=TYPE",
        help="llama.cpp's file for a precision: NAME-TYPE.gguf (e.g. int4=q4_0)",
    )
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    parser.add_argument("--precisions", nargs="+", default=list(GGUF_TYPES), choices=list(GGUF_TYPES))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=14)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--load", action="store_true", help="run a competing one-thread matmul loop meanwhile")
    parser.add_argument("--perplexity", action="store_true", help="also perplexity on held-out text")
    parser.add_argument(
        "--windows", type=int, default=1, help="--perplexity over this many windows of --prefill tokens (default 1)"
    )
    parser.add_argument(
        "--no-repack",
        action="store_true",
        help="llama.cpp without its repacked weight buffers (its --no-repack): the Q8_0 GGUF segfaults with them on "
        "an AMX CPU in llama-cpp-python 0.3.36",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.gguf_types = GGUF_TYPES | dict(pair.split("=", 1) for pair in args.gguf_type)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    bandwidth = read_bandwidth()
    load = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT]) if args.load else None
    if not args.json:  # each row as soon as it is measured: a run cut short keeps what it measured
        print(
            f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, transformers "
            f"{transformers.__version__}; read bandwidth {bandwidth / 1e9:.1f} GB/s; "
            f"{'with' if args.load else 'no'} competing load"
        )
        print(
            "| model | precision | side | decode tokens/s | vs transformers | vs llama.cpp | gptzoo / side by round "
            "| % of bound | prefill tok/s | load |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    rows = []
    try:
        for name in args.models:
            for precision in args.precisions:
                rows.append(measure(name, precision, args, bandwidth))
                if not args.json:
                    print_row(rows[-1])
    finally:
        if load is not None:
            load.kill()
    if args.json:
        result = {
            "cpu_flags": cpu_flags(),
            "cpu": cpu_name(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "read_bandwidth_GBps": bandwidth / 1e9,
            "competing_load": args.load,
            "rows": rows,
        }
        print(json.dumps(result, indent=2))


def cpu_name() -> str:
    if not os.path.exists("/proc/cpuinfo"):
        return "?"
    return next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line), "?")


def print_row(r: dict) -> None:
    decode, prefill = r["decode_tokens_per_s"], r["prefill_tokens_per_s"]
    rounds = r["decode_tokens_per_s_by_round"]
    load = "{:.2f} / {:.2f}".format(*r["load_at_start_and_end"])
    for side, tps in decode.items():
        vs_hf = f"{tps / decode['transformers']:.2f}x" if "transformers" in decode else "-"
        vs_llama = f"{tps / decode['llama.cpp']:.2f}x" if "llama.cpp" in decode else "-"
        by_round = (
            "-"
            if side == "gptzoo"
            else ", ".join(f"{ours / it:.2f}x" for ours, it in zip(rounds["gptzoo"], rounds[side], strict=True))
        )
        same = "" if side == "gptzoo" else ("" if r["same_tokens_as_gptzoo"][side] else " (other tokens)")
        print(
            f"| {r['model']} | {r['precision']} | {side}{same} | {tps:.1f} | {vs_hf} | {vs_llama} | {by_round} | "
            f"{100 * tps / r['bandwidth_bound_tokens_per_s']:.0f}% | {prefill[side]:.0f} | {load} |"
        )
    if "perplexity" in r:
        print(f"| {r['model']} | {r['precision']} | perplexity | {r['perplexity']} | | | | | | |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
