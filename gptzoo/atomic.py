"""Output directories that appear whole or not at all (checkpoints, exports)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError

from gptzoo.errors import CheckpointError


def holds_files(path: Path) -> bool:
    """Whether writing a new directory at ``path`` would replace something: a file, or a non-empty directory."""
    return path.exists() and (not path.is_dir() or any(path.iterdir()))


@contextmanager
def new_directory(out: str | Path) -> Iterator[Path]:
    """A temporary directory beside ``out`` to fill in the ``with`` block: renamed to ``out`` when
    the block succeeds, removed when it fails (an interrupted write leaves nothing behind).
    ``out`` must not exist, or be an empty directory."""
    if not Path(out).name:
        raise CheckpointError(f"{str(out)!r} is not a directory name to write to")
    out = Path(out)
    if holds_files(out):
        raise CheckpointError(f"{out} already exists and is not an empty directory; choose another one or remove it")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:
        raise CheckpointError(f"cannot write to {out}: {exc.strerror} ({exc.filename})") from None
    try:
        yield tmp
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except (OSError, SafetensorError) as exc:  # a full disk, most likely
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"cannot write to {out}: {getattr(exc, 'strerror', None) or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
