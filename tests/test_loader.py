"""gptzoo.load_model and the checkpoint loader: sources, overrides on a checkpoint, hostile files."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import gptzoo
from gptzoo.errors import CheckpointError, GptzooError, Interrupted, RecipeError
from gptzoo.model import checkpoint


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
    assert str(info.value) == (
        f"{ck / 'recipe.toml'}: [model] attention: unknown attention 'nonexistent' (available: causal, eager)"
    )


def test_non_floating_weights_are_refused(ck: Path) -> None:
    weights = ck / "model.safetensors"
    tensors = load_file(weights)
    save_file({k: v.to(torch.int32) for k, v in tensors.items()}, weights)
    with pytest.raises(CheckpointError) as info:
        gptzoo.load_checkpoint(ck)
    assert str(info.value) == (
        f"{weights}: wte.weight holds int32 values; a checkpoint's weights are floating point "
        "(float32, bfloat16 or float16)"
    )
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
