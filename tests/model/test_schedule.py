"""Per-layer schedules and block shapes: a recipe's layer_pattern and layer types (validated whole,
changed with --set, written to checkpoints and read back), each block shape's formula, scaled
embeddings and soft-capped logits, and windowed attention's FLOPs against FlopCounterMode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_flops import measured_flops
from tiny import tiny_model

import gptzoo
from gptzoo.cli import main
from gptzoo.errors import GptzooError, RecipeError
from gptzoo.flops import forward_flops
from gptzoo.interfaces import AttentionContext
from gptzoo.model.checkpoint import load_checkpoint

SCHEDULED = """
extends = "llama-tiny"
[model]
n_layer = 5
layer_pattern = ["local", "local", "global"]
[model.layer_types.local]
attention = { name = "sliding_window", window = 4 }
position = { theta = 100.0 }
[model.layer_types.global]
"""


def _recipe(tmp_path: Path, text: str, overrides: list[str] | None = None) -> gptzoo.Recipe:
    path = tmp_path / "scheduled.toml"
    path.write_text(text)
    return gptzoo.load_recipe(path, overrides or [])


def _problems(tmp_path: Path, text: str, overrides: list[str] | None = None) -> list[str]:
    with pytest.raises(RecipeError) as info:
        _recipe(tmp_path, text, overrides)
    return info.value.problems


def test_a_pattern_repeats_over_the_layers_and_a_partial_component_keeps_the_models(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, SCHEDULED)
    m = recipe.model
    assert m.schedule() == ["local", "local", "global", "local", "local"]
    local = m.layer_components("local")
    assert (local["attention"].name, local["attention"].kwargs) == ("sliding_window", {"window": 4})
    assert (local["position"].name, local["position"].kwargs) == ("rope", {"theta": 100.0})  # llama-tiny's rope
    assert m.layer_components("global") == m.layer_components("")
    model = gptzoo.build_model(recipe)
    assert model.position_of == (1, 1, 0, 1, 1) and model.layer_positions[0].theta == 100.0
    assert [b.attn.window for b in model.blocks] == [4, 4, 0, 4, 4]
    summary = gptzoo.build(str(tmp_path / "scheduled.toml"), seq_len=64)
    assert summary["schedule"]["text"] == "(local x2, global) x1 + local x2"
    assert summary["schedule"]["count"] == {"local": 4, "global": 1}


def test_a_schedule_survives_a_checkpoint_and_set(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, SCHEDULED, ["model.layer_types.local.attention.window=6"])
    assert recipe.model.layer_components("local")["attention"].kwargs == {"window": 6}
    model = gptzoo.build_model(recipe)
    gptzoo.build(
        str(tmp_path / "scheduled.toml"),
        overrides=["model.layer_types.local.attention.window=6"],
        out=tmp_path / "ckpt",
    )
    text = (tmp_path / "ckpt" / "recipe.toml").read_text()
    assert 'layer_pattern = ["local", "local", "global"]' in text
    assert 'layer_types = { local = { position = "gptzoo 0.1.0", attention = "gptzoo 0.1.0" } }' in text
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert loaded.recipe.model == recipe.model
    assert [b.attn.window for b in loaded.blocks] == [b.attn.window for b in model.blocks]


def test_schedule_problems_are_reported_with_their_key_paths(tmp_path: Path) -> None:
    assert _problems(tmp_path, SCHEDULED.replace("position = { theta = 100.0 }", "norm_placment = 'pre'")) == [
        "[model] layer_types.local: unknown key 'norm_placment'; did you mean 'norm_placement'? (available: norm, "
        "activation, mlp, position, attention, norm_placement) (a layer type changes components and norm_placement "
        "only)",
    ]
    assert _problems(tmp_path, SCHEDULED.replace('["local", "local", "global"]', '["local", "lokal"]')) == [
        "[model] layer_pattern names 'lokal', which [model.layer_types] does not define; did you mean 'local'?"
        " (available: local, global); add [model.layer_types.lokal] (empty: [model]'s components)",
        "[model] layer_types.global is not used by layer_pattern; add it to the pattern or remove it",
    ]
    assert _problems(tmp_path, SCHEDULED.replace("window = 4", "window = 0")) == [
        "[model] layer_types.local.attention (sliding_window): window must be a number of keys >= 1, got 0"
    ]
    assert _problems(tmp_path, SCHEDULED, ["model.layer_pattern=3"]) == [  # the override is the source
        "[model] layer_pattern must be a list of layer type names (letters, digits, _ and -), e.g. "
        '["sliding", "full"], got 3 (int)'
    ]
    with pytest.raises(RecipeError) as info:
        _recipe(tmp_path, SCHEDULED, ["model.layer_types.local.depth=3"])
    assert info.value.problems == [
        "--set 'model.layer_types.local.depth=3': a layer type is model.layer_types.TYPE={...}, its component "
        "model.layer_types.TYPE.COMPONENT[.PARAM]=VALUE (COMPONENT one of norm, activation, mlp, position, attention), "
        "its norm placement model.layer_types.TYPE.norm_placement=VALUE"
    ]
    # a whole layer type, an empty one too
    overrides = ['model.layer_pattern=["local", "global", "full"]', "model.layer_types.full={}"]
    recipe = _recipe(tmp_path, SCHEDULED, overrides)
    assert recipe.model.schedule() == ["local", "global", "full", "local", "global"]
    assert recipe.model.layer_components("full") == recipe.model.layer_components("")


def test_a_layer_type_places_its_norms_its_own_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """OLMo Hybrid's shape: [model]'s layers normalize each sublayer's output, the "local" ones are Pre-LN. Each
    block is of its type's class, the model keeps its final norm, a checkpoint and --set keep the placement, and
    build says which types are placed otherwise."""
    text = SCHEDULED.replace("[model]\n", '[model]\nnorm_placement = "reordered"\n', 1).replace(
        "position = { theta = 100.0 }", 'norm_placement = "pre"'
    )
    recipe = _recipe(tmp_path, text)
    assert [recipe.model.placement(t) for t in recipe.model.schedule()] == ["pre", "pre", "reordered", "pre", "pre"]
    model = gptzoo.build_model(recipe)
    assert [type(b).__name__ for b in model.blocks] == ["PreNormBlock"] * 2 + ["ReorderedBlock"] + ["PreNormBlock"] * 2
    assert not isinstance(model.ln_f, torch.nn.Identity)
    ids = torch.randint(0, 256, (1, 9))
    with torch.no_grad():
        x = model.wte(ids)
        ctx = AttentionContext(0, None, None, is_causal=True)
        block = model.blocks[2]  # reordered: x + norm(attn(x)), then x + norm(mlp(x))
        h = x + block.ln_1(block.attn(x, ctx))
        torch.testing.assert_close(block(x, ctx), h + block.ln_2(block.mlp(h)))
    gptzoo.build(str(tmp_path / "scheduled.toml"), out=tmp_path / "ckpt")
    assert load_checkpoint(tmp_path / "ckpt").recipe.model == recipe.model
    flipped = _recipe(tmp_path, text, ["model.layer_types.local.norm_placement=sandwich"])
    assert type(gptzoo.build_model(flipped).blocks[0]).__name__ == "SandwichBlock"
    summary = gptzoo.build(str(tmp_path / "scheduled.toml"), seq_len=64)
    assert summary["schedule"]["norm_placement"] == {"local": "pre"}
    assert main(["build", str(tmp_path / "scheduled.toml")]) == 0
    assert "layers: (local x2, global) x1 + local x2 (4 local, 1 global; local: norm_placement=pre)" in " ".join(
        capsys.readouterr().out.split()
    )


def test_a_layer_type_s_placement_is_checked(tmp_path: Path) -> None:
    bad = SCHEDULED.replace("position = { theta = 100.0 }", 'norm_placement = "sideways"')
    assert _problems(tmp_path, bad) == [
        "[model] layer_types.local.norm_placement='sideways' must be one of 'pre', 'post', 'sandwich', 'reordered', "
        "'parallel'"
    ]
    post = SCHEDULED.replace("position = { theta = 100.0 }", 'norm_placement = "post"')
    assert _problems(tmp_path, post) == [
        "[model] layer_types.local.norm_placement='post' mixes Post-LN layers with others: a Post-LN model ends on a "
        "normalized layer and has no final norm, which the others need; give every layer type the same norm_placement"
    ]


def test_only_the_models_position_adds_an_embedding(tmp_path: Path) -> None:
    with pytest.raises(GptzooError, match=r"layer_types.local.position \(LearnedPosition\) adds an embedding"):
        gptzoo.build_model(_recipe(tmp_path, SCHEDULED.replace("position = { theta = 100.0 }", 'position = "learned"')))


CAUSAL = AttentionContext(0, None, None, is_causal=True)
"""Queries and keys the same tokens, no rotary: what a block's formula needs."""


@pytest.mark.parametrize(
    ("placement", "formula"),
    [
        ("sandwich", lambda b, x, c: (h := x + b.post_ln_1(b.attn(b.ln_1(x), c))) + b.post_ln_2(b.mlp(b.ln_2(h)))),
        ("reordered", lambda b, x, c: (h := x + b.ln_1(b.attn(x, c))) + b.ln_2(b.mlp(h))),
        ("parallel", lambda b, x, c: x + b.attn(b.ln_1(x), c) + b.mlp(b.ln_2(x))),
    ],
)
def test_block_shapes_compute_their_formulas(placement: str, formula) -> None:
    model = tiny_model("llama-tiny", f"model.norm_placement={placement}")
    for block in model.blocks:  # norms that are not the identity, so a misplaced one shows
        for name in block.norms():
            torch.nn.init.normal_(getattr(block, name).weight, 1.0, 0.3)
    block = model.blocks[0]
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        torch.testing.assert_close(block(x, CAUSAL), formula(block, x, CAUSAL))
    assert not isinstance(model.ln_f, torch.nn.Identity)
    expected = {"sandwich": 4, "reordered": 2, "parallel": 2}[placement]
    assert len(block.norms()) == expected


def test_scaled_embeddings_and_soft_capped_logits() -> None:
    plain = tiny_model("llama-tiny")
    capped = tiny_model("llama-tiny", "model.scale_embeddings=true", "model.logit_softcap=2.0")
    idx = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        x = plain.wte(idx) * torch.tensor(64**0.5)
        for block in plain.blocks:
            x = block(x, plain.attention_context(gptzoo.interfaces.Positions.plain(0, 3, idx.device), x.dtype))
        expected = torch.tanh(plain.lm_head(plain.ln_f(x)) / 2.0) * 2.0
        torch.testing.assert_close(capped(idx), expected)
    assert capped(idx).abs().max() < 2.0


def test_granite_s_multipliers_scale_the_embeddings_each_sublayer_and_the_logits(tmp_path: Path) -> None:
    plain = tiny_model("llama-tiny")
    scaled = tiny_model(
        "llama-tiny", "model.embedding_multiplier=12.0", "model.residual_multiplier=0.25", "model.logits_scaling=3.0"
    )
    idx = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        x = plain.wte(idx) * 12.0
        ctx = plain.attention_context(gptzoo.interfaces.Positions.plain(0, 3, idx.device), x.dtype)
        for block in plain.blocks:
            x = x + 0.25 * block.attn(block.ln_1(x), ctx)
            x = x + 0.25 * block.mlp(block.ln_2(x))
        torch.testing.assert_close(scaled(idx), plain.lm_head(plain.ln_f(x)) / 3.0)
    recipe = gptzoo.load_recipe("llama-tiny", ["model.residual_multiplier=0.25"])
    assert recipe.to_dict()["model"]["residual_multiplier"] == 0.25
    assert "embedding_multiplier" not in recipe.to_dict()["model"]  # 1: not written, as before the field
    summary = gptzoo.build("llama-tiny", overrides=["model.logits_scaling=3.0"], seq_len=16)
    assert summary["shape"]["logits_scaling"] == 3.0 and "residual_multiplier" not in summary["shape"]


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (
            ["model.residual_multiplier=0.0"],
            "[model] residual_multiplier=0.0 must be a finite number above 0 (1: none)",
        ),
        (["model.logits_scaling=-3.0"], "[model] logits_scaling=-3.0 must be a finite number above 0 (1: none)"),
        (
            ["model.scale_embeddings=true", "model.embedding_multiplier=12.0"],
            "[model] scale_embeddings=true and embedding_multiplier=12.0 both scale the embeddings; give one "
            "(scale_embeddings multiplies by sqrt(n_embd))",
        ),
    ],
    ids=["zero", "negative", "both-scales"],
)
def test_multipliers_are_checked(overrides: list[str], problem: str) -> None:
    with pytest.raises(RecipeError) as info:
        gptzoo.load_recipe("llama-tiny", overrides)
    assert info.value.problems == [problem]


def test_windowed_attention_flops_are_what_runs() -> None:
    """Past 4 x window tokens a sliding layer runs blocks: FlopCounterMode sees exactly the analytic count,
    which is far below the full square's."""
    recipe = gptzoo.load_recipe(
        "gemma3-270m",
        [
            "model.n_layer=6",
            "model.n_embd=64",
            "model.head_dim=16",
            "model.d_ff=64",
            "model.vocab_size=256",
            "model.layer_types.sliding.attention.window=4",
        ],
    )
    model = gptzoo.build_model(recipe, dtype=torch.bfloat16).eval()
    B, T = 2, 48
    analytic = forward_flops(model, B, T)
    assert sum(analytic.values()) == measured_flops(model, torch.randint(0, 256, (B, T)))
    sliding = [b.attn for b in model.blocks if b.attn.window]
    assert len(sliding) == 5
    per_layer = sliding[0].flops(B, T)["attention scores"]
    assert per_layer == 2 * 2 * B * 4 * 16 * (16 * 16 + 16 * 19 + 16 * 19)  # three blocks of 16 queries
    assert per_layer < sliding[0].flops(B, 16)["attention scores"] * 9  # vs (48/16)^2 = 9 full squares


def test_a_checkpoint_takes_a_layer_types_kernel_and_parameters_but_not_another_component(tmp_path: Path) -> None:
    gptzoo.build(_write(tmp_path), out=tmp_path / "ckpt")
    model = load_checkpoint(tmp_path / "ckpt", overrides=["model.layer_types.local.attention={name='eager', window=2}"])
    assert [type(b.attn).__name__ for b in model.blocks][:3] == [
        "EagerSelfAttention",
        "EagerSelfAttention",
        "CausalSelfAttention",
    ]
    assert model.blocks[0].attn.window == 2
    with pytest.raises(gptzoo.CheckpointError, match=r"layer 0's position would change from 'rope' to 'alibi'"):
        load_checkpoint(tmp_path / "ckpt", overrides=["model.layer_types.local.position=alibi"])


def _write(tmp_path: Path) -> str:
    path = tmp_path / "scheduled.toml"
    path.write_text(SCHEDULED)
    return str(path)


def test_audit_cases_are_refused_with_their_key(tmp_path: Path) -> None:
    assert _problems(tmp_path, SCHEDULED.replace("n_layer = 5", "n_layer = 5\nlogit_softcap = inf")) == [
        "[model] logit_softcap=inf must be 0 (off) or a finite number above it"
    ]
    bad_pattern = SCHEDULED.replace('["local", "local", "global"]', '["a b"]')
    assert _problems(tmp_path, bad_pattern.replace("n_layer = 5", "n_layer = 5\nlogit_softcap = -1.0")) == [
        "[model] layer_pattern must be a list of layer type names (letters, digits, _ and -), e.g. "
        '["sliding", "full"], got [\'a b\'] (list)',
        "[model] logit_softcap=-1.0 must be 0 (off) or a finite number above it",
    ]
    assert _problems(tmp_path, SCHEDULED, ["model.layer_pattern=" + str(["local"] * 5000).replace("'", '"')]) == [
        "[model] layer_pattern has 5000 entries, more than the 4096 layers a model may have"
    ]
    yarn = ["model.position={name='rope_yarn', theta=1.0}"]
    assert _problems(tmp_path, SCHEDULED.replace("position = { theta = 100.0 }", ""), yarn) == [
        "[model] position (rope_yarn): rope_yarn needs theta > 1 (its ramp divides by log(theta)), got 1.0"
    ]


def test_a_layer_types_renamed_component_on_a_checkpoint_is_unknown_not_uninstalled(tmp_path: Path) -> None:
    gptzoo.build(_write(tmp_path), out=tmp_path / "ckpt")
    with pytest.raises(RecipeError) as info:
        load_checkpoint(tmp_path / "ckpt", overrides=["model.layer_types.local.attention=nope"])
    assert "unknown attention 'nope'" in str(info.value), str(info.value)


def test_build_shows_the_kv_cache_split_by_layer_type_under_the_kv_row(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gemma 3's sliding and full layers split the KV cache per token; the split sits under that row, not
    under the bytes read decoding a token."""
    from gptzoo.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["build", "gemma3-270m"]) == 0
    rows = [line.strip("│ ").split("│")[0].strip() for line in capsys.readouterr().out.splitlines() if "│" in line]
    at = next(i for i, row in enumerate(rows) if row.startswith("KV cache per token"))
    assert rows[at + 1 : at + 4] == [
        "of which 15 sliding layers",
        "of which 3 full layers",
        "bytes read decoding a token (at 32768 cached)",
    ]
