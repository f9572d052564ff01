"""gptzoo.load_model and the checkpoint loader: sources, overrides on a checkpoint, hostile files."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from cli_run import run_error, run_json
from fakedist import FakeSite
from safetensors.torch import load_file, save_file

import gptzoo
from gptzoo.cli import main
from gptzoo.errors import CheckpointError, GptzooError, Interrupted, RecipeError
from gptzoo.hf import export_hf
from gptzoo.hf.files import write_checkpoint
from gptzoo.model import checkpoint
from gptzoo.model.gpt import GPT

DTYPES = "float32, bfloat16 or float16"
RULE = "every file a checkpoint supplies must be inside its directory (after following symlinks)"
STRUCTURE = (
    "a checkpoint's structure cannot change: {} (on a checkpoint, [model] takes only the attention kernel, "
    "a component's parameters, context_length and init_std)"
)


@pytest.fixture
def ck(tmp_path: Path) -> Path:
    """A gpt2-tiny checkpoint (2 blocks, width 64, tied head)."""
    model = gptzoo.build_model("gpt2-tiny")
    return gptzoo.save_checkpoint(model, model.recipe, tmp_path / "ck")


def test_load_model_from_a_recipe_is_seeded_and_warns_of_random_weights() -> None:
    state = torch.get_rng_state()
    first = gptzoo.load_model("gpt2-tiny", overrides=["model.n_layer=1"], seed=7)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left alone
    again = gptzoo.load_model("gpt2-tiny", overrides=["model.n_layer=1"], seed=7)
    assert torch.equal(first.model.wte.weight, again.model.wte.weight)
    assert first.recipe.model.n_layer == 1 and first.model.recipe is first.recipe
    assert first.warnings == ("recipe 'gpt2-tiny' has no [weights]: the model has random weights",)
    assert (first.source, first.hf_dir) == ("random initialization", None)
    assert first.tokenizer().encode("Hello") == [15496]
    built = gptzoo.load_model("gpt2-tiny", recipe_weights=False)
    assert built.warnings == ()
    meta = gptzoo.load_model("gpt2-small", device="meta")  # its [weights] hf = "gpt2" is not read
    assert meta.model.wte.weight.is_meta and meta.source == "none (meta device)"


def test_load_model_needs_exactly_one_source(ck: Path) -> None:
    with pytest.raises(GptzooError, match=r"^give either --checkpoint DIR or RECIPE / --hf, not both$"):
        gptzoo.load_model("gpt2-tiny", checkpoint=ck)
    with pytest.raises(GptzooError, match=r"^give a RECIPE, or --hf DIR\|NAME to derive one"):
        gptzoo.load_model()
    loaded = gptzoo.load_model(checkpoint=ck, overrides=["generate.max_new_tokens=3"])
    assert loaded.source == f"checkpoint {ck}" and loaded.recipe.generate.max_new_tokens == 3


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_load_model_quantized_replaces_every_linear_layer_as_the_command_line_does(
    ck: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], precision: str
) -> None:
    from gptzoo.inference.generate import generate
    from gptzoo.inference.quantize import HEAD, QuantizedLinear, module_for, quantize

    ids = torch.tensor([[15496, 11, 995]])
    composed = gptzoo.load_model(checkpoint=ck, dtype=torch.float32).model.eval()
    quantize(composed, precision)  # what `generate --dtype int8` composed before the library could
    expected = composed(ids)
    for loaded in (gptzoo.load_model(checkpoint=ck, dtype=precision), gptzoo.load_any(ck, dtype=precision)):
        linear = {
            p: type(m) for p, m in loaded.model.named_modules() if isinstance(m, (torch.nn.Linear, QuantizedLinear))
        }
        assert len(linear) == 9 and loaded.precision == precision  # 4 per block and the head
        assert linear == {path: module_for(precision, path) for path in linear} and HEAD in linear
        assert loaded.model.wte.weight.dtype == torch.float32 and not loaded.warnings
        assert torch.equal(loaded.model.eval()(ids), expected)
    assert gptzoo.load_model(checkpoint=ck, dtype=torch.bfloat16).precision == "bfloat16"
    assert gptzoo.load_model(checkpoint=ck).precision is None  # the checkpoint's own dtype
    result = run_json(
        capsys, "generate", str(ck), "--prompt", "Hello, world", "--max-new-tokens", "4", "--dtype", precision
    )
    assert result["tokens"][0] == generate(composed, [ids[0].tolist()], 4)[0]
    text = tmp_path / "text.txt"
    text.write_text("Hello, world! " * 20, encoding="utf-8")
    report = run_json(capsys, "eval", str(ck), "--text", str(text), "--lengths", "16", "--dtype", precision)
    assert report["dtype"] == precision and report["model"] == str(ck)


@pytest.mark.parametrize("dtype", ["float64", torch.float16, "int3"])
def test_a_dtype_that_names_no_precision_lists_them(ck: Path, dtype: object) -> None:
    message = f"dtype {dtype!r} is not a precision gptzoo runs models in; give float32, bfloat16, int8 or int4"
    for load in (gptzoo.load_model, gptzoo.load_any):
        with pytest.raises(GptzooError) as excinfo:
            load(checkpoint=ck, dtype=dtype) if load is gptzoo.load_model else load(ck, dtype=dtype)
        assert str(excinfo.value) == message


def test_resolve_recipe_with_need_weights() -> None:
    from gptzoo.loader import resolve_recipe

    recipe, source = resolve_recipe("gpt2-small")
    assert source == "gpt2" and recipe.name == "gpt2-small"
    with pytest.raises(GptzooError, match=r"^recipe 'gpt2-tiny' has no \[weights\] hf; give --hf DIR\|NAME$"):
        resolve_recipe("gpt2-tiny", need_weights=True)


def test_checkpoint_overrides_that_keep_the_tensors_are_accepted(ck: Path) -> None:
    plain = gptzoo.load_checkpoint(ck).eval()
    idx = torch.randint(0, 50257, (1, 7))
    for overrides in (["model.attention=eager"], ["model.norm.eps=1e-5", "generate.max_new_tokens=9"]):
        model = gptzoo.load_checkpoint(ck, overrides=overrides).eval()
        torch.testing.assert_close(model(idx), plain(idx))
    assert gptzoo.load_checkpoint(ck, overrides=["generate.max_new_tokens=9"]).recipe.generate.max_new_tokens == 9
    assert gptzoo.load_checkpoint(ck, overrides=["model.attention=eager"]).recipe.model.attention.name == "eager"


@pytest.mark.parametrize(
    ("override", "difference"),
    [
        ("model.n_layer=3", "it has 2 blocks' weights, the overridden recipe needs 3"),
        ("model.n_embd=32", "its wte.weight has shape (50257, 64), the overridden recipe needs (50257, 32)"),
        ("model.position=rope", "it has a tensor position.wpe.weight that the overridden recipe does not use"),
        ("model.tie_embeddings=false", "the overridden recipe needs a tensor lm_head.weight that it does not have"),
    ],
)
def test_checkpoint_overrides_that_change_the_tensors_are_refused(ck: Path, override: str, difference: str) -> None:
    with pytest.raises(CheckpointError) as info:
        gptzoo.load_checkpoint(ck, overrides=[override])
    assert str(info.value) == (
        f"--set {override} does not fit the checkpoint {ck}: {difference} (a checkpoint's shapes cannot change)"
    )


def test_checkpoint_overrides_are_validated(ck: Path) -> None:
    with pytest.raises(RecipeError) as info:
        gptzoo.load_checkpoint(ck, overrides=["model.attention=nonexistent"])
    available = ", ".join(gptzoo.get_registry().available("attention"))
    assert str(info.value) == (
        "--set model.attention=nonexistent: [model] attention: unknown attention 'nonexistent' "
        f"(available: {available})"
    )


def test_non_floating_weights_are_refused(ck: Path) -> None:
    weights = ck / "model.safetensors"
    tensors = load_file(weights)
    save_file({k: v.to(torch.int32) for k, v in tensors.items()}, weights)
    with pytest.raises(CheckpointError) as info:
        gptzoo.load_checkpoint(ck)
    assert str(info.value) == f"{weights}: wte.weight holds int32 values; a checkpoint's weights are {DTYPES}"
    save_file({**tensors, "ln_f.bias": tensors["ln_f.bias"].to(torch.bfloat16)}, weights)
    with pytest.raises(CheckpointError) as info:
        gptzoo.load_checkpoint(ck)
    assert str(info.value) == (
        f"{weights}: ln_f.bias is bfloat16 but wte.weight is float32; a checkpoint's weights share one dtype"
    )


def test_a_broken_recipe_toml_is_named(ck: Path) -> None:
    recipe = ck / "recipe.toml"
    recipe.write_text("[model\n")
    with pytest.raises(RecipeError, match=rf"^{re.escape(str(recipe))}: invalid TOML: "):
        gptzoo.load_checkpoint(ck)
    recipe.write_text('description = "\\udcff"\n')  # what a lone surrogate would have been written as
    with pytest.raises(RecipeError, match=rf"^{re.escape(str(recipe))}: invalid TOML: "):
        gptzoo.load_checkpoint(ck)
    recipe.write_bytes(b'description = "\xff"\n')
    with pytest.raises(RecipeError, match=rf"^{re.escape(str(recipe))}: invalid TOML: "):
        gptzoo.load_checkpoint(ck)
    recipe.write_text('[model]\nvocab_size = "many"\n')
    with pytest.raises(RecipeError) as info:
        gptzoo.load_checkpoint(ck)
    assert str(info.value).startswith(f"{recipe}: ") and "[model] vocab_size must be an integer" in str(info.value)
    with pytest.raises(CheckpointError, match=r"^no such checkpoint directory: .*nowhere$"):
        gptzoo.load_checkpoint(ck.parent / "nowhere")


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"description": "caf\udcff"}, "description"),
        ({"generate": gptzoo.recipe.GenerateSpec(stop=("ok", "\udcff"))}, "generate.stop[1]"),
    ],
)
def test_recipe_text_that_cannot_be_read_back_is_not_written(tmp_path: Path, change: dict, key: str) -> None:
    model = gptzoo.build_model("gpt2-tiny")
    recipe = dataclasses.replace(model.recipe, **change)
    with pytest.raises(CheckpointError) as info:
        gptzoo.save_checkpoint(model, recipe, tmp_path / "ck")
    value = change.get("description", "\udcff")
    assert str(info.value) == (
        f"recipe 'gpt2-tiny': {key} = {value!r} holds a character that is not valid Unicode (an undecodable byte?), "
        "so its recipe.toml could not be read back; give that value as text"
    )
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_save_says_nothing_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = gptzoo.build_model("gpt2-tiny")

    def interrupt(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_file", interrupt)
    with pytest.raises(Interrupted) as info:
        gptzoo.save_checkpoint(model, model.recipe, tmp_path / "ck")
    assert str(info.value) == f"nothing was written to {tmp_path / 'ck'}"
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def llama_ck(tmp_path: Path) -> Path:
    """A llama-tiny checkpoint (RoPE, SiLU, gated MLP, untied head)."""
    model = gptzoo.build_model("llama-tiny")
    return gptzoo.save_checkpoint(model, model.recipe, tmp_path / "llama")


def test_overrides_that_keep_what_the_weights_mean_are_accepted(ck: Path, llama_ck: Path) -> None:
    idx = torch.randint(0, 512, (1, 7))
    plain = gptzoo.load_checkpoint(llama_ck).eval()
    for overrides in (
        ["model.position.theta=500000.0"],
        ["model.context_length=256", "model.init_std=0.01"],
        ["tokenizer.name=bytes", "train.max_steps=3", "generate.max_new_tokens=2"],
    ):
        model = gptzoo.load_checkpoint(llama_ck, overrides=overrides)
        assert model.state_dict().keys() == plain.state_dict().keys()
    theta = gptzoo.load_checkpoint(llama_ck, overrides=["model.position.theta=500000.0"]).eval()
    assert not torch.allclose(theta(idx), plain(idx))  # asked for: a component's parameter
    assert gptzoo.load_checkpoint(ck, overrides=["model.attention=eager"]).recipe.model.attention.name == "eager"


@pytest.mark.parametrize(
    ("which", "override", "change"),
    [
        ("llama", "model.position=none", "model.position would change from 'rope' to 'none'"),
        ("llama", "model.activation=relu", "model.activation would change from 'silu' to 'relu'"),
        ("gpt2", "model.n_head=8", "model.n_head would change from 4 to 8"),
    ],
)
def test_overrides_that_change_what_the_weights_mean_are_refused(
    ck: Path, llama_ck: Path, capsys: pytest.CaptureFixture[str], which: str, override: str, change: str
) -> None:
    path = llama_ck if which == "llama" else ck
    with pytest.raises(CheckpointError) as info:
        gptzoo.load_checkpoint(path, overrides=[override])
    message = f"--set {override} does not fit the checkpoint {path}: {STRUCTURE.format(change)}"
    assert str(info.value) == message
    argv = ["generate", "--checkpoint", str(path), "--set", override, "--prompt", "hi", "--max-new-tokens", "2"]
    assert run_error(capsys, *argv) == f"error: {message}"


def test_a_checkpoint_recipe_that_extends_another_is_refused_unread(ck: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.toml").write_text("[model]\nsecret_key_name = 1\n")
    recipe = ck / "recipe.toml"
    text = recipe.read_text()
    for parent in (str(tmp_path / "outside.toml"), "/etc/passwd"):
        recipe.write_text(f"extends = {parent!r}\n{text}")
        with pytest.raises(RecipeError) as info:
            gptzoo.load_checkpoint(ck)
        assert str(info.value) == (
            f"{recipe}: extends = {parent!r}: a checkpoint's recipe.toml is written resolved (with what its recipe "
            "extended merged in) and extends nothing; remove the extends line"
        )


@pytest.mark.parametrize("name", ["model.safetensors", "recipe.toml"])
def test_checkpoint_files_must_be_regular_files_inside_it(
    ck: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    file = ck / name
    outside = tmp_path / f"elsewhere-{name}"
    shutil.move(file, outside)
    os.symlink(outside, file)  # a good file, but not the checkpoint's
    argv = ["generate", "--checkpoint", str(ck), "--prompt", "hi", "--max-new-tokens", "2"]
    assert run_error(capsys, *argv) == f"error: {file} links to {outside}, outside {ck}; {RULE}"
    file.unlink()
    os.symlink("/dev/zero", file)
    assert run_error(capsys, *argv) == f"error: {file} links to /dev/zero, outside {ck}; {RULE}"
    file.unlink()
    os.mkfifo(file)  # opening it would block forever
    assert run_error(capsys, *argv) == f"error: {file} is a named pipe (FIFO), not a file"
    file.unlink()
    file.mkdir()
    assert run_error(capsys, *argv) == f"error: {file} is a directory, not a file"
    file.rmdir()
    assert run_error(capsys, *argv) == f"error: {ck} is not a gptzoo checkpoint: {name} is missing"


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float8_e5m2, torch.float8_e4m3fn, torch.float4_e2m1fn_x2], ids=str
)
def test_weights_of_dtypes_gptzoo_does_not_run_are_refused(
    ck: Path, capsys: pytest.CaptureFixture[str], dtype: torch.dtype
) -> None:
    weights = ck / "model.safetensors"
    tensors = load_file(weights)
    convert = (lambda t: t.to(torch.uint8).view(dtype)) if dtype == torch.float4_e2m1fn_x2 else (lambda t: t.to(dtype))
    save_file({k: convert(v) for k, v in tensors.items()}, weights)
    name = str(dtype).removeprefix("torch.")
    message = f"{weights}: wte.weight holds {name} values; a checkpoint's weights are {DTYPES}"
    with pytest.raises(CheckpointError) as info:
        gptzoo.load_checkpoint(ck)
    assert str(info.value) == message
    out = ck.parent / "exported"
    assert run_error(capsys, "export", str(ck), "--hf", str(out)) == f"error: {message}"
    assert not out.exists()


def test_a_recipe_that_needs_many_more_tensors_says_so_briefly(ck: Path) -> None:
    recipe = ck / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("n_layer = 2", "n_layer = 4096"))
    with pytest.raises(CheckpointError) as info:
        gptzoo.load_checkpoint(ck)
    assert str(info.value) == f"{ck / 'model.safetensors'} does not match its recipe: it has 2 blocks' weights, " + (
        "the recipe needs 4096"
    )
    recipe.write_text(recipe.read_text().replace("n_layer = 4096", "n_layer = 2"))
    tensors = load_file(ck / "model.safetensors")
    save_file({**tensors, **{f"extra.{i}": torch.zeros(1) for i in range(10)}}, ck / "model.safetensors")
    with pytest.raises(CheckpointError) as info:
        gptzoo.load_checkpoint(ck)
    extras = ", ".join(repr(f"extra.{i}") for i in range(8))
    assert str(info.value) == (
        f"{ck / 'model.safetensors'} does not match its recipe: missing none, unexpected {extras}, and 2 more"
    )


def test_a_checkpoint_path_that_is_empty_or_a_file(ck: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generate = ["--prompt", "hi", "--max-new-tokens", "2"]
    assert run_error(capsys, "generate", "--checkpoint", "", *generate) == (
        "error: an empty checkpoint directory name; give the directory (e.g. from `gptzoo build --out`)"
    )
    weights = ck / "model.safetensors"
    assert run_error(capsys, "generate", "--checkpoint", str(weights), *generate) == (
        f"error: {weights} is a file, not a checkpoint directory; give the directory that holds it"
    )


def test_an_out_directory_that_is_not_utf8_is_refused_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = os.fsdecode(bytes(tmp_path) + b"/ck\xff")
    message = (
        f"the directory name {out!r} is not valid UTF-8 (byte 0xff at character {len(out) - 1}), and safetensors "
        "reads and writes only UTF-8 paths; rename it"
    )
    model = gptzoo.build_model("gpt2-tiny")
    with pytest.raises(CheckpointError) as info:
        gptzoo.save_checkpoint(model, model.recipe, out)
    assert str(info.value) == message
    monkeypatch.setattr(gptzoo.GPT, "init_weights", lambda *a, **k: pytest.fail("the weights were initialized"))
    assert run_error(capsys, "build", "gpt2-tiny", "--out", out) == f"error: {message}"
    assert list(tmp_path.iterdir()) == []
    os.rename(gptzoo.save_checkpoint(model, model.recipe, tmp_path / "ck"), out)  # renamed afterwards
    assert run_error(capsys, "generate", "--checkpoint", out, "--prompt", "hi") == f"error: {message}"


def test_a_checkpoint_built_from_hf_weights_keeps_their_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    hf = tmp_path / "hf"
    export_hf(gptzoo.build_model("llama-tiny"), hf)  # vocab_size 512
    raw = RawTokenizer(models.WordLevel({"<unk>": 0, **{f"w{i}": i for i in range(1, 512)}}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>").save_pretrained(hf)
    ck = tmp_path / "ck"
    run_json(capsys, "build", "--hf", str(hf), "--out", str(ck))
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in ck.iterdir()}
    argv = ["generate", "--checkpoint", str(ck), "--prompt", "w1 w2", "--max-new-tokens", "2"]
    assert len(run_json(capsys, *argv)["tokens"][0]) == 2
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (ck / name).unlink()
    assert run_error(capsys, *argv) == (
        f'error: checkpoint {ck} has no tokenizer files, and its recipe\'s [tokenizer] name = "hf" is the tokenizer '
        "of the Hugging Face checkpoint its weights came from: copy that checkpoint's tokenizer files "
        f"(tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json, vocab.txt and the like) into {ck}, "
        "or generate from the Hugging Face checkpoint itself (--hf DIR)"
    )


@pytest.mark.parametrize("error", ["torch", "safetensors"])
def test_a_checkpoint_that_disappears_while_it_is_read(
    ck: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    read = checkpoint.load_file

    def pruned(filename: str, **kwargs: object) -> dict[str, torch.Tensor]:  # a training run removes it meanwhile
        shutil.rmtree(ck)
        if error == "torch":  # what torch says when the file goes between safetensors' open and its own
            raise RuntimeError(f"unable to open file <{filename}> in read-only mode: No such file or directory (2)")
        return read(filename, **kwargs)

    monkeypatch.setattr(checkpoint, "load_file", pruned)
    assert run_error(capsys, "generate", "--checkpoint", str(ck), "--prompt", "hi") == (
        f"error: checkpoint {ck} changed or disappeared while it was read (model.safetensors is gone; a training run "
        "that keeps only its newest checkpoints removes older ones); read one that is kept, or copy it elsewhere "
        "first"
    )


ALIASNORM = '''
import torch
from torch import nn


class AliasNorm(nn.Module):
    """RMS-free scaling whose one parameter is registered under two names."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim))
        self.scale = self.weight  # the same tensor: safetensors refuses to write shared memory

    def forward(self, x):
        return self.scale * x


@gptzoo.hookimpl
def register_norms(register):
    register("aliasnorm", AliasNorm)
'''


def test_a_parameter_held_under_two_names_is_saved_under_both(
    fake_site: FakeSite, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.add("alias", "gptzoo_fake_alias", ALIASNORM)
    out = tmp_path / "ck"
    run_json(capsys, "build", "gpt2-tiny", "--set", "model.norm=aliasnorm", "--out", str(out))
    stored = load_file(out / "model.safetensors")
    assert torch.equal(stored["ln_f.weight"], stored["ln_f.scale"])
    loaded = gptzoo.load_checkpoint(out)
    assert all(torch.equal(stored[k], v) for k, v in loaded.state_dict().items() if k != "lm_head.weight")
    assert len(run_json(capsys, "generate", "--checkpoint", str(out), "--prompt", "hi", "--max-new-tokens", "2")) > 0
    shared = torch.ones(4)
    checkpoint.write_files(tmp_path, {"a": shared, "b": shared, "c": shared[:2]}, loaded.recipe)
    back = load_file(tmp_path / "model.safetensors")
    assert back.keys() == {"a", "b", "c"} and torch.equal(back["b"], shared) and torch.equal(back["c"], shared[:2])
    write_checkpoint(tmp_path / "hf", transformers.GPT2Config(), {"a": shared, "b": shared}, {})
    assert load_file(tmp_path / "hf" / "model.safetensors").keys() == {"a", "b"}


def test_an_interrupted_initialization_says_nothing_was_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupt(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(GPT, "init_weights", interrupt)
    out = tmp_path / "ck"
    assert main(["build", "gpt2-tiny", "--out", str(out)]) == 130
    assert capsys.readouterr().err == f"interrupted: nothing was written to {out}\n"
    assert list(tmp_path.iterdir()) == []


def test_loading_hf_reads_config_json_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--hf DIR`` finds the checkpoint and reads its config.json one time: the recipe derived from it, the
    check of that recipe and the family that maps the tensors all read the one gptzoo.hf.files.Checkpoint."""
    from gptzoo.hf import files

    model = gptzoo.build_model(gptzoo.load_recipe("llama-tiny"), device="cpu")
    export_hf(model, tmp_path / "hf")
    reads: list[Path] = []
    read_config = files.read_config
    monkeypatch.setattr(files, "read_config", lambda path: reads.append(path) or read_config(path))
    loaded = gptzoo.load_model(hf=tmp_path / "hf", overrides=["model.attention=eager"])
    assert reads == [tmp_path / "hf"]
    assert loaded.model.recipe.model.attention.name == "eager"


def test_a_model_in_memory_is_quantized_as_load_model_does() -> None:
    """gptzoo.quantize_model: the same weights in float and int8, side by side (what a plugin's tests compare)."""
    from gptzoo.inference.quantize import Int8Linear

    model = gptzoo.build_model(gptzoo.load_recipe("llama-tiny"), device="cpu").eval()
    idx = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = model(idx)
    assert gptzoo.quantize_model(model, "int8") == ()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == [] and sum(isinstance(m, Int8Linear) for m in model.modules()) == 2 * 4 + 1
    with torch.no_grad():
        after = model(idx)
    assert 0 < float((after - before).abs().max()) < 0.05 * float(before.abs().max())
    with pytest.raises(GptzooError) as raised:
        gptzoo.quantize_model(model, "bfloat16")
    assert str(raised.value) == (
        "dtype 'bfloat16' is not a quantized precision; give int8 or int4 (a float dtype is model.to(dtype))"
    )


def test_a_checkpoint_with_nan_weights_is_refused_in_every_dtype(ck: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One rule for every dtype: a float32 checkpoint holding NaN is refused at load, as int8 and int4 refused it
    (eval used to score it with a finite loss, and generate to emit a first token)."""
    tensors = load_file(str(ck / "model.safetensors"))
    tensors["blocks.0.mlp.c_fc.weight"][3, 5] = float("nan")
    save_file(tensors, str(ck / "model.safetensors"))
    expected = (
        f"{ck / 'model.safetensors'}: 'blocks.0.mlp.c_fc.weight' holds NaN or infinite values (e.g. from a diverged "
        "training run), which make every output NaN; load an earlier checkpoint of the run"
    )
    for dtype in ("float32", "bfloat16", "int8"):
        with pytest.raises(CheckpointError) as raised:
            gptzoo.load_model(checkpoint=ck, dtype=dtype)
        assert str(raised.value) == expected
    assert run_error(capsys, "generate", "--checkpoint", str(ck), "--prompt", "hi") == f"error: {expected}"
