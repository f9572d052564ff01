"""``gptzoo serve`` under concurrent clients: continuous batching against the same requests sent one by one.

Starts ``gptzoo serve MODEL`` (SmolLM2-135M by default) on a free loopback port, then, in each round and
for each number of clients C in ``--clients``, sends C streamed greedy completions (``--new-tokens`` each,
distinct prompts) through the ``openai`` client two ways, in alternating order: (sequential) one after the
other; (concurrent) all at once, each from its own thread. Every round prints, for each way, the load
average before it, the aggregate new tokens per second (all tokens / wall time), the time to first token
(mean and worst) and whether the concurrent texts equal the sequential ones.

    python bench/serve.py [--model smollm2-135m] [--rounds 3] [--clients 1,4,8,16] [--new-tokens 64] [--json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any

import openai

from gptzoo.inference.native import cpu_flags

TOPICS = ["the sea", "a library", "mountains", "a robot", "the moon", "bread", "a river", "winter"]


def prompt(i: int) -> str:
    return f"Request {i}: a short story about {TOPICS[i % len(TOPICS)]}. Once upon a time,"


def start(model: str, pythonpath: str | None = None) -> tuple[subprocess.Popen[str], int]:
    """``gptzoo serve MODEL`` on a free port (gptzoo imported through ``pythonpath`` when given)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    process = subprocess.Popen(
        [sys.executable, "-m", "gptzoo", "serve", model, "--port", "0"], stderr=subprocess.PIPE, text=True, env=env
    )
    assert process.stderr is not None
    for line in process.stderr:
        print(line.rstrip(), file=sys.stderr)
        found = re.search(r"at http://127\.0\.0\.1:(\d+)/v1", line)
        if found:
            threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()
            return process, int(found.group(1))
    raise SystemExit("the server did not start")


def one(client: openai.OpenAI, model: str, i: int, new_tokens: int) -> dict[str, Any]:
    """One streamed greedy completion: its text, new tokens and time to first token."""
    begun = time.perf_counter()
    first, pieces, tokens = None, [], 0
    options = {"include_usage": True}
    stream = client.completions.create(
        model=model, prompt=prompt(i), max_tokens=new_tokens, temperature=0, stream=True, stream_options=options
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            first = first if first is not None else time.perf_counter() - begun
            pieces.append(chunk.choices[0].text)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return {"text": "".join(pieces), "tokens": tokens, "ttft": first if first is not None else float("nan")}


def way(client: openai.OpenAI, model: str, clients: int, new_tokens: int, together: bool) -> dict[str, Any]:
    load = os.getloadavg()[0]
    begun = time.perf_counter()
    if together:
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(lambda i: one(client, model, i, new_tokens), range(clients)))
    else:
        results = [one(client, model, i, new_tokens) for i in range(clients)]
    wall = time.perf_counter() - begun
    ttft = [r["ttft"] for r in results]
    return {
        "way": "concurrent" if together else "sequential",
        "clients": clients,
        "load": load,
        "tokens_per_s": sum(r["tokens"] for r in results) / wall,
        "ttft_mean_s": sum(ttft) / len(ttft),
        "ttft_max_s": max(ttft),
        "texts": [r["text"] for r in results],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="1,4,8,16")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    process, port = start(args.model)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    rows = []
    try:
        one(client, args.model, 0, 4)  # warm up: the first plan, the first allocations
        for round_ in range(args.rounds):
            for clients in counts:
                order = (False, True) if round_ % 2 == 0 else (True, False)
                got = {c: way(client, args.model, clients, args.new_tokens, c) for c in order}
                same = got[True]["texts"] == got[False]["texts"]
                for r in got.values():
                    row = {"round": round_, **{k: v for k, v in r.items() if k != "texts"}, "same_texts": same}
                    rows.append(row)
                ratio = got[True]["tokens_per_s"] / got[False]["tokens_per_s"]
                if not args.json:
                    for r in (got[False], got[True]):
                        print(
                            f"round {round_} {clients:>2} clients {r['way']:>10}: load {r['load']:.2f}, "
                            f"{r['tokens_per_s']:6.1f} tok/s, first token {r['ttft_mean_s']:.2f} s mean, "
                            f"{r['ttft_max_s']:.2f} s worst",
                            flush=True,
                        )
                    print(f"round {round_} {clients:>2} clients: {ratio:.2f}x, same texts: {same}", flush=True)
    finally:
        process.terminate()
        process.wait(60)
    flags = sorted({f for f in cpu_flags().split() if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")})
    report = {"model": args.model, "new_tokens": args.new_tokens, "cpu_flags": flags, "cpus": os.cpu_count()}
    report["rows"] = rows
    print(json.dumps(report, indent=2) if args.json else f"flags {flags}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
