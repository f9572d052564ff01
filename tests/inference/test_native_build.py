"""The native kernels build wherever there is a C compiler: a build failure is a failure, not a skip (the kernel
tests skip when the library is absent, which once hid a build that failed on every AVX-512 machine), and the
sources compile for each vector target the header has a branch for, whatever this machine's CPU is."""

from __future__ import annotations

import platform
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from gptzoo.inference import native
from gptzoo.inference.native import abi

TARGETS = {
    "avx512": ["-march=x86-64-v4"],
    "avx2": ["-march=x86-64-v3"],
    "plain": ["-march=x86-64"],
}
"""x86-64 levels: v4 has AVX-512F/BW, v3 AVX2 and FMA, the baseline neither (the header's plain C)."""


def test_with_a_compiler_the_kernels_build() -> None:
    if native._compiler() is None:
        pytest.skip("no C compiler")
    assert native.library() is not None, native.unavailable_reason()


@pytest.mark.parametrize("target", TARGETS)
def test_the_kernels_compile_for_every_vector_target(tmp_path: Path, target: str) -> None:
    cc = native._compiler()
    if cc is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("needs a C compiler for x86-64")
    for name in native.SOURCES:
        (tmp_path / name).write_bytes(resources.files(native.__name__).joinpath(name).read_bytes())
    (tmp_path / native.GENERATED).write_text(abi.header())
    flags = [f for f in native.FLAGS if not f.startswith("-march")]
    sources = [str(tmp_path / name) for name in native.SOURCES if name.endswith(".c")]
    done = subprocess.run(
        [*cc, *flags, *TARGETS[target], "-fsyntax-only", *sources], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
