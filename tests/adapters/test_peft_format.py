"""Adapters in peft's format, proven against peft itself on tiny random checkpoints of four layouts:
Llama (q/k/v as separate modules over gptzoo's fused c_attn, GQA), GPT-2 (Conv1D, one c_attn), GPT-NeoX
(q, k, v rows interleaved per head) and Qwen2 (biased q/k/v). Both directions: an adapter gptzoo trains,
written in peft's format, gives peft's logits; an adapter peft made gives gptzoo's logits (side path and
merged), and the merged export equals the unmerged model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from hfparity import save_hf
from safetensors.torch import load_file, save_file

import gptzoo
from gptzoo.adapters.lora import LoRASpec, attach
from gptzoo.adapters.peft_format import attach_peft, merge_peft, read_peft, save_peft
from gptzoo.adapters.targets import model_parts, offered, select
from gptzoo.errors import CheckpointError
from gptzoo.hf import export_hf

peft = pytest.importorskip("peft")

TINY = {"vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96}
CONFIGS = {
    "llama": transformers.LlamaConfig(
        **TINY, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False
    ),
    "gpt2": transformers.GPT2Config(
        vocab_size=96, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
    ),
    "gpt_neox": transformers.GPTNeoXConfig(**TINY, num_attention_heads=4, max_position_embeddings=64),
    "qwen2": transformers.Qwen2Config(**TINY, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64),
}
PEFT_TARGETS = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "gpt_neox": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
IDS = torch.tensor([[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 12, 50]])


@pytest.fixture(scope="module", params=list(CONFIGS))
def base(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    family = request.param
    return family, save_hf(tmp_path_factory.mktemp(family), "base", CONFIGS[family])


def hf_logits(path: Path, adapter: Path | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    if adapter is not None:
        model = peft.PeftModel.from_pretrained(model, str(adapter)).eval()
    with torch.no_grad():
        return model(IDS).logits[0]


def ours(path: Path, dtype: torch.dtype = torch.float32) -> gptzoo.GPT:
    return gptzoo.load_model(hf=path).model.to(dtype).eval()


def logits(model: gptzoo.GPT) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS)[0].float()


def trained(path: Path, targets: list[str], spec: LoRASpec) -> gptzoo.GPT:
    """gptzoo's model with adapters on ``targets``, their B (and DoRA magnitudes) drawn away from the init."""
    model = ours(path)
    table = offered(model_parts(model))
    torch.manual_seed(1)
    attach(model, [p for t in select(table, targets) for p in table[t]], spec)
    away_from_init(model)
    return model.eval()


@torch.no_grad()
def away_from_init(model: torch.nn.Module) -> None:
    """Every B (zero at init) and DoRA magnitude (the weight's norms at init) drawn to other values."""
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.normal_(0, 0.1)
        if "lora_magnitude" in name:
            p.mul_(1 + 0.2 * torch.rand_like(p))


@pytest.mark.parametrize(
    ("targets", "spec"),
    [
        (["q", "v"], LoRASpec(rank=4, alpha=8)),
        (["all"], LoRASpec(rank=4, alpha=8)),
        (["q", "k", "o", "down"], LoRASpec(rank=3, alpha=5, dora=True)),
        (["v", "up"], LoRASpec(rank=2, alpha=4, rslora=True)),
    ],
    ids=["qv", "all", "dora", "rslora"],
)
def test_an_adapter_gptzoo_trains_gives_peft_the_same_logits(
    base: tuple[str, Path], targets: list[str], spec: LoRASpec, tmp_path: Path
) -> None:
    family, path = base
    model = trained(path, targets, spec)
    config = save_peft(model, tmp_path / "adapter", base=str(path))
    tensors = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert all(k.startswith("base_model.model.") for k in tensors)
    assert not any("embed" in k or "lm_head" in k or "wte" in k for k in tensors)  # vLLM refuses full weights
    assert config["use_dora"] is spec.dora and config["use_rslora"] is spec.rslora and config["r"] == spec.rank
    theirs = hf_logits(path, tmp_path / "adapter")
    assert (theirs - hf_logits(path)).abs().max() > 1e-2  # the adapter changes the logits
    assert (logits(model) - theirs).abs().max() < 1e-4
    side = ours(path)  # read back: gptzoo's reading of the files equals peft's
    attach_peft(side, read_peft(tmp_path / "adapter"))
    assert (logits(side) - theirs).abs().max() < 1e-4


def test_the_export_permutes_b_with_the_interleaved_rows(tmp_path: Path) -> None:
    """GPT-NeoX keeps each head's q, k, v rows together: B's rows follow the weight's, A stays whole."""
    path = save_hf(tmp_path, "neox", CONFIGS["gpt_neox"])
    model = trained(path, ["k"], LoRASpec(rank=2, alpha=2))
    save_peft(model, tmp_path / "adapter", base=str(path))
    b = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    fused = b["base_model.model.gpt_neox.layers.0.attention.query_key_value.lora_B.weight"]
    ours_b = model.blocks[0].attn.c_attn.lora_B["k"].detach()
    per_head = fused.reshape(4, 3, 16, 2)  # (heads, q/k/v, head_dim, r)
    assert torch.equal(per_head[:, 1].reshape(64, 2), ours_b)
    assert per_head[:, 0].abs().sum() == 0 and per_head[:, 2].abs().sum() == 0


def peft_made(path: Path, out: Path, family: str, **config: Any) -> Path:
    """An adapter made and saved by peft itself, with nonzero B on every target."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lora = peft.LoraConfig(target_modules=PEFT_TARGETS[family], **{"r": 4, "lora_alpha": 8, **config})
    adapted = peft.get_peft_model(model, lora)
    torch.manual_seed(2)
    away_from_init(adapted)
    adapted.save_pretrained(out)
    return out


@pytest.mark.parametrize(
    "config",
    [{}, {"use_dora": True}, {"use_rslora": True, "rank_pattern": {"v_proj": 6}, "alpha_pattern": {"o_proj": 3}}],
    ids=["lora", "dora", "patterns"],
)
def test_an_adapter_peft_made_gives_gptzoo_the_same_logits(
    base: tuple[str, Path], config: dict[str, Any], tmp_path: Path
) -> None:
    family, path = base
    adapter = peft_made(path, tmp_path / "adapter", family, **config)
    theirs = hf_logits(path, adapter)
    side = ours(path)
    modules = attach_peft(side, read_peft(adapter))
    per_layer = 4 if family == "gpt2" else len(PEFT_TARGETS[family])  # GPT-2's c_proj: attn's and mlp's
    assert len(modules) == per_layer * 2
    assert (logits(side) - theirs).abs().max() < 1e-4
    merged = ours(path)
    merge_peft(merged, read_peft(adapter))
    assert (logits(merged) - theirs).abs().max() < 1e-4


def test_the_merged_export_equals_the_unmerged_model(tmp_path: Path) -> None:
    """The merged weights, written as a Hugging Face checkpoint and run by transformers in float64, equal peft's
    unmerged model in float64 (float32's own rounding of two different sums is ~1e-5 here, ~1e-4 on 135M)."""
    path = save_hf(tmp_path, "llama", CONFIGS["llama"])
    adapter = peft_made(path, tmp_path / "adapter", "llama", use_dora=True)
    model = ours(path)
    merge_peft(model, read_peft(adapter))
    export_hf(model, tmp_path / "merged")
    merged = hf_logits(tmp_path / "merged", dtype=torch.float64)
    unmerged = hf_logits(path, adapter, dtype=torch.float64)
    assert (merged - unmerged).abs().max() < 1e-4
    assert (hf_logits(tmp_path / "merged") - hf_logits(path, adapter)).abs().max() < 1e-4


def test_a_config_with_only_its_type_and_targets_loads(tmp_path: Path) -> None:
    path = save_hf(tmp_path, "llama", CONFIGS["llama"])
    adapter = peft_made(path, tmp_path / "adapter", "llama", r=8, lora_alpha=16)
    targets = {"peft_type": "LORA", "target_modules": PEFT_TARGETS["llama"]}
    (adapter / "adapter_config.json").write_text(json.dumps(targets))
    model = ours(path)
    attach_peft(model, read_peft(adapter))  # peft's defaults: r 8, lora_alpha 8, so the scale is 1 (not 16/8)
    a = read_peft(adapter).tensors
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    assert model.blocks[0].attn.c_attn.scales["q_proj"] == 1.0
    assert torch.equal(model.blocks[0].attn.c_attn.lora_A["q_proj"], a[key + ".lora_A.weight"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"peft_type": "PREFIX_TUNING"}, "peft_type 'PREFIX_TUNING' is not supported; gptzoo applies LoRA adapters"),
        ({"peft_type": "IA3"}, "peft_type 'IA3' is not supported"),
        ({"bias": "all"}, "asks for bias 'all' (trained biases), which gptzoo does not apply"),
        ({"modules_to_save": ["lm_head"]}, "asks for modules_to_save (whole modules saved beside the adapter)"),
        ({"r": 0}, "asks for r 0 (a positive number is needed)"),
    ],
)
def test_configs_gptzoo_cannot_apply_are_refused_by_name(change: dict[str, Any], message: str, tmp_path: Path) -> None:
    path = save_hf(tmp_path, "llama", CONFIGS["llama"])
    adapter = peft_made(path, tmp_path / "adapter", "llama")
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError) as raised:
        read_peft(adapter)
    assert message in str(raised.value)


def test_an_adapter_of_another_base_is_refused_before_any_weight_changes(tmp_path: Path) -> None:
    path = save_hf(tmp_path, "llama", CONFIGS["llama"])
    wider = transformers.LlamaConfig(**{**CONFIGS["llama"].to_dict(), "intermediate_size": 128})
    other = save_hf(tmp_path, "other", wider)
    adapter = peft_made(other, tmp_path / "adapter", "llama")
    model = ours(path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as raised:
        merge_peft(model, read_peft(adapter))
    assert "does not fit this model (is it for another base model?" in str(raised.value)
    assert "model.layers.0.mlp.down_proj: lora_A (4, 128) and lora_B (64, 4) do not fit its weight (64 x 96)" in str(
        raised.value
    )
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_tensors_of_a_kind_gptzoo_does_not_apply_are_named(tmp_path: Path) -> None:
    path = save_hf(tmp_path, "llama", CONFIGS["llama"])
    adapter = peft_made(path, tmp_path / "adapter", "llama")
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    tensors["base_model.model.model.embed_tokens.lora_embedding_A"] = torch.zeros(4, 96)
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    with pytest.raises(CheckpointError) as raised:
        read_peft(adapter)
    assert "holds base_model.model.model.embed_tokens.lora_embedding_A, which are not LoRA tensors" in str(raised.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"r": 8}, "model.layers.0.mlp.down_proj: its lora_A has rank 4, but adapter_config.json gives it r=8"),
        (
            {"rank_pattern": {"v_proj": 2}},
            "model.layers.0.self_attn.v_proj: its lora_A has rank 4, but adapter_config.json gives it r=2",
        ),
        (
            {"target_modules": ["q_proj", "v_proj"]},
            "model.layers.0.mlp.down_proj has tensors, but target_modules (['q_proj', 'v_proj']) does not name it",
        ),
        (
            {"use_dora": True},
            "model.layers.0.mlp.down_proj has no DoRA magnitude, but adapter_config.json says use_dora=true",
        ),
    ],
    ids=["r", "rank_pattern", "target_modules", "use_dora"],
)
def test_a_config_that_disagrees_with_its_tensors_is_refused_as_peft_would(
    change: dict[str, Any], message: str, tmp_path: Path
) -> None:
    """peft refuses a directory whose ranks disagree with its tensors, and leaves out (or initializes anew) what
    its config does not ask for; gptzoo used to apply such an adapter at the config's scale, silently."""
    path = save_hf(tmp_path, "llama", CONFIGS["llama"])
    adapter = peft_made(path, tmp_path / "adapter", "llama")
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, **change}))
    model = ours(path)
    with pytest.raises(CheckpointError) as raised:
        attach_peft(model, read_peft(adapter))
    assert str(raised.value).startswith(
        f"--adapter {adapter}: its tensors and adapter_config.json disagree, so peft refuses it or applies it "
        f"otherwise than its tensors say: {message}"
    )


def test_an_adapter_file_outside_its_directory_is_refused(tmp_path: Path) -> None:
    path = save_hf(tmp_path, "llama", CONFIGS["llama"])
    adapter = peft_made(path, tmp_path / "adapter", "llama")
    outside = tmp_path / "elsewhere.safetensors"
    (adapter / "adapter_model.safetensors").rename(outside)
    (adapter / "adapter_model.safetensors").symlink_to(outside)
    with pytest.raises(CheckpointError) as raised:
        read_peft(adapter)
    assert str(raised.value).startswith(
        f"{adapter / 'adapter_model.safetensors'} links to {outside}, outside {adapter}; every file a checkpoint "
    )
