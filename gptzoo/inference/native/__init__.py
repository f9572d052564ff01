"""Native CPU kernels, compiled once for the machine they run on and loaded with ctypes.

gemv.c holds the matrix-vector products and their thread pool, step.c the interpreter of a whole
decoding step (gptzoo.inference.decode_plan), quantize.c the search of ``--dtype int4``'s blocks,
kernels.h what they share, and ``ops_generated.h`` what they share with Python (the dtype and operation
codes, the layout of an operation), written from :mod:`gptzoo.inference.native.abi` next to the sources
when they are compiled. They are compiled with
the system's C compiler (``$CC``, else ``cc``) at ``-O3 -march=native -pthread -ffp-contract=off``
(no fused multiply-adds that the source does not ask for, so that elementwise operations round as
torch's do) into the gptzoo cache (``kernels/gemv-<hash>.so``, the hash covering the sources, the
compiler, the flags and the CPU's feature flags, so a cache shared between machines never loads a
library built for another CPU). Compiling takes about a second; it happens on the first use and the
library is written atomically. Where no compiler works, :func:`library` returns None with the reason
in :func:`unavailable_reason`, and decoding keeps torch's own kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from gptzoo.inference.native import abi

FLAGS = ("-O3", "-march=native", "-pthread", "-ffp-contract=off", "-shared", "-fPIC")
SOURCES = ("kernels.h", "gemv.c", "step.c", "quantize.c")
"""The files compiled (the .c ones) or included, in the order they are hashed (then the generated header)."""
GENERATED = "ops_generated.h"
"""The header written from gptzoo.inference.native.abi for each build."""

_reason: str | None = None


def cpu_flags() -> str:
    """The CPU's feature flags as the kernel sees them (Linux's /proc/cpuinfo; the machine name elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.machine()


def _compiler() -> list[str] | None:
    """The C compiler's command: ``$CC`` (which may hold arguments, e.g. ``ccache gcc``), else cc or gcc."""
    if os.environ.get("CC", "").strip():
        return shlex.split(os.environ["CC"])
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else None


def _compiler_version(cc: list[str]) -> str:
    try:
        return subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _build(sources: dict[str, bytes], cc: list[str], target: Path) -> None:
    """Compile ``sources`` (file name -> text) into ``target``, atomically (a temporary file in its
    directory, then a rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        for name, text in sources.items():
            (Path(tmp) / name).write_bytes(text)
        compiled = [str(Path(tmp) / name) for name in sources if name.endswith(".c")]
        out = Path(tmp) / target.name
        done = subprocess.run([*cc, *FLAGS, *compiled, "-o", str(out)], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise OSError(f"{' '.join(cc)} failed: {done.stderr.strip()[-500:]}")
        os.replace(out, target)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels (built on first use), or None where they cannot be built or loaded."""
    global _reason
    from gptzoo.fetch import cache_root

    sources = {name: resources.files(__package__).joinpath(name).read_bytes() for name in SOURCES}
    sources[GENERATED] = abi.header().encode()
    cc = _compiler()
    if cc is None:
        _reason = "no C compiler (set CC or install gcc)"
        return None
    key = hashlib.sha256(
        b"\0".join([*sources.values(), _compiler_version(cc).encode(), " ".join(FLAGS).encode(), cpu_flags().encode()])
    )
    target = cache_root() / "kernels" / f"gemv-{key.hexdigest()[:16]}.so"
    try:
        if not target.exists():
            _build(sources, cc, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as exc:
        _reason = f"the CPU kernels could not be built with {' '.join(cc)}: {exc}"
        return None
    c = ctypes
    lib.gemv.argtypes = [c.c_int, c.c_void_p, c.c_void_p, c.c_void_p, c.c_int, c.c_void_p, c.c_int, c.c_void_p]
    lib.gemv.argtypes += [c.c_long, c.c_long, c.c_long, c.c_int]
    lib.gemv.restype = c.c_int
    lib.decode_step.argtypes = [c.c_void_p, c.c_long, c.c_long, c.c_long, c.c_void_p, c.c_int, c.c_void_p]
    lib.decode_step.restype = c.c_int
    lib.q4_quantize.argtypes = [c.c_void_p, c.c_long, c.c_long, c.c_void_p, c.c_int, c.c_void_p, c.c_void_p, c.c_int]
    lib.q4_quantize.restype = c.c_int
    return lib


def unavailable_reason() -> str | None:
    """Why :func:`library` returned None (None when it did not)."""
    library()
    return _reason
