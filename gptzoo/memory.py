"""How much memory a device has free, so that a request that cannot fit is refused before it is made."""

from __future__ import annotations

import os

import torch


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` in bytes (CPU: MemAvailable), or None where it cannot be known."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def format_bytes(n: int) -> str:
    """1536 -> '1.50 KiB'."""
    for factor, prefix in ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= factor:
            return f"{n / factor:.2f} {prefix}"
    return f"{n} B"
