"""Freed host memory kept for reuse while a model trains on the CPU (glibc's malloc).

Every CPU training step allocates and frees the same large tensors: autocast's low-precision copies of the
weights, the gradients (set to None between steps), the logits. glibc serves each allocation over its mmap
threshold (32 MiB at most) with a fresh mapping and unmaps it on free, so every step the kernel faults in and
zero-fills those pages again. On GPT-2 small in bfloat16 (4 x 128 tokens, a 2-core Xeon) that page work made the
weight casts and gradient fills twice as slow as the memory traffic itself. :func:`keep_freed_memory` turns
malloc's mmap and trimming off, so freed blocks go back to its heap and the next step reuses the same resident
pages (Intel's PyTorch CPU tuning guide gets the same effect from jemalloc or tcmalloc through LD_PRELOAD). The
cost: the process's resident memory stays at its peak until it exits, which a training run reaches every step.
"""

from __future__ import annotations

import ctypes
import platform

# mallopt's parameters, from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
# mallopt takes an int: the largest trim threshold it can be told
NEVER_TRIM = 2**31 - 1


def keep_freed_memory() -> bool:
    """Serve every allocation from malloc's heap and never hand freed memory back to the system, for the rest of
    this process. True where that took (glibc); False elsewhere, where nothing changed."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
