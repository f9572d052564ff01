"""gptzoo.training.host_memory: after keep_freed_memory a freed 64 MiB tensor stays in malloc's heap for the next
allocation, where by default it is mapped for itself and unmapped when freed; CPU training sets it."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

import gptzoo
from gptzoo.training.trainer import train

HEAP = """
import ctypes, sys, torch
from gptzoo.training.host_memory import keep_freed_memory
fields = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
MallInfo2 = type("MallInfo2", (ctypes.Structure,), {"_fields_": [(f, ctypes.c_size_t) for f in fields]})
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
t = torch.ones(2**24)  # 64 MiB
mapped = libc.mallinfo2().hblkhd  # bytes in blocks mapped for themselves
del t
print(kept, mapped, libc.mallinfo2().fordblks)  # and free bytes kept in the heap
"""


def heap(mode: str) -> tuple[str, int, int]:
    out = subprocess.run([sys.executable, "-c", HEAP, mode], capture_output=True, text=True, check=True).stdout
    kept, mapped, free = out.split()
    return kept, int(mapped), int(free)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc is set through glibc's mallopt and mallinfo2")
def test_a_freed_tensor_stays_in_the_heap() -> None:
    kept, mapped, free = heap("keep")
    assert kept == "True"
    assert mapped < 2**26 <= free
    _, mapped, free = heap("default")
    assert free < 2**26 <= mapped


def test_training_on_the_cpu_keeps_freed_memory(stdlib_bytes: Path, tmp_path: Path, kept_freed_memory) -> None:
    bytes_model = ["model.vocab_size=256", "tokenizer.name=bytes", "train.seq_len=64"]
    recipe = gptzoo.load_recipe("gpt2-tiny", [*bytes_model, "train.max_steps=1", "train.micro_batch_size=2"])
    train(recipe, out=tmp_path / "run", data=stdlib_bytes)
    assert kept_freed_memory == ["kept"]
