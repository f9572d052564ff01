"""What a checkpoint directory supplies is untrusted input (a download, an unpacked archive).

Every file gptzoo reads from it, and every file transformers may read from it, must be a regular
file inside it once symbolic links are followed (in a Hugging Face cache snapshot,
``models--org--name/snapshots/REV``, also inside that repository's ``blobs/`` folder, where the
cache keeps what the snapshot links to): a checkpoint cannot make gptzoo read ``/etc/passwd`` by
naming it, nor hang it on a named pipe. Its weights are of a dtype gptzoo runs, and its path is
UTF-8, the only paths safetensors opens.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gptzoo.errors import CheckpointError

WEIGHT_DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes of the weights gptzoo reads (by torch name); float64, float8, float4 and integers are refused."""
WEIGHT_DTYPES_TEXT = "float32, bfloat16 or float16"
RULE = "every file a checkpoint supplies must be inside its directory (after following symlinks)"


def first_few(items: list[str], limit: int = 8, sep: str = "; ") -> str:
    """The first ``limit`` of ``items`` joined by ``sep``, and how many more there are."""
    more = f"{sep}and {len(items) - limit} more" if len(items) > limit else ""
    return sep.join(items[:limit]) + more


def roots(directory: Path) -> list[Path]:
    """Where the files of the checkpoint directory may live: the directory itself and, for a
    Hugging Face cache snapshot, that repository's blobs/ folder."""
    real = directory.resolve()
    found = [real]
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        found.append(real.parent.parent / "blobs")
    return found


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _reason(exc: BaseException) -> str:
    """Why a name could not be resolved, without repeating the name (which may be very long)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


def _inspect(directory: Path, name: str, subject: str, verb: str) -> tuple[Path, int | None]:
    """(the real path of directory/name, its st_mode, or None when nothing is there).

    Raises:
        CheckpointError: the name cannot be resolved (a symlink loop, a NUL, too long) or leads
            outside the directory.
    """
    link = directory / name
    try:
        real = link.resolve()
        inside = any(real.is_relative_to(root) for root in roots(directory))
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: a symlink loop; ValueError: a NUL
        raise CheckpointError(f"{subject} cannot be resolved ({_reason(exc)})") from None
    if not inside:
        where = f"links to {real}, outside {directory}" if verb == "is" else f"names a file outside {directory}"
        raise CheckpointError(f"{subject} {where}; {RULE}")
    try:
        return real, os.stat(real).st_mode  # stat opens nothing: a FIFO or device is only looked at
    except FileNotFoundError:
        return real, None
    except (OSError, ValueError) as exc:  # a name too long, a directory that may not be searched
        raise CheckpointError(f"{subject} cannot be resolved ({_reason(exc)})") from None


def checkpoint_file(directory: Path, name: str, *, missing: str, entry: str | None = None) -> Path:
    """The real path of ``directory / name``, a file the checkpoint directory supplies: read that
    path, not the name again (which could be relinked meanwhile).

    Args:
        missing: the message when nothing is there.
        entry: how messages name the file, if not by its path (e.g. the index entry naming a shard).

    Raises:
        CheckpointError: the name cannot be resolved, leads outside the directory, names nothing
            (``missing``, or a broken link), or is not a regular file (a directory, a FIFO, a device).
    """
    subject, verb = (entry, "names") if entry is not None else (str(directory / name), "is")
    real, mode = _inspect(directory, name, subject, verb)
    if mode is None:
        if verb == "is" and (directory / name).is_symlink():
            raise CheckpointError(f"{subject} is a symbolic link to nothing ({real} does not exist)")
        raise CheckpointError(missing)
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{subject} {verb} {_kind(mode)}, not a file")
    return real


def supplies(directory: Path, name: str) -> bool:
    """Whether the checkpoint directory has an entry ``name`` (a broken link counts: it is refused by name)."""
    return os.path.lexists(directory / name)


def check_directory(directory: Path) -> None:
    """Every entry of ``directory`` is a regular file or a directory inside it, for a reader that
    opens files by name (transformers): no symbolic link leads outside, nothing is a FIFO or device.

    Raises:
        CheckpointError: naming the first entry that is not.
    """
    for name in sorted(os.listdir(directory)):
        _, mode = _inspect(directory, name, str(directory / name), "is")
        if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise CheckpointError(f"{directory / name} is {_kind(mode)}, not a file")


def undecodable(text: str, start: int) -> str:
    """What the character at ``start`` of ``text`` is, when it cannot be encoded as UTF-8: a byte
    that was not UTF-8 (Python decodes one as a lone surrogate U+DC80..U+DCFF) or a lone surrogate."""
    code = ord(text[start])
    return f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"lone surrogate U+{code:04X}"


def check_utf8_path(path: str | Path) -> None:
    """A directory path safetensors can open (it takes only UTF-8 paths).

    Raises:
        CheckpointError: the path holds bytes that are not UTF-8.
    """
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CheckpointError(
            f"the directory name {text!r} is not valid UTF-8 ({undecodable(text, exc.start)} at character "
            f"{exc.start}), and safetensors reads and writes only UTF-8 paths; rename it"
        ) from None


def pickle_refusal(exc: BaseException) -> str:
    """What torch.load(weights_only=True) refused, from its error: the line that names it (the error
    also advises weights_only=False, which would run the pickle, and is not repeated)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("Check the documentation", "Weights only load failed"))]
    useful = [line for line in useful if "weights_only" not in line and "Please file an issue" not in line]
    return useful[-1].rstrip(".") if useful else "an unsupported pickle"
