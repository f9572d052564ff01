"""Hugging Face interop: parity with transformers on random-init checkpoints (no network), import of
every layout, export round trips, and clear errors for bad checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from hfparity import save_hf
from safetensors.torch import load_file, save_file

import gptzoo
from gptzoo.cli import main
from gptzoo.errors import CheckpointError, GptzooError, RecipeError
from gptzoo.hf import NoEquivalentError, export_hf, hf_recipe, load_hf
from gptzoo.hf.compare import compare

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

# The head layouts of the four official GPT-2 sizes (n_embd, n_head), scaled down in depth.
GPT2_HEADS = {"small": (768, 12), "medium": (1024, 16), "large": (1280, 20), "xl": (1600, 25)}
BF16 = {"max_abs_diff": 0.125, "mean_abs_diff": 0.02, "kl_hf_gptzoo": 1e-3}
"""bfloat16 tolerances against HF in bfloat16 for GPT-2 (8-bit mantissa: logits of magnitude ~4
round by ~0.03; HF's Conv1D and gptzoo's Linear accumulate in different orders)."""
BF16_LLAMA = {"max_abs_diff": 1e-2, "mean_abs_diff": 1e-3, "kl_hf_gptzoo": 1e-5}
"""Llama's matmuls have the same shapes on both sides: bfloat16 agrees almost exactly (measured 0)."""


def gpt2_config(**kw) -> transformers.GPT2Config:
    return transformers.GPT2Config(
        **{"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 128, **kw}
    )


def llama_config(**kw) -> transformers.LlamaConfig:
    defaults = {
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": 256,
        "rope_theta": 500000.0,
    }
    return transformers.LlamaConfig(**{**defaults, **kw})


def random_prompts(vocab: int, n: int = 2, length: int = 24) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(n)]


def assert_parity(result: dict, bounds: dict[str, float] | None = None) -> None:
    """float32 (no bounds): within 1e-4 and the same 32 greedy tokens; else within the bounds."""
    if bounds is None:
        assert result["max_abs_diff"] <= 1e-4, result["max_abs_diff"]
        assert result["top1_agreement"] == 1.0
        assert result["greedy_match"] and result["new_tokens"] == 32
    else:
        for key, bound in bounds.items():
            assert result[key] <= bound, (key, result[key])


@pytest.mark.parametrize("size", GPT2_HEADS)
def test_gpt2_head_layouts_match_hf(tmp_path: Path, size: str) -> None:
    n_embd, n_head = GPT2_HEADS[size]
    path = save_hf(tmp_path, size, gpt2_config(n_embd=n_embd, n_head=n_head, n_layer=2))
    assert_parity(compare(path, prompts=random_prompts(1000), new_tokens=32))


@pytest.mark.slow
def test_full_size_gpt2_small_matches_hf_in_float32_and_bfloat16(tmp_path: Path) -> None:
    path = save_hf(tmp_path, "gpt2-small", transformers.GPT2Config())
    recipe = gptzoo.load_recipe("gpt2-small")
    assert hf_recipe(path).model == recipe.model  # config.json derives exactly the shipped recipe
    assert hf_recipe(path).weights is None and recipe.weights.hf == "gpt2"
    assert_parity(
        compare(
            path,
            recipe,
            prompts=["The quick brown fox jumps over the lazy dog.", *random_prompts(50257, 1)],
            new_tokens=32,
        )
    )
    assert_parity(compare(path, recipe, prompts=random_prompts(50257, 1), dtype=torch.bfloat16, new_tokens=32), BF16)


@pytest.mark.parametrize("tied", [False, True])
def test_llama_gqa_matches_hf(tmp_path: Path, tied: bool) -> None:
    path = save_hf(tmp_path, "llama", llama_config(tie_word_embeddings=tied, rms_norm_eps=0.1))
    model = load_hf(path)
    assert model.tied is tied and model.recipe.model.n_kv_head == 2
    assert model.recipe.model.norm.kwargs == {"eps": 0.1}
    assert_parity(compare(path, prompts=random_prompts(512), new_tokens=32))
    bf16 = compare(path, prompts=random_prompts(512), dtype=torch.bfloat16, new_tokens=32)
    assert_parity(bf16, BF16_LLAMA)
    assert bf16["greedy_match"]


def test_gpt2_non_default_eps_and_untied_head(tmp_path: Path) -> None:
    path = save_hf(tmp_path, "g", gpt2_config(layer_norm_epsilon=0.1, tie_word_embeddings=False, n_inner=100))
    model = load_hf(path)
    assert not model.tied and model.recipe.model.d_ff == 100 and model.blocks[0].ln_1.eps == 0.1
    assert_parity(compare(path, prompts=random_prompts(1000), new_tokens=32))


def test_llama_variants_bias_mqa_head_dim_and_activation(tmp_path: Path) -> None:
    config = llama_config(
        num_key_value_heads=1, head_dim=32, attention_bias=True, mlp_bias=True, hidden_act="gelu_pytorch_tanh"
    )
    path = save_hf(tmp_path, "variant", config)
    recipe = hf_recipe(path)
    m = recipe.model
    assert (m.n_kv_head, m.head_dim, m.bias, m.activation.name) == (1, 32, True, "gelu_tanh")
    assert_parity(compare(path, prompts=random_prompts(512), new_tokens=32))


def test_gpt2_legacy_layouts(tmp_path: Path) -> None:
    """The original files: no `transformer.` prefix, attn.bias / attn.masked_bias buffers, a
    pickled pytorch_model.bin (loaded with weights_only=True), and a tied head stored anyway."""
    path = save_hf(tmp_path, "new", gpt2_config())
    tensors = load_file(str(path / "model.safetensors"))
    legacy = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    for i in range(2):
        legacy[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 128, 128))
        legacy[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    legacy["lm_head.weight"] = legacy["wte.weight"]
    a = load_hf(path).state_dict()
    for zip_format in (True, False):  # torch's zip format, and the older one GPT-2 was released in
        old = tmp_path / f"old-{zip_format}"
        old.mkdir()
        (old / "config.json").write_text((path / "config.json").read_text())
        torch.save(legacy, old / "pytorch_model.bin", _use_new_zipfile_serialization=zip_format)
        b = load_hf(old).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("recipe", ["gpt2-tiny", "llama-tiny"])
def test_export_round_trip(tmp_path: Path, recipe: str) -> None:
    model = gptzoo.build_model(recipe).eval()
    export_hf(model, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == [{"gpt2-tiny": "GPT2LMHeadModel", "llama-tiny": "LlamaForCausalLM"}[recipe]]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    idx = torch.tensor(random_prompts(model.recipe.model.vocab_size))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx), rtol=0, atol=1e-4)
    again, before = load_hf(tmp_path / "hf", model.recipe).state_dict(), model.state_dict()
    assert again.keys() == before.keys() and all(torch.equal(again[k], before[k]) for k in before)


def test_export_writes_the_tokenizers_own_special_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    made = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    for recipe, overrides, ids, files in [
        ("shakespeare-bytes", [], (None, None), made),  # the bytes tokenizer has none (GPT2Config's is 50256)
        ("gpt2-tiny", [], (50256, 50256), made),  # GPT-2's <|endoftext|>
        # 50256 is not an id of vocab_size 512: neither the id nor GPT-2's tokenizer files
        ("llama-tiny", ["--set", "tokenizer.name=gpt2"], (None, None), made[:2]),
        ("llama-tiny", [], (None, None), made[:2]),  # "hf", and no tokenizer files (LlamaConfig says 1, 2)
    ]:
        ck, out = tmp_path / f"ck-{recipe}-{len(overrides)}", tmp_path / f"hf-{recipe}-{len(overrides)}"
        assert main(["build", recipe, *overrides, "--out", str(ck), "--json"]) == 0
        assert main(["export", str(ck), "--hf", str(out), "--json"]) == 0
        capsys.readouterr()
        config = json.loads((out / "config.json").read_text())
        assert (config["bos_token_id"], config["eos_token_id"]) == ids, recipe
        assert sorted(p.name for p in out.iterdir()) == files


def test_export_copies_the_tokenizer_a_checkpoint_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers

    hf = save_hf(tmp_path, "llama", llama_config(bos_token_id=7, eos_token_id=8))
    raw = RawTokenizer(models.WordLevel({"<unk>": 0, **{f"w{i}": i for i in range(1, 512)}}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="w1", eos_token="w2")
    fast.save_pretrained(hf)
    ck, out = tmp_path / "ck", tmp_path / "back"
    assert main(["build", "--hf", str(hf), "--out", str(ck), "--json"]) == 0
    assert main(["export", str(ck), "--hf", str(out), "--json"]) == 0
    capsys.readouterr()
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)  # the tokenizer's, which generate stops at
    assert transformers.AutoTokenizer.from_pretrained(out)("w3 w4")["input_ids"] == fast("w3 w4")["input_ids"]


def test_an_interrupted_export_says_nothing_was_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gptzoo.hf import files

    def interrupt(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    ck, out = tmp_path / "ck", tmp_path / "out"
    assert main(["build", "gpt2-tiny", "--out", str(ck), "--json"]) == 0
    capsys.readouterr()
    for where, name in [(transformers.AutoConfig, "for_model"), (files, "save_file")]:
        with monkeypatch.context() as patch:
            patch.setattr(where, name, interrupt)
            assert main(["export", str(ck), "--hf", str(out)]) == 130
        assert capsys.readouterr().err == f"interrupted: nothing was written to {out}\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_cli_build_export_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hf = save_hf(tmp_path, "llama", llama_config())
    assert main(["build", "--hf", str(hf), "--out", str(tmp_path / "ck"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["hf"] == str(hf) and summary["params"]["total"] == sum(
        t.numel() for t in load_file(str(hf / "model.safetensors")).values()
    )
    assert main(["export", str(tmp_path / "ck"), "--hf", str(tmp_path / "back")]) == 0
    capsys.readouterr()
    tensors, back = load_file(str(hf / "model.safetensors")), load_file(str(tmp_path / "back" / "model.safetensors"))
    assert tensors.keys() == back.keys() and all(torch.equal(tensors[k], back[k]) for k in tensors)
    # compare with a recipe given beside --hf (eager attention: the config does not pin the kernel)
    (tmp_path / "r.toml").write_text(
        'extends = "llama-tiny"\n[model]\nattention = "eager"\ncontext_length = 256\n'
        'norm = { name = "rmsnorm", eps = 1e-6 }\nposition = { name = "rope", theta = 500000.0 }\n'
    )
    assert (
        main(["compare", str(tmp_path / "r.toml"), "--hf", str(hf), "--new-tokens", "4", "--json"]) == 2
    )  # no tokenizer
    assert "no tokenizer files" in capsys.readouterr().err


def test_cli_compare_json_and_its_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_hf(tmp_path, "g", gpt2_config(vocab_size=50257))  # GPT-2's vocabulary: tiktoken tokenizes
    assert main(["compare", "--hf", str(path), "--prompt", "Hello, world!", "--new-tokens", "5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert isinstance(result["max_abs_diff"], float) and result["max_abs_diff"] <= 1e-4
    assert 0.0 <= result["top1_agreement"] <= 1.0 and result["greedy_match"] is True
    assert result["prompts"][0]["n_tokens"] == 4 and len(result["prompts"][0]["gptzoo_tokens"]) == 5
    # --set reaches the recipe, which must still agree with config.json
    assert main(["compare", "--hf", str(path), "--set", "model.n_layer=1"]) == 2
    assert "[model] n_layer: the recipe says 1" in " ".join(capsys.readouterr().err.split())
    assert main(["compare", "--hf", str(path), "--set", "model.attention=eager", "--new-tokens", "2", "--json"]) == 0
    capsys.readouterr()
    assert main(["compare", "--hf", str(path), "--new-tokens", "1000"]) == 2
    assert "exceed the 128 positions that LearnedPosition encodes" in capsys.readouterr().err
    assert main(["build", "gpt2-small", "--hf", str(path)]) == 2  # checked even without --out
    assert "[model] n_layer: the recipe says 12" in " ".join(capsys.readouterr().err.split())


def test_malformed_configs_and_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = json.loads(llama_config().to_json_string())
    for i, change in enumerate(
        [
            {"num_attention_heads": 0},
            {"rms_norm_eps": "x"},
            {"hidden_act": ["silu"]},
            {"model_type": ["llama"]},
            {"rope_theta": None, "rope_parameters": None},
        ]
    ):
        path = tmp_path / f"c{i}"
        path.mkdir()
        (path / "config.json").write_text(json.dumps({**good, **change}))
        assert main(["build", "--hf", str(path)]) == 2, change
    err = capsys.readouterr().err
    assert err.count("error:") == 5 and "Traceback" not in err
    bad_bin = tmp_path / "c0"
    (bad_bin / "config.json").write_text(json.dumps(good))
    torch.save([torch.zeros(1)], bad_bin / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"does not hold a state dict"):
        load_hf(bad_bin)


def test_rope_scaling_is_read_wherever_it_is_written_and_unknown_types_are_refused(tmp_path: Path) -> None:
    good = json.loads(llama_config().to_json_string())
    for i, (change, position) in enumerate(
        [
            (
                {"rope_parameters": {"type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
                {"name": "rope_linear", "theta": 10000.0, "factor": 2.0},
            ),
            (
                {
                    "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
                    "rope_scaling": {"rope_type": "dynamic", "factor": 2.0},
                },
                {"name": "rope_dynamic", "theta": 500.0, "factor": 2.0},
            ),
        ]
    ):
        path = tmp_path / str(i)
        path.mkdir()
        (path / "config.json").write_text(json.dumps({**good, **change}))
        assert hf_recipe(path).to_dict()["model"]["position"] == position
    path = tmp_path / "longrope"
    path.mkdir()
    longrope = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0], "long_factor": [2.0]}
    (path / "config.json").write_text(json.dumps({**good, "rope_parameters": longrope}))
    with pytest.raises(RecipeError, match=r"config.json rope scaling type 'longrope' is not supported \(gptzoo "):
        hf_recipe(path)


def test_exports_without_an_hf_equivalent_are_refused(tmp_path: Path) -> None:
    for overrides, reason in [
        (
            ["model.position=alibi"],
            "position 'alibi' (it has no 'gpt2' layout: GPT2LMHeadModel has no equivalent of it)",
        ),
        (["model.norm_placement=post"], "norm_placement 'post' (GPT-2 is Pre-LN)"),
        (["model.position=sinusoidal"], "position 'sinusoidal' (it has no 'gpt2' layout"),
        (
            ["model.norm.bias=false"],
            "norm 'layernorm' (its 'gpt2' layout refuses its parameters: GPT2LMHeadModel has no",
        ),
    ]:
        model = gptzoo.build_model(gptzoo.load_recipe("gpt2-tiny", overrides), device="meta")
        with pytest.raises(
            NoEquivalentError,
            match=r"has no Hugging Face GPT-2 equivalent: " + reason.replace("(", r"\(").replace(")", r"\)"),
        ):
            export_hf(model, tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_unsupported_config_fields_are_refused_by_name(tmp_path: Path) -> None:
    cases = [
        (
            gpt2_config(scale_attn_by_inverse_layer_idx=True),
            "config.json scale_attn_by_inverse_layer_idx=True is not supported",
        ),
        (gpt2_config(reorder_and_upcast_attn=True), "config.json reorder_and_upcast_attn=True is not supported"),
        (
            gpt2_config(activation_function="quick_gelu"),
            "config.json activation_function 'quick_gelu' is not supported",
        ),
        (
            llama_config(
                rope_scaling={
                    "rope_type": "longrope",
                    "short_factor": [1.0] * 8,
                    "long_factor": [2.0] * 8,
                    "original_max_position_embeddings": 128,
                }
            ),
            "config.json rope scaling type 'longrope' is not supported",
        ),
        (llama_config(attention_bias=True, mlp_bias=False), "attention_bias=True with mlp_bias=False is not supported"),
    ]
    for i, (config, message) in enumerate(cases):
        path = tmp_path / str(i)
        path.mkdir()
        (path / "config.json").write_text(config.to_json_string())
        with pytest.raises(RecipeError, match=message.replace("(", r"\(")):
            hf_recipe(path)


def test_recipe_beside_hf_must_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_hf(tmp_path, "gpt2", gpt2_config())
    with pytest.raises(RecipeError) as info:
        load_hf(path, gptzoo.load_recipe("gpt2-tiny"))
    assert info.value.problems == [
        f"[model] vocab_size: the recipe says 50257, {path / 'config.json'} says 1000",
    ]
    assert (
        main(["compare", "gpt2-tiny", "--hf", str(path), "--set", "model.vocab_size=1000", "--set", "model.n_layer=3"])
        == 2
    )
    assert f"[model] n_layer: the recipe says 3, {path / 'config.json'} says 2" in " ".join(
        capsys.readouterr().err.split()
    )


def test_bad_checkpoints_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_hf(tmp_path, "good", gpt2_config())
    tensors = load_file(str(path / "model.safetensors"))

    def variant(name: str, change) -> Path:
        out = tmp_path / name
        out.mkdir()
        (out / "config.json").write_text((path / "config.json").read_text())
        changed = dict(tensors)
        change(changed)
        save_file(changed, str(out / "model.safetensors"))
        return out

    missing = variant("missing", lambda t: t.pop("transformer.h.1.mlp.c_fc.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor transformer.h.1.mlp.c_fc.weight"):
        load_hf(missing)
    extra = variant("extra", lambda t: t.update({"transformer.h.2.attn.c_attn.weight": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor transformer.h.2.attn.c_attn.weight"):
        load_hf(extra)
    shaped = variant("shaped", lambda t: t.update({"transformer.h.0.attn.c_attn.weight": torch.zeros(192, 64)}))
    with pytest.raises(
        CheckpointError, match=r"transformer.h.0.attn.c_attn.weight has shape \(192, 64\), expected \(64, 192\)"
    ):
        load_hf(shaped)
    truncated = variant("truncated", lambda t: None)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"cannot read the weights in .*truncated"):
        load_hf(truncated)
    with pytest.raises(CheckpointError, match=r"is not a Hugging Face checkpoint: config.json is missing"):
        load_hf(tmp_path / "missing" / "..")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"has no weights: none of model.safetensors"):
        load_hf(tmp_path / "noweights")
    with pytest.raises(CheckpointError, match=r"no such checkpoint directory: ./nowhere"):
        load_hf("./nowhere")
    for bad in (missing, truncated):
        assert main(["build", "--hf", str(bad), "--out", str(tmp_path / f"out-{bad.name}")]) == 2
        assert not (tmp_path / f"out-{bad.name}").exists()
    err = capsys.readouterr().err
    assert err.count("error:") == 2 and "Traceback" not in err


def test_an_unknown_model_type_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(CheckpointError, match=r"model_type 'mamba' is not supported"):
        hf_recipe(tmp_path)


def test_official_gpt2_weights_when_cached() -> None:
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache("gpt2", "model.safetensors"), str):
        pytest.skip("the official gpt2 weights are not in the local Hugging Face cache")
    result = compare("gpt2", gptzoo.load_recipe("gpt2-small"), prompts=["Hello, my name is", "The meaning of life is"])
    assert_parity(result)


def test_gptzoo_error_is_the_base_of_hf_errors() -> None:
    assert issubclass(NoEquivalentError, GptzooError) and issubclass(CheckpointError, GptzooError)
