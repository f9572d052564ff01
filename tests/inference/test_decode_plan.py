"""A decoding step as one native call (gptzoo.inference.decode_plan) computes what the eager forward
computes, for every registered component it accepts, and refuses, with the reason, what it cannot
describe; generate() uses it wherever it applies. A plugin's component decodes natively through the
lowering it registers (gptzoo.inference.lowerings), or through its old decode_ops, with a warning."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from fakedist import RING_WINDOW, UNITNORM_CLASS, UNITNORM_DECODE_OPS, FakeSite, unitnorm
from tiny import tiny_model
from torch import nn

import gptzoo
import gptzoo_plugins
from gptzoo.cli import main
from gptzoo.errors import GptzooError, GptzooWarning
from gptzoo.inference import engine as engine_module
from gptzoo.inference import matvec
from gptzoo.inference.decode_plan import compile_step
from gptzoo.inference.generate import generate, plan_generation
from gptzoo.inference.native import library, unavailable_reason
from gptzoo.inference.paths import SPLIT, DecodePath, EagerComponent
from gptzoo.inference.quantize import quantize
from gptzoo.tokenizer import load_tokenizer

pytestmark = pytest.mark.skipif(library() is None, reason=f"native kernels unavailable: {unavailable_reason()}")

GEMMA_LIKE = [
    "model.norm.name=gemma_rmsnorm",
    "model.norm_placement=sandwich",
    "model.activation=gelu_tanh",
    "model.scale_embeddings=true",
    "model.logit_softcap=30.0",
    "model.attention={name='causal', qk_norm='head', scale=0.3}",
    "model.layer_pattern=['sliding', 'full']",
    "model.layer_types.sliding.attention={name='sliding_window', window=3, qk_norm='head', scale=0.3}",
    "model.layer_types.sliding.position={theta=100.0}",
    "model.layer_types.full.attention={name='causal', qk_norm='head', scale=0.3}",
]
"""Gemma 3's parts at test size: (1 + w) RMSNorm, sandwich norms, GeGLU, scaled embeddings, capped
logits, per-head QK-norm, a window of 3 keys (a ring buffer that wraps many times) on every other
layer with its own RoPE."""

MODELS = {
    "gpt2": ("gpt2-tiny",),
    "llama": ("llama-tiny",),
    "gemma": ("llama-tiny", *GEMMA_LIKE),
    "olmo": ("llama-tiny", "model.norm.scale_in_float32=true", "model.attention={name='causal', qk_norm='full'}"),
    "neox": ("gpt2-tiny", "model.position={name='rope', fraction=0.5}", "model.norm_placement=parallel"),
    "postln": ("gpt2-tiny", "model.norm_placement=post", "model.position=sinusoidal"),
    "reordered": ("llama-tiny", "model.norm_placement=reordered", "model.attention={name='eager', softcap=5.0}"),
    "granite": (
        "llama-tiny",
        "model.embedding_multiplier=12.0",
        "model.residual_multiplier=0.22",
        "model.logits_scaling=3.0",
        "model.attention={name='eager', scale=0.3}",
    ),
    "placed-by-type": (
        "llama-tiny",
        "model.layer_pattern=['pre', 'reordered']",
        "model.layer_types={pre={}, reordered={norm_placement='reordered'}}",
    ),
}
"""Recipes the plan must take: every block shape, norm, rotation and attention feature."""


def decode_both(
    model: gptzoo.GPT,
    prompts: torch.Tensor,
    steps: int,
    threads: int = 1,
    mask: torch.Tensor | None = None,
    eager_parts: list[str] | None = None,
):
    """Logits of ``steps`` greedy steps after ``prompts`` (B, T; ``mask``: 0 for left padding): the
    eager forward's and the compiled step's, a split one where ``eager_parts`` lists the reasons of
    the modules it runs eagerly (in the step's order), else one native call."""
    eager_cache, plan_cache = model.init_cache(len(prompts), 64), model.init_cache(len(prompts), 64)
    with torch.no_grad(), matvec.native_decoding(model) as tuner:
        tuner.choices, tuner.current = [threads], threads
        model(prompts, eager_cache, attention_mask=mask)
        model(prompts, plan_cache, attention_mask=mask)
        step, why = compile_step(model, plan_cache, len(prompts), split=eager_parts is not None)
        assert step is not None, why
        assert [part.reason for part in step.eager] == (eager_parts or [])
        eager, planned = [], []
        token = prompts[:, -1:]
        for _ in range(steps):
            eager.append(model(token, eager_cache)[:, -1])
            planned.append(step(token)[:, -1])
            token = eager[-1].argmax(-1, keepdim=True)
    return torch.stack(eager), torch.stack(planned)


def prompts(model: gptzoo.GPT, batch: int = 1, length: int = 5) -> torch.Tensor:
    return torch.randint(0, model.wte.weight.shape[0], (batch, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", MODELS)
def test_step_equals_the_eager_forward_in_float32(name: str) -> None:
    model = tiny_model(*MODELS[name])
    eager, planned = decode_both(model, prompts(model), steps=12)
    assert (planned - eager).abs().max().item() <= 1e-5 * eager.abs().max().item()
    assert torch.equal(planned.argmax(-1), eager.argmax(-1))


@pytest.mark.parametrize("name", ["llama", "gemma", "reordered", "granite"])
def test_step_rounds_as_the_eager_forward_in_bfloat16(name: str) -> None:
    model = tiny_model(*MODELS[name]).to(torch.bfloat16)
    eager, planned = decode_both(model, prompts(model), steps=12)
    diff = (planned.float() - eager.float()).abs().max().item()
    if name in ("reordered", "granite"):  # explicit attention: the same roundings as torch's operations, one by one
        assert diff == 0.0
    else:  # scaled_dot_product_attention's kernel has its own exp: a bfloat16 rounding here and there
        assert diff <= 0.02 * eager.float().abs().max().item()
    assert torch.equal(planned.argmax(-1), eager.argmax(-1))


def test_rows_and_threads_do_not_change_a_bit() -> None:
    model = tiny_model(*MODELS["llama"])
    batch = prompts(model, batch=3)
    eager, one = decode_both(model, batch, steps=6, threads=1)
    _, three = decode_both(model, batch, steps=6, threads=3)
    assert torch.equal(one, three)
    assert (one - eager).abs().max().item() <= 1e-5 * eager.abs().max().item()


@pytest.mark.parametrize(("name", "dtype"), [("gpt2", "float32"), ("gemma", "float32"), ("llama", "bfloat16")])
def test_left_padded_rows_decode_as_the_eager_forward(name: str, dtype: str) -> None:
    """Rows of different lengths: each row its own positions (learned, rotary), padding never attended to."""
    model = tiny_model(*MODELS[name]).to(getattr(torch, dtype))
    batch = prompts(model, batch=3, length=6)
    mask = torch.ones_like(batch)
    mask[0, :4], mask[2, :1] = 0, 0
    eager, planned = decode_both(model, batch, steps=10, mask=mask)
    bound = 1e-5 if dtype == "float32" else 0.02
    assert (planned.float() - eager.float()).abs().max().item() <= bound * eager.float().abs().max().item()
    assert torch.equal(planned.argmax(-1), eager.argmax(-1))


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_weights(precision: str) -> None:
    model = tiny_model(*MODELS["llama"], "model.d_ff=192")  # every linear's input in whole blocks of 32
    assert quantize(model, precision) == 9 and not any(type(m) is nn.Linear for m in model.modules())
    eager, planned = decode_both(model, prompts(model), steps=8)
    # int8's products read x in int16 blocks: a last-bit change upstream can move an input by one step
    assert (planned - eager).abs().max().item() <= 1e-4 * eager.abs().max().item()
    assert torch.equal(planned.argmax(-1), eager.argmax(-1))


def test_every_registered_component_is_computed_right_or_refused_with_its_name() -> None:
    """Each registered norm, activation, mlp, position and attention (third-party ones included) in
    the llama recipe: the plan equals the eager forward, or compile_step says which class it refuses."""
    registry = gptzoo.get_registry()
    checked = refused = 0
    for kind in ("norm", "activation", "mlp", "position", "attention"):
        for name in registry.names(kind):
            try:
                model = tiny_model("llama-tiny", f"model.{kind}={name}")
            except gptzoo.GptzooError:
                continue  # a component this recipe's other parts cannot take (e.g. sizes)
            cache = model.init_cache(1, 16)
            with torch.no_grad(), matvec.native_decoding(model):
                model(prompts(model), cache)
                step, why = compile_step(model, cache, 1)
            if step is None:
                classes = {type(m).__name__ for m in model.modules()} | {type(p).__name__ for p in model.positions}
                assert any(c in why for c in classes), (kind, name, why)
                refused += 1
                continue
            eager, planned = decode_both(model, prompts(model), steps=4)
            assert (planned - eager).abs().max().item() <= 1e-5 * eager.abs().max().item(), (kind, name)
            checked += 1
    assert checked >= 10


@torch.no_grad()
def test_a_subclass_that_changes_forward_is_refused() -> None:
    model = tiny_model(*MODELS["llama"])
    norm = model.blocks[0].ln_1

    class Shifted(type(norm)):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) + 1

    norm.__class__ = Shifted
    cache = model.init_cache(1, 8)
    step, why = compile_step(model, cache, 1)
    assert step is None and why == "Shifted overrides forward of RMSNorm, whose lowering would not describe it"


class OwnRotation:
    """A plugin's rotation that describes its own tables, wrapping the built-in one's arithmetic."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def apply(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.apply(q, k)

    def decode_tables(self) -> tuple[torch.Tensor, torch.Tensor, bool]:
        return self.inner.cos.reshape(-1), self.inner.sin.reshape(-1), self.inner.in_float32


def test_a_rotation_is_read_by_the_decoder_s_tables_or_by_its_own_decode_tables() -> None:
    model = tiny_model(*MODELS["llama"])
    rope = model.position

    class OwnRoPE(type(rope)):
        def rotary(self, positions: torch.Tensor) -> OwnRotation:
            return OwnRotation(super().rotary(positions))

    for cls in (type(rope), OwnRoPE):
        rope.__class__ = cls
        eager, planned = decode_both(model, prompts(model), steps=4)
        assert (planned - eager).abs().max() < 1e-5, cls


@torch.no_grad()
def test_a_rotation_that_changes_apply_is_refused() -> None:
    model = tiny_model(*MODELS["llama"])
    rope = model.position
    turned = type(rope.rotary(torch.zeros(1, 1, dtype=torch.long)))

    class Flipped(turned):
        def apply(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return super().apply(-q, k)

    class FlippedRoPE(type(rope)):
        def rotary(self, positions: torch.Tensor) -> Flipped:
            rotation = super().rotary(positions)
            rotation.__class__ = Flipped
            return rotation

    rope.__class__ = FlippedRoPE
    step, why = compile_step(model, model.init_cache(1, 8), 1)
    assert step is None and why == (
        "Flipped (from FlippedRoPE) has no rotary tables (a plugin registers them with register_rotary_tables)"
    )


@torch.no_grad()
def test_hooks_dtypes_and_biases_are_refused() -> None:
    model = tiny_model(*MODELS["llama"])
    handle = model.blocks[1].mlp.register_forward_hook(lambda *_: None)
    assert compile_step(model, model.init_cache(1, 8), 1) == (
        None,
        "GatedMLP has forward hooks or a forward of its own",
    )
    handle.remove()
    with torch.enable_grad():
        assert (
            compile_step(model, model.init_cache(1, 8), 1)[1]
            == "gradients or autocast wanted (the plan computes neither)"
        )
    model.double()
    assert compile_step(model, model.init_cache(1, 8), 1) == (
        None,
        "activations in torch.float64 (the plan takes float32 and bfloat16)",
    )
    alibi = tiny_model("gpt2-tiny", "model.position=alibi")
    assert compile_step(alibi, alibi.init_cache(1, 8), 1) == (
        None,
        "ALiBi biases attention (the plan has no attention bias)",
    )
    # split: every attention runs its eager forward, whose context holds the bias; the rest is native
    step, why = compile_step(alibi, alibi.init_cache(1, 8), 1, split=True)
    assert why is None and [(type(part.module).__name__, part.reason) for part in step.eager] == [
        ("CausalSelfAttention", "ALiBi biases attention (the plan has no attention bias)")
    ] * len(alibi.blocks)


def test_an_attention_and_a_block_the_plan_cannot_describe_run_their_eager_forward_within_a_split_step() -> None:
    """An attention with a forward hook, a block whose class overrides forward: each runs its forward
    with the step's AttentionContext (the model's own, padding masked) and its layer's cache."""
    model = tiny_model(*MODELS["llama"], "model.n_layer=3")
    calls = []
    model.blocks[0].attn.register_forward_hook(lambda *_: calls.append(1))

    class Logged(type(model.blocks[1])):
        def forward(self, x, ctx, cache=None):
            calls.append(2)
            return super().forward(x, ctx, cache)

    model.blocks[1].__class__ = Logged
    batch = prompts(model, batch=3, length=6)
    mask = torch.ones_like(batch)
    mask[0, :4], mask[2, :1] = 0, 0
    reasons = [
        "CausalSelfAttention has forward hooks or a forward of its own",
        "Logged overrides forward of PreNormBlock, whose lowering would not describe it",
    ]
    eager, planned = decode_both(model, batch, steps=8, mask=mask, eager_parts=reasons)
    assert_close(planned, eager)
    assert calls == [1, 2] * (2 + 2 * 8)  # two prefills, then each step eagerly and planned


@pytest.mark.parametrize("recipe", ["llama-tiny", "gpt-oss-tiny"])
def test_attention_sinks_decode_through_the_plan(recipe: str) -> None:
    """A sink logit per head (a window of 3 keys and full attention, left-padded rows) in the plan's
    softmax: the strict plan gives the eager logits in float32, and in bfloat16 exactly (the sinks make
    the attention explicit: the same roundings as torch's operations); gpt-oss-tiny with its clamped
    quick_gelu experts too."""
    model = tiny_model(
        recipe,
        "model.layer_pattern=['sliding', 'full']",
        "model.layer_types.sliding.attention={name='sliding_window', window=3, sinks=true}",
        "model.layer_types.full.attention={name='causal', sinks=true}",
    )
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sinks.normal_(std=2.0)
    batch = prompts(model, batch=2, length=6)
    mask = torch.ones_like(batch)
    mask[0, :2] = 0
    eager, planned = decode_both(model, batch, steps=8, mask=mask)
    assert_close(planned, eager)
    eager16, planned16 = decode_both(model.to(torch.bfloat16), batch, steps=8, mask=mask)
    assert torch.equal(planned16, eager16)
    with torch.no_grad():
        model.float()
        for block in model.blocks:
            block.attn.sinks.zero_()  # a sink logit of 0 still takes its share: the sinks change the logits
        assert (model(batch, attention_mask=mask)[:, -1] - eager[0]).abs().max().item() > 1e-3


@pytest.mark.parametrize("attention", ["causal", "eager"])
def test_a_gated_attention_output_decodes_through_the_plan(attention: str) -> None:
    """Qwen3-Next and Qwen3.5's output gate, each head's output times sigmoid(gate(x)) feature by feature, in
    the strict plan (left-padded rows): the eager logits in float32, and in bfloat16 the same roundings as
    torch's operations where the attention is explicit; the gate changes the logits."""
    model = tiny_model("llama-tiny", f"model.attention={{name='{attention}', qk_norm='head', output_gate=true}}")
    batch = prompts(model, batch=2, length=6)
    mask = torch.ones_like(batch)
    mask[0, :2] = 0
    eager, planned = decode_both(model, batch, steps=8, mask=mask)
    assert_close(planned, eager)
    eager16, planned16 = decode_both(model.to(torch.bfloat16), batch, steps=8, mask=mask)
    if attention == "eager":
        assert torch.equal(planned16, eager16)
    else:
        assert (planned16.float() - eager16.float()).abs().max().item() <= 0.02 * eager16.float().abs().max().item()
    with torch.no_grad():
        model.float()
        for block in model.blocks:  # a gate of 0 halves every head's output: the gate changes the logits
            block.attn.c_attn.weight[:128].view(4, 2, 16, 64)[:, 1] = 0.0  # (nh, query and gate, hs, n_embd)
        assert (model(batch, attention_mask=mask)[:, -1] - eager[0]).abs().max().item() > 1e-3


def moe_model(params: dict[str, object]) -> gptzoo.GPT:
    """llama-tiny whose mlp is the moe mlp with ``params``, its routing made decisive (router weights
    and score bias drawn wide, so no two experts tie) and its experts' activations large enough to
    reach a clamp."""
    table = ", ".join(f"{key}={json.dumps(value)}" for key, value in {"name": "moe", **params}.items())
    model = tiny_model("llama-tiny", f"model.mlp={{{table}}}".replace("True", "true").replace("False", "false"))
    with torch.no_grad():
        for block in model.blocks:
            block.mlp.router.weight.normal_(std=1.0)
            if block.mlp.router.score_bias is not None:
                block.mlp.router.score_bias.normal_(std=0.5)
            for expert in block.mlp.experts:
                expert.c_fc.weight.mul_(8.0)
    return model


MOE_CASES = {
    "mixtral": {"experts": 5, "top_k": 2},
    "dense experts, top-1": {"experts": 3, "top_k": 1, "gated": False},
    "qwen2-moe": {"experts": 5, "top_k": 2, "normalize": False, "shared_ff": 12, "shared_gate": True, "expert_ff": 8},
    "deepseek-v2": {"experts": 6, "top_k": 2, "groups": 3, "group_top_k": 2, "normalize": False, "routed_scale": 2.5},
    "deepseek-v3": {
        "experts": 8,
        "top_k": 3,
        "scoring": "sigmoid",
        "groups": 4,
        "group_top_k": 2,
        "group_score": "top2",
        "score_bias": True,
        "shared_ff": 16,
    },
    "gpt-oss": {
        "experts": 5,
        "top_k": 3,
        "scoring": "topk_softmax",
        "normalize": False,
        "router_bias": True,
        "expert_bias": True,
        "glu_limit": 0.5,
    },
}
"""The families' routing rules and experts at test size."""


@pytest.mark.parametrize("case", MOE_CASES)
def test_a_mixture_of_experts_decodes_through_the_plan(case: str) -> None:
    """The router's choice, the chosen experts and the shared one, in the strict plan: the eager logits
    in float32 for left-padded rows, and in bfloat16 the same tokens, with logits as close to the float32
    ones as the eager bfloat16 forward's are. (The two bfloat16 sides round their sums in different orders,
    so each is some bfloat16 steps from float32, and they can be on either side of it: on an AMD EPYC
    without native bfloat16, qwen2-moe's two were 0.0146 apart, 0.0089 and 0.0110 from float32.)"""
    model = moe_model(MOE_CASES[case])
    batch = prompts(model, batch=2, length=6)
    mask = torch.ones_like(batch)
    mask[0, :2] = 0
    eager, planned = decode_both(model, batch, steps=10, mask=mask)
    assert_close(planned, eager)
    eager16, planned16 = decode_both(model.to(torch.bfloat16), batch, steps=10, mask=mask)
    assert torch.equal(planned16.argmax(-1), eager16.argmax(-1))
    step = 2.0**-7 * eager.abs().max().item()  # one bfloat16 step at the largest logit
    eager_error = (eager16.float() - eager).abs().max().item()
    assert (planned16.float() - eager).abs().max().item() <= 1.5 * eager_error + step


def test_a_mixture_reads_only_the_experts_its_router_chose() -> None:
    """An expert no token is routed to (its router logit far below the others) is never run: with NaN
    weights it leaves the plan's logits finite and equal to the eager forward's, which skips it too."""
    model = moe_model({"experts": 4, "top_k": 2, "router_bias": True})
    with torch.no_grad():
        for block in model.blocks:
            block.mlp.router.bias.zero_()[0] = -1e4
            for p in block.mlp.experts[0].parameters():
                p.fill_(float("nan"))
    eager, planned = decode_both(model, prompts(model, batch=2), steps=6)
    assert torch.isfinite(planned).all()
    assert_close(planned, eager)


def test_a_plugin_attention_without_a_lowering_runs_its_eager_forward_with_its_own_cache(fake_site: FakeSite) -> None:
    """A ring-buffer window attention (a cache of its own class) on the split path, padded rows included."""
    fake_site.add("ring_window", "gz_ring", RING_WINDOW)
    registry = gptzoo.get_registry()
    torch.manual_seed(0)
    recipe = gptzoo.load_recipe("llama-tiny", ["model.attention={name='ring_window', window=3}"], registry=registry)
    model = gptzoo.build_model(recipe, registry=registry).eval()
    batch = prompts(model, batch=2, length=6)
    mask = torch.ones_like(batch)
    mask[0, :2] = 0
    reasons = ["gz_ring.RingWindowAttention has no decode lowering"] * len(model.blocks)
    eager, planned = decode_both(model, batch, steps=8, mask=mask, eager_parts=reasons)
    assert_close(planned, eager)


def prefilled_step(model: gptzoo.GPT, max_len: int):
    """The compiled step of one row over a cache of ``max_len`` positions, the prompt already in it."""
    cache = model.init_cache(1, max_len)
    model(prompts(model), cache)
    step, why = compile_step(model, cache, 1)
    assert step is not None, why
    return step


@torch.no_grad()
def test_a_step_past_the_cache_is_the_eager_forward_s_error() -> None:
    model = tiny_model(*MODELS["llama"])
    step = prefilled_step(model, 6)
    step(torch.tensor([[3]]))
    with pytest.raises(GptzooError, match="the KV cache holds 6 positions, 7 were asked for"):
        step(torch.tensor([[3]]))


@torch.no_grad()
def test_a_token_outside_the_vocabulary_is_an_error() -> None:
    model = tiny_model(*MODELS["llama"])
    step = prefilled_step(model, 8)
    with pytest.raises(GptzooError, match=r"failed at its operation 0: a token id outside the embedding table"):
        step(torch.tensor([[model.wte.weight.shape[0]]]))


def test_generate_decodes_through_the_plan_and_gives_the_eager_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    assert_generates_through_the_plan(tiny_model(*MODELS["gemma"]), 20, monkeypatch)


def assert_generates_through_the_plan(model: gptzoo.GPT, steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """generate compiles the native step once for a batch of two, and its tokens are the eager path's."""
    batch = prompts(model, batch=2).tolist()
    compiled = []

    def spy(*args, **kwargs):
        step = compile_step(*args, **kwargs)
        compiled.append(step[0] is not None and not step[0].eager)
        return step

    monkeypatch.setattr(engine_module, "compile_step", spy)
    planned = generate(model, batch, steps)
    monkeypatch.setattr(engine_module, "compile_step", lambda *args, **kwargs: (None, "off"))
    assert compiled == [True]
    assert planned == generate(model, batch, steps)


def assert_close(planned: torch.Tensor, eager: torch.Tensor) -> None:
    """The plan's logits are the eager forward's up to the order of the sums, and pick the same tokens."""
    assert (planned - eager).abs().max().item() <= 1e-5 * eager.abs().max().item()
    assert torch.equal(planned.argmax(-1), eager.argmax(-1))


def plugin_model(site: FakeSite, source: str, *overrides: str, module: str = "gz_unitnorm") -> gptzoo.GPT:
    """llama-tiny with a fake plugin installed (its norm ``unitnorm`` if it has one), built from a
    registry that holds it."""
    site.add("unitnorm", module, source)
    registry = gptzoo.get_registry()
    assert registry.failed == [], registry.failed
    torch.manual_seed(0)
    recipe = gptzoo.load_recipe("llama-tiny", list(overrides), registry=registry)
    return gptzoo.build_model(recipe, registry=registry).eval()


@pytest.mark.parametrize("by_reference", [None, "gz_unitnorm"])
def test_a_plugin_component_decodes_natively_through_the_lowering_it_registers(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch, by_reference: str | None
) -> None:
    model = plugin_model(fake_site, unitnorm(by_reference=by_reference), "model.norm=unitnorm")
    assert type(model.ln_f).__module__ == "gz_unitnorm"
    (entry,) = model.registry.rows["register_decode_lowerings"]
    assert entry.key == "gz_unitnorm:UnitNorm" and entry.provenance.distribution == "gptzoo-fake-unitnorm"
    with warnings.catch_warnings():
        warnings.simplefilter("error", GptzooWarning)
        eager, planned = decode_both(model, prompts(model), steps=8)  # asserts that compile_step gave a step
    assert_close(planned, eager)
    assert_generates_through_the_plan(model, 12, monkeypatch)


UNITNORM_WITHOUT_LOWERING = (
    UNITNORM_CLASS + '\n\n@gptzoo.hookimpl\ndef register_norms(register):\n    register("unitnorm", UnitNorm)\n'
)
"""A plugin's norm that registers no lowering."""
NO_LOWERING = "gz_unitnorm.UnitNorm has no decode lowering"


@torch.no_grad()
def test_a_plugin_component_without_a_lowering_is_refused_by_a_plan_that_does_not_split(fake_site: FakeSite) -> None:
    model = plugin_model(fake_site, UNITNORM_WITHOUT_LOWERING, "model.norm=unitnorm")
    cache = model.init_cache(1, 8)
    model(prompts(model), cache)
    assert compile_step(model, cache, 1) == (None, NO_LOWERING)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_plugin_component_without_a_lowering_runs_its_eager_forward_within_a_split_step(
    fake_site: FakeSite, dtype: str
) -> None:
    """Each of its norms (two per block, the final one) runs its forward between native calls, and
    the step computes what the eager forward computes, padded rows included."""
    model = plugin_model(fake_site, UNITNORM_WITHOUT_LOWERING, "model.norm=unitnorm").to(getattr(torch, dtype))
    norms = [NO_LOWERING] * (2 * len(model.blocks) + 1)
    batch = prompts(model, batch=2, length=6)
    mask = torch.ones_like(batch)
    mask[1, :3] = 0
    eager, planned = decode_both(model, batch, steps=8, mask=mask, eager_parts=norms)
    if dtype == "float32":
        assert_close(planned, eager)
    else:  # the native steps between the eager norms round as in test_step_rounds_as_the_eager_forward_in_bfloat16
        assert (planned.float() - eager.float()).abs().max().item() <= 0.02 * eager.float().abs().max().item()
        assert torch.equal(planned.argmax(-1), eager.argmax(-1))


SPLIT_MESSAGE = (
    'decoding natively around the torch forward of gz_unitnorm.UnitNorm (norm "unitnorm" of gptzoo-fake-unitnorm 1.0, '
    "5 modules): gz_unitnorm.UnitNorm has no decode lowering; to decode it natively too, register a lowering with "
    'register_decode_lowerings (docs/plugins.md, "Fast CPU decoding")'
)


def test_generate_decodes_a_component_without_a_lowering_on_the_split_path_and_says_so(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The eager forward's tokens; the path, the component (its registered name, its distribution),
    the reason and the fix, as a person and as --json read them."""
    model = plugin_model(fake_site, UNITNORM_WITHOUT_LOWERING, "model.norm=unitnorm")
    batch = prompts(model, batch=2).tolist()
    paths: list[DecodePath] = []
    split = generate(model, batch, 12, on_decode_path=paths.append)
    component = EagerComponent("gz_unitnorm.UnitNorm", "norm", "unitnorm", "gptzoo-fake-unitnorm 1.0", 5, NO_LOWERING)
    assert paths == [DecodePath(SPLIT, missing=(component,))]
    assert paths[0].message == SPLIT_MESSAGE
    assert paths[0].as_json() == {
        "path": "native+eager",
        "reason": None,
        "missing": [
            {
                "component": "gz_unitnorm.UnitNorm",
                "kind": "norm",
                "name": "unitnorm",
                "origin": "gptzoo-fake-unitnorm 1.0",
                "modules": 5,
                "reason": NO_LOWERING,
            }
        ],
        "fix": 'register a lowering with register_decode_lowerings (docs/plugins.md, "Fast CPU decoding")',
    }
    monkeypatch.setattr(engine_module, "compile_step", lambda *args, **kwargs: (None, "off"))
    assert split == generate(model, batch, 12, on_decode_path=paths.append)
    assert paths[1] == DecodePath("eager", "off")
    assert paths[1].message == "decoding with the model's eager forward, not the native CPU step: off"


def test_the_decode_path_of_a_native_model_of_one_the_plan_refuses_and_of_a_generation_plan() -> None:
    paths: list[DecodePath] = []
    llama = tiny_model(*MODELS["llama"])
    generate(llama, [[1, 2, 3]], 3, on_decode_path=paths.append)
    alibi = tiny_model("gpt2-tiny", "model.position=alibi")
    generate(alibi, [[1, 2, 3]], 3, on_decode_path=paths.append)
    generate(llama, [[1, 2]] * 33, 2, on_decode_path=paths.append)
    assert paths == [
        DecodePath("native"),
        DecodePath("native+eager", missing=paths[1].missing),
        DecodePath("eager", "a batch of 33 rows (the native step takes 1 to 32)"),
    ]
    assert [(m.name, m.modules, m.reason) for m in paths[1].missing] == [
        ("causal", 2, "ALiBi biases attention (the plan has no attention bias)")
    ]
    assert paths[0].message is None
    assert paths[0].as_json() == {"path": "native", "reason": None, "missing": [], "fix": None}
    gpt2 = tiny_model("gpt2-tiny")
    plan = plan_generation(gpt2, load_tokenizer("gpt2"), ["Hello"], registry=gptzoo.get_registry(), max_new_tokens=4)
    plan.run(on_decode_path=paths.append)
    assert paths[-1] == DecodePath("native")


LEGACY_WARNING = (
    "gz_unitnorm.UnitNorm describes its decoding step with a decode_ops method, the old form of gptzoo's native CPU "
    "decoding; register its lowering instead, from the plugin's register_decode_lowerings(register) hook: "
    "register(UnitNorm, lower), where lower(plan, module, src, dst, ...) does what decode_ops(plan, src, dst, ...) "
    'does (docs/plugins.md, "Fast CPU decoding")'
)


def test_a_component_with_the_old_decode_ops_still_decodes_natively_and_warns_once(fake_site: FakeSite) -> None:
    model = plugin_model(fake_site, UNITNORM_DECODE_OPS, "model.norm=unitnorm")
    with pytest.warns(GptzooWarning) as record:
        eager, planned = decode_both(model, prompts(model), steps=6)
        decode_both(model, prompts(model), steps=2)  # five norms of the class, two plans: one warning
    assert [str(w.message) for w in record] == [LEGACY_WARNING]
    assert_close(planned, eager)


LOWERS_RMSNORM = """
def lower(plan, norm, src, dst):
    plan.rmsnorm(src, dst, norm.weight, norm.eps, "plain")


@gptzoo.hookimpl
def register_decode_lowerings(register):
    register("gptzoo_plugins._norms:RMSNorm", lower, override={override})
"""
"""A plugin lowering the built-in RMSNorm (exactly as gptzoo does)."""


def test_two_plugins_lowering_one_class_is_an_error_naming_both_unless_the_later_overrides(
    fake_site: FakeSite,
) -> None:
    fake_site.add("lower_a", "gz_lower_a", LOWERS_RMSNORM.format(override=True))
    fake_site.add("lower_b", "gz_lower_b", LOWERS_RMSNORM.format(override=False))
    registry = gptzoo.get_registry()
    assert registry.failed == []
    (refused,) = [p.refused for p in registry.plugins if p.distribution == "gptzoo-fake-lower_b"]
    assert refused == (
        "its register_decode_lowerings was refused (the lowering of gptzoo_plugins._norms:RMSNorm is registered by "
        "both gz_lower_a (gptzoo-fake-lower_a 1.0) and gz_lower_b (gptzoo-fake-lower_b 1.0); register the later one "
        "with override=True)",
    )
    (entry,) = registry.rows["register_decode_lowerings"]
    assert entry.key == "gptzoo_plugins._norms:RMSNorm" and entry.provenance.plugin == "gz_lower_a"
    fake_site.add("lower_c", "gz_lower_c", LOWERS_RMSNORM.format(override=True))
    (entry,) = gptzoo.get_registry().rows["register_decode_lowerings"]
    assert entry.provenance.plugin == "gz_lower_c" and entry.overrides.plugin == "gz_lower_a"


@pytest.mark.parametrize("override", [False, True])
def test_a_plugin_replaces_a_built_in_lowering_only_with_override(fake_site: FakeSite, override: bool) -> None:
    model = plugin_model(fake_site, LOWERS_RMSNORM.format(override=override), module="gz_lower_rms")
    if override:
        eager, planned = decode_both(model, prompts(model), steps=4)
        assert_close(planned, eager)
        return
    cache = model.init_cache(1, 8)
    with torch.no_grad():
        model(prompts(model), cache)
        assert compile_step(model, cache, 1) == (
            None,
            "gptzoo_plugins._norms:RMSNorm has a lowering of gptzoo's and one registered by gz_lower_rms "
            "(gptzoo-fake-unitnorm 1.0); register that one with override=True to replace gptzoo's",
        )


def test_components_hold_no_lowering_nor_layout_and_import_nothing_of_inference_or_hf() -> None:
    components = Path(gptzoo_plugins.__file__).parent
    for path in components.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"decode_ops|hf_weights|hf_config|decode_tables", text), path
    imports = re.compile(r"^\s*(from|import) gptzoo\.(inference|hf)", re.M)
    for path in [*components.glob("*.py"), *(Path(gptzoo.__file__).parent / "model").glob("*.py")]:
        assert not imports.search(path.read_text(encoding="utf-8")), path


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (
            "register(42, lambda *a: None)",
            "registered a lowering for 42, which is neither a class nor a reference 'module:Class'; pass the "
            "component's class",
        ),
        ('register("gz_bad:Thing", 3)', "registered the lowering of gz_bad:Thing with a lowering that is not callable"),
        ('register("gz_bad:Thing", "not a reference")', "with a reference that is not 'module:attribute'"),
        ('register("gz_bad:Thing", "gz_bad:lower", depends=("not a name",))', "with depends that are not method"),
    ],
)
def test_a_malformed_lowering_registration_is_refused(fake_site: FakeSite, call: str, problem: str) -> None:
    fake_site.add("bad", "gz_bad", f"@gptzoo.hookimpl\ndef register_decode_lowerings(register):\n    {call}\n")
    registry = gptzoo.get_registry()
    assert registry.failed == []
    ((refused,),) = [p.refused for p in registry.plugins if p.distribution == "gptzoo-fake-bad"]
    assert refused.startswith("its register_decode_lowerings was refused (") and problem in refused
    assert registry.rows["register_decode_lowerings"] == []


@torch.no_grad()
def test_a_lowering_registered_by_a_reference_that_cannot_be_imported_is_refused(fake_site: FakeSite) -> None:
    source = unitnorm(by_reference="gz_unitnorm").replace('"gz_unitnorm:lower"', '"gz_unitnorm:missing"')
    model = plugin_model(fake_site, source, "model.norm=unitnorm")
    cache = model.init_cache(1, 8)
    model(prompts(model), cache)
    step, why = compile_step(model, cache, 1)
    assert step is None
    assert why.startswith(
        "the lowering of gz_unitnorm:UnitNorm registered by gz_unitnorm (gptzoo-fake-unitnorm 1.0) as "
        "'gz_unitnorm:missing' cannot be imported: AttributeError"
    ), why


SUBCLASS_CALLING_SUPER = """
from gptzoo_plugins._norms import RMSNorm


class UnitNorm(RMSNorm):
    \"\"\"The built-in RMSNorm, lowered as the previous contract let a subclass do it.\"\"\"

    def decode_ops(self, plan, src, dst):
        super().decode_ops(plan, src, dst)


@gptzoo.hookimpl
def register_norms(register):
    register("unitnorm", UnitNorm)
"""


@torch.no_grad()
def test_an_old_decode_ops_calling_its_built_in_parents_is_refused_with_the_reason(fake_site: FakeSite) -> None:
    model = plugin_model(fake_site, "import gptzoo\n" + SUBCLASS_CALLING_SUPER, "model.norm=unitnorm")
    cache = model.init_cache(1, 8)
    model(prompts(model), cache)
    with pytest.warns(GptzooWarning):
        assert compile_step(model, cache, 1) == (
            None,
            "UnitNorm.decode_ops calls super().decode_ops, which gptzoo's classes no longer have (they are lowered "
            'through register_decode_lowerings); register the lowering of UnitNorm instead (docs/plugins.md, "Fast '
            'CPU decoding")',
        )


def test_gptzoo_generate_names_the_path_and_the_component_without_a_lowering(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.add("unitnorm", "gz_unitnorm", UNITNORM_WITHOUT_LOWERING)
    argv = ["generate", "llama-tiny", "--set", "tokenizer.name=bytes", "--prompt", "hi", "--max-new-tokens", "3"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decode"] == {
        "path": "native",
        "reason": None,
        "missing": [],
        "fix": None,
    }
    assert main([*argv, "--set", "model.norm=unitnorm", "--json"]) == 0
    decode = json.loads(capsys.readouterr().out)["decode"]
    assert (decode["path"], [(m["name"], m["origin"]) for m in decode["missing"]]) == (
        "native+eager",
        [("unitnorm", "gptzoo-fake-unitnorm 1.0")],
    )
    assert main([*argv, "--set", "model.norm=unitnorm"]) == 0
    assert f"note: {SPLIT_MESSAGE}" in " ".join(capsys.readouterr().err.split())


RESIDUAL_MLP = '''
from torch import nn

import gptzoo

gptzoo_contract = 7


class ResidualMLP(nn.Module):
    """c_proj(act(c_fc(x))) + skip(x){extra_doc}"""

    def __init__(self, d_model, d_ff, *, activation, bias):
        super().__init__()
        self.c_fc = nn.Linear(d_model, d_ff, bias=bias)
        self.act = activation
        self.c_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.skip = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        return {body}

    def flops(self, batch, seq_len):
        return {{"mlp": 2 * batch * seq_len * (self.c_fc.weight.numel() * 2 + self.skip.weight.numel())}}


@gptzoo.hookimpl
def register_mlps(register):
    register("residual", ResidualMLP)


@gptzoo.hookimpl
def register_decode_lowerings(register):
    register(ResidualMLP, "gptzoo.inference.lowerings:lower_traced")
'''
"""A plugin's compound mlp that registers gptzoo's traced lowering for itself, by reference."""


def test_the_built_in_mlps_and_experts_have_no_lowering_of_their_own() -> None:
    from gptzoo.inference.lowerings import BUILTIN_LOWERINGS, lower_traced

    rows = {row.key: row.value for row in BUILTIN_LOWERINGS}
    for key in ("gptzoo_plugins._mlps:DenseMLP", "gptzoo_plugins._mlps:GatedMLP", "gptzoo_plugins._moe:Expert"):
        assert rows[key] is lower_traced, key


def test_a_plugin_compound_decodes_natively_through_the_traced_lowering(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = RESIDUAL_MLP.format(extra_doc="", body="self.c_proj(self.act(self.c_fc(x))) + self.skip(x)")
    model = plugin_model(fake_site, source, "model.mlp=residual", "model.activation=gelu", module="gz_residual")
    with warnings.catch_warnings():
        warnings.simplefilter("error", GptzooWarning)
        eager, planned = decode_both(model, prompts(model, batch=2), steps=6)  # one native call: no eager part
    assert_close(planned, eager)
    assert_generates_through_the_plan(model, 8, monkeypatch)


@torch.no_grad()
def test_a_traced_compound_that_computes_what_the_plan_cannot_is_refused_naming_it(fake_site: FakeSite) -> None:
    source = RESIDUAL_MLP.format(
        extra_doc=", gated by sigmoid", body="self.c_proj(self.act(self.c_fc(x))) * x.sigmoid()"
    )
    model = plugin_model(fake_site, source, "model.mlp=residual", module="gz_sigmoid")
    cache = model.init_cache(1, 8)
    model(prompts(model), cache)
    step, why = compile_step(model, cache, 1)
    assert step is None and why == (
        "ResidualMLP's forward computes %sigmoid : [num_users=1] = call_method[target=sigmoid](args = (%x,), kwargs "
        "= {}); a traced lowering takes calls of its parts, chunks, part(first half) * second half, clamps and sums"
    )
    eager, planned = decode_both(model, prompts(model), steps=3, eager_parts=[why] * len(model.blocks))  # split: eager
    assert_close(planned, eager)
