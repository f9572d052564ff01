"""What a checkpoint directory supplies is untrusted input (a download, an unpacked archive).

Every file gptzoo reads from it, and every file transformers may read from it, must be a regular
file inside it once symbolic links are followed (in a Hugging Face cache snapshot,
``models--org--name/snapshots/REV``, also inside that repository's ``blobs/`` folder, where the
cache keeps what the snapshot links to): a checkpoint cannot make gptzoo read ``/etc/passwd`` by
naming it, nor hang it on a named pipe. For transformers, which opens files by name, that holds for
every entry of every subdirectory and for every file name its tokenizer_config.json gives. Its
weights are of a dtype gptzoo runs, and its path is UTF-8, the only paths safetensors opens.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gptzoo.defaults import WEIGHT_DTYPES
from gptzoo.errors import CheckpointError

WEIGHT_DTYPES_TEXT = f"{', '.join(WEIGHT_DTYPES[:-1])} or {WEIGHT_DTYPES[-1]}"
"""gptzoo.defaults.WEIGHT_DTYPES as a message names them: "float32, bfloat16 or float16"."""


def dtype_name(dtype: object) -> str:
    """A torch dtype by the name WEIGHT_DTYPES uses: torch.float32 -> "float32"."""
    return str(dtype).removeprefix("torch.")


RULE = "every file a checkpoint supplies must be inside its directory (after following symlinks)"
TOKENIZER_CONFIG = "tokenizer_config.json"
"""Where an HF tokenizer's saved arguments are, file names among them (``vocab_file``, ``fast_tokenizer_files``)."""
NAME_LIMIT = 300
"""The most characters of a name (a tensor's, a file's) a message shows."""


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


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` is, in words: "a directory", "a named pipe (FIFO)", "a character device"..."""
    for test, kind in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a file"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return "a special file"


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
            (``missing``, or a broken link), is not a regular file (a directory, a FIFO, a device),
            or cannot be opened for reading (it is opened once to find out: readers such as
            safetensors report every failure to open as a missing file).
    """
    subject, verb = (entry, "names") if entry is not None else (str(directory / name), "is")
    real, mode = _inspect(directory, name, subject, verb)
    if mode is None:
        if verb == "is" and (directory / name).is_symlink():
            raise CheckpointError(f"{subject} is a symbolic link to nothing ({real} does not exist)")
        raise CheckpointError(missing)
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{subject} {verb} {file_kind(mode)}, not a file")
    try:  # O_NONBLOCK: should it have become a FIFO since, opening it returns at once all the same
        os.close(os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as exc:
        raise CheckpointError(f"cannot read {directory / name}: {_reason(exc)}") from None
    return real


def read_json(real: Path, file: Path, what: str) -> dict[str, Any]:
    """A JSON object from a checkpoint file, read at its real path ``real`` (from :func:`checkpoint_file`)
    and named ``file``; ``what`` it is, for the fix ("config.json", "index"). NaN and Infinity are
    not JSON and are refused.

    Raises:
        CheckpointError: the file cannot be read, is not JSON or not a JSON object.
    """
    try:
        text = real.read_text(encoding="utf-8")
    except OSError as exc:
        raise CheckpointError(f"cannot read {file}: {_reason(exc)}") from None
    except ValueError as exc:  # UnicodeDecodeError
        raise CheckpointError(f"{file} is not valid JSON: {_reason(exc)}; fix or replace the {what}") from None
    try:
        data = json.loads(text, parse_constant=refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{file} is not valid JSON: {_reason(exc)}; fix or replace the {what}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} is not a JSON object; fix or replace the {what}")
    return data


def refuse_constant(name: str) -> Any:
    """``json.loads(..., parse_constant=refuse_constant)``: NaN and Infinity, which Python's json reads, are
    no JSON."""
    raise ValueError(f"{name} is not a JSON value")


def _shown(name: str) -> str:
    """A file name from a checkpoint file, for a message: its repr, cut to NAME_LIMIT characters."""
    text = repr(name)
    return text if len(text) <= NAME_LIMIT else text[: NAME_LIMIT - 3] + "..."


def supplies(directory: Path, name: str) -> bool:
    """Whether the checkpoint directory has an entry ``name`` (a broken link counts: it is refused by name)."""
    return os.path.lexists(directory / name)


def check_directory(directory: Path) -> None:
    """What a reader that opens files by name (transformers) may open in ``directory`` is inside it:
    every entry of every subdirectory (a symlinked one too, once) is a regular file or a directory
    inside it, and every file name its tokenizer_config.json gives (:func:`check_tokenizer_config`)
    leads inside it. No symbolic link leads outside, nothing is a FIFO or a device.

    Raises:
        CheckpointError: naming the first entry (in sorted order, depth first) or name that is not.
    """
    seen: set[Path] = set()
    pending = [Path()]  # subdirectories, relative to directory, still to list
    while pending:
        relative = pending.pop()
        real = (directory / relative).resolve()
        if real in seen:  # a symlink back to a directory already listed
            continue
        seen.add(real)
        try:
            names = sorted(os.listdir(directory / relative))
        except OSError as exc:
            raise CheckpointError(f"cannot read {directory / relative}: {_reason(exc)}") from None
        subdirectories = []
        for name in names:
            entry = relative / name
            _, mode = _inspect(directory, str(entry), str(directory / entry), "is")
            if mode is not None and stat.S_ISDIR(mode):
                subdirectories.append(entry)
            elif mode is not None and not stat.S_ISREG(mode):
                raise CheckpointError(f"{directory / entry} is {file_kind(mode)}, not a file")
        pending += reversed(subdirectories)
    if supplies(directory, TOKENIZER_CONFIG):
        check_tokenizer_config(directory)


def check_tokenizer_config(directory: Path) -> None:
    """Every string under a key ending in ``_file`` or ``_files`` in the directory's
    tokenizer_config.json (transformers' names for tokenizer files: vocab_file, merges_file,
    tokenizer_file, fast_tokenizer_files, ...), at any depth, names a file inside ``directory``:
    relative to it, and leading inside it once resolved (it need not exist: transformers skips one
    that does not).

    Raises:
        CheckpointError: naming the entry (e.g. ``fast_tokenizer_files[0] = '../x.json'``) and the fix.
    """
    file = directory / TOKENIZER_CONFIG
    config = read_json(
        checkpoint_file(directory, TOKENIZER_CONFIG, missing=f"{file} is missing"), file, "tokenizer config"
    )
    fix = f"remove the entry, or name a file inside {directory} relative to it"
    for where, name in _file_names(config):
        entry = f"{file}: {where} = {_shown(name)}"
        if os.path.isabs(name):
            raise CheckpointError(f"{entry} is an absolute path; {RULE}: {fix}")
        try:
            _, mode = _inspect(directory, name, entry, "names")
        except CheckpointError as exc:
            raise CheckpointError(f"{exc}: {fix}") from None
        if mode is not None and not stat.S_ISREG(mode):
            raise CheckpointError(f"{entry} names {file_kind(mode)}, not a file: {fix}")


def _file_names(config: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(key path, string) of every string in ``config`` under a key ending in _file or _files, in
    the file's order (iteratively: the nesting is the file's to choose)."""
    pending: list[tuple[str, Any, bool]] = [("", config, False)]  # (key path, value, under such a key)
    while pending:
        where, value, named = pending.pop()
        if isinstance(value, str) and named:
            yield where, value
        elif isinstance(value, dict):
            items = [
                (f"{where}.{k}" if where else k, v, named or k.endswith(("_file", "_files"))) for k, v in value.items()
            ]
            pending += reversed(items)
        elif isinstance(value, list):
            pending += reversed([(f"{where}[{i}]", v, named) for i, v in enumerate(value)])


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
