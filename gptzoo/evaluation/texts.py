"""What `gptzoo eval` reads: text files (one document each, tokenized with the model's tokenizer) and
prepared data (the val.bin of `gptzoo prepare`, which must be in the model's tokenizer).

Bits per byte compare models whose tokenizers differ, so each document records the UTF-8 bytes its
scored tokens stand for (the tokenizer's ``n_bytes``: special tokens such as a document separator
stand for none). A text file is encoded as the model sees a prompt (an HF tokenizer adds its BOS);
when the tokenizer has a BOS token that the encoding lacks, it is put in front, so every token of the
text is predicted and the bytes are the whole file's. Without a BOS (the bytes tokenizer) the first
token cannot be predicted: its bytes are left out of the count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gptzoo.errors import GptzooError
from gptzoo.recipe import Recipe
from gptzoo.tokenizer import Tokenizer, utf8
from gptzoo.training.data import TokenData
from gptzoo.training.trainer import check_data


@dataclass(frozen=True)
class Document:
    ids: np.ndarray
    """Token ids (int64), including a BOS put in front."""
    n_bytes: int
    """UTF-8 bytes of the tokens that are scored (all but the first)."""


@dataclass(frozen=True)
class EvalText:
    name: str
    """As the person gave it: a file or a data directory."""
    documents: tuple[Document, ...]


def check_inputs(texts: Sequence[str | Path] | None, data: Sequence[str | Path] | None) -> None:
    """What an evaluation reads, checked before any model loads (a load may take minutes): each ``--text`` a
    regular file that can be opened, each ``--data`` a directory ``gptzoo prepare`` wrote.

    Raises:
        GptzooError: the first that is not, as reading it would say.
    """
    for path in map(Path, texts or ()):
        if path.is_dir():
            raise GptzooError(f"--text {path} is a directory; give a text file (or prepared data with --data)")
        if not path.exists():
            raise GptzooError(f"--text {path}: no such file")
        if not path.is_file():
            raise GptzooError(f"--text {path} is not a regular file; give a text file")
        try:
            path.open("rb").close()
        except OSError as exc:
            raise GptzooError(f"cannot read --text {path}: {exc.strerror}") from None
    for directory in data or ():
        TokenData.open(directory)


def read_text_file(path: str | Path, tokenizer: Tokenizer, *, max_tokens: int | None = None) -> EvalText:
    """One document: the file's UTF-8 text in ``tokenizer``'s ids (see the module docstring).

    Raises:
        GptzooError: no such file, not UTF-8, or fewer than 2 tokens.
    """
    path = Path(path)
    if path.exists() and not path.is_dir() and not path.is_file():  # a device or a FIFO may never end
        raise GptzooError(f"--text {path} is not a regular file; give a text file")
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise GptzooError(f"--text {path}: no such file") from None
    except IsADirectoryError:
        raise GptzooError(f"--text {path} is a directory; give a text file (or prepared data with --data)") from None
    except UnicodeDecodeError as exc:
        raise GptzooError(f"--text {path} is not UTF-8 text (byte {exc.start}); convert it to UTF-8") from None
    except OSError as exc:
        raise GptzooError(f"cannot read --text {path}: {exc.strerror}") from None
    utf8(text, f"--text {path}")
    ids = tokenizer.encode(text)
    bos = tokenizer.bos_token_id
    if bos is not None and (not ids or ids[0] != bos):
        ids = [bos, *ids]
    if max_tokens is not None:
        ids = ids[:max_tokens]
    if len(ids) < 2:
        raise GptzooError(f"--text {path} gives {len(ids)} token(s); evaluation needs at least 2")
    return EvalText(str(path), (Document(np.asarray(ids, dtype=np.int64), tokenizer.n_bytes(ids[1:])),))


def val_tokens(directory: str | Path) -> int:
    """How many tokens the val.bin of prepared data holds."""
    return len(TokenData.open(directory).val)


def read_prepared(
    directory: str | Path,
    recipe: Recipe,
    tokenizer: Tokenizer,
    *,
    hf_dir: str | Path | None = None,
    max_tokens: int | None = None,
) -> EvalText:
    """The val.bin of prepared data, checked against the model's tokenizer and vocabulary.

    Raises:
        GptzooError: not prepared data, or data in another tokenizer (as for training).
    """
    data = TokenData.open(directory)
    check_data(recipe, data, hf_dir)
    ids = np.asarray(data.val[: max_tokens if max_tokens is not None else len(data.val)], dtype=np.int64)
    if len(ids) < 2:
        raise GptzooError(f"--data {directory}: val.bin has {len(ids)} token(s); evaluation needs at least 2")
    return EvalText(str(directory), (Document(ids, tokenizer.n_bytes(ids[1:])),))
