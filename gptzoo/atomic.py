"""Output directories that appear whole or not at all (checkpoints, exports)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from safetensors import SafetensorError

from gptzoo.errors import CheckpointError


def write_problem(exc: OSError | SafetensorError) -> str:
    """Why a write failed, for people: a full disk says so, and a file larger than may be written."""
    full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if full or "os error 28" in str(exc):  # safetensors reports ENOSPC in its message only
        return "the disk is full (No space left on device)"
    if (isinstance(exc, OSError) and exc.errno == errno.EFBIG) or "os error 27" in str(exc):
        return (
            "a file would be larger than this system lets it be (File too large: a `ulimit -f` limit, or a drive "
            "such as FAT32's of at most 4 GiB a file)"
        )
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def holds_files(path: Path) -> bool:
    """Whether writing a new directory at ``path`` would replace something: a file, or a non-empty directory."""
    return path.exists() and (not path.is_dir() or any(path.iterdir()))


def default_mode(*, directory: bool) -> int:
    """The permissions a plain mkdir or open would give under the current umask (tempfile makes 0o700 / 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def check_new_directory(out: str | Path) -> Path:
    """``out`` as a Path, if a new directory may be written there: it does not exist, or is an empty
    directory (not a symbolic link), and no part of its parent is a file."""
    if not Path(out).name:
        raise CheckpointError(f"{str(out)!r} is not a directory name to write to")
    out = Path(out)
    try:
        if out.is_symlink():
            raise CheckpointError(f"{out} is a symbolic link; give the directory it should be, or another name")
        if holds_files(out):
            raise CheckpointError(
                f"{out} already exists and is not an empty directory; choose another one or remove it"
            )
        for parent in out.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise CheckpointError(f"cannot write to {out}: {parent} is a file, not a directory")
                break
    except OSError as exc:  # a name too long, a directory that may not be searched
        raise CheckpointError(f"cannot write to {out}: {exc.strerror}") from None
    return out


def _make_parents(directory: Path) -> list[Path]:
    """Create ``directory`` and its missing parents; the ones created, deepest first."""
    missing = [directory, *directory.parents]
    missing = missing[: next(i for i, p in enumerate(missing) if p.is_dir())]
    for path in reversed(missing):
        path.mkdir(exist_ok=True)
    return missing


def _remove(created: list[Path]) -> None:
    """Remove the directories this write created, deepest first, as long as they are empty."""
    for path in created:
        try:
            path.rmdir()
        except OSError:
            return


NAME_MAX = 255
"""The most bytes of one file name (Linux, macOS)."""
RANDOM_SUFFIX = 8
"""The characters tempfile adds after a prefix."""


def temporary_prefix(name: str) -> str:
    """``.NAME.``, the prefix of the temporary sibling of ``name`` (``.step-000200.`` for a training
    run's step-000200: gptzoo.training.run_dir recognises a killed save's leftovers by this shape),
    with NAME cut short enough that the temporary name stays within NAME_MAX bytes: a legal name of
    250 bytes too."""
    while len(os.fsencode(f".{name}.")) + RANDOM_SUFFIX > NAME_MAX:  # by characters: none is cut in half
        name = name[:-1]
    return f".{name}."


@contextmanager
def new_directory(out: str | Path) -> Iterator[Path]:
    """A temporary directory beside ``out`` to fill in the ``with`` block: renamed to ``out`` when
    the block succeeds, removed when it fails (an interrupted write leaves nothing behind, not even
    the parent directories it created). ``out`` must not exist, or be an empty directory, whose
    permissions the new one keeps; otherwise it gets those of a plain mkdir, and its files those of
    plain writes."""
    out = check_new_directory(out)
    created: list[Path] = []
    tmp: Path | None = None
    try:
        created = _make_parents(out.parent)
        remove_abandoned(out)
        tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(out.name), dir=out.parent))
        (tmp / OWNER).write_text(str(os.getpid()), encoding="utf-8")
        tmp.chmod(stat.S_IMODE(out.stat().st_mode) if out.is_dir() else default_mode(directory=True))
        yield tmp
        (tmp / OWNER).unlink()
        _plain_modes(tmp)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except (OSError, SafetensorError) as exc:  # a full disk, most likely
        _clean(tmp, created)
        raise CheckpointError(f"cannot write to {out}: {write_problem(exc)}") from None
    except BaseException:
        _clean(tmp, created)
        raise


OWNER = ".gptzoo-writer"
"""The file in a temporary directory of :func:`new_directory` that holds the id of the process writing it."""


def remove_abandoned(out: Path) -> None:
    """Remove the temporary directories of earlier writes to ``out`` whose process is gone (killed with
    SIGKILL, or by the machine stopping): a write in progress, and a directory not made here, are left alone."""
    prefix = temporary_prefix(out.name)
    with suppress(OSError):
        for sibling in out.parent.iterdir():
            if not (sibling.name.startswith(prefix) and len(sibling.name) == len(prefix) + RANDOM_SUFFIX):
                continue
            try:
                pid = int((sibling / OWNER).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not _alive(pid):
                shutil.rmtree(sibling, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether a process of that id runs (signal 0 only asks)."""
    if pid <= 0:  # 0 and below name process groups, never a writer
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # another user's
        return True
    except (ProcessLookupError, OverflowError):
        return False
    return True


def _plain_modes(tmp: Path) -> None:
    """Give the files written into ``tmp`` the permissions of plain writes (some writers, like
    safetensors, create them 0o600 as temporary files)."""
    mode = default_mode(directory=False)
    for root, _, files in os.walk(tmp):
        for name in files:
            os.chmod(os.path.join(root, name), mode)


def _clean(tmp: Path | None, created: list[Path]) -> None:
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    _remove(created)
