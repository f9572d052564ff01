"""Contract tests generated from the registry: every registered component, built-in or third-party,
builds at a tiny size with its defaults, runs forward on CPU, preserves shape and dtype, produces no
NaN, and (if it has state) round-trips its state dict through safetensors."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

import gptzoo
from gptzoo.hf import FAMILIES
from gptzoo.interfaces import AttentionContext, Position, Sampler
from gptzoo.registry import Entry

D, N_HEAD, N_KV_HEAD, HEAD_DIM, D_FF, CONTEXT, VOCAB = 16, 4, 2, 4, 32, 32, 50
B, T = 2, 7


def _entries() -> list[Entry]:
    return list(gptzoo.get_registry().entries())


def _id(entry: Entry) -> str:
    return f"{entry.kind}:{entry.name}"


def _make(entry: Entry) -> tuple[Callable[[], object], Callable[[object, torch.dtype], Tensor], Callable[[], Tensor]]:
    """(build, run, make_input) for one entry: run(component, dtype) -> output for the given input."""
    x3 = lambda: torch.randn(B, T, D)
    if entry.kind == "norm":
        return (lambda: entry.factory(D), lambda m, x: m(x), x3)
    if entry.kind == "activation":
        return (lambda: entry.factory(), lambda m, x: m(x), x3)
    if entry.kind == "mlp":
        return (lambda: entry.factory(D, D_FF, activation=nn.GELU(), bias=True), lambda m, x: m(x), x3)
    if entry.kind == "attention":
        ctx = AttentionContext(0, None, None, is_causal=True)
        build = lambda: entry.factory(D, N_HEAD, n_kv_head=N_KV_HEAD, head_dim=HEAD_DIM, bias=True)
        return (build, lambda m, x: m(x, ctx), x3)
    if entry.kind == "position":
        # A position encoding is exercised inside a tiny model (embedding, rotary or bias path).
        def build() -> nn.Module:
            recipe = gptzoo.load_recipe(
                "gpt2-tiny",
                [
                    f"model.position={entry.name}",
                    f"model.vocab_size={VOCAB}",
                    f"model.context_length={CONTEXT}",
                    f"model.n_embd={D}",
                    f"model.n_head={N_HEAD}",
                    f"model.d_ff={D_FF}",
                ],
            )
            return gptzoo.build_model(recipe)

        return (build, lambda m, x: m(x), lambda: torch.randint(0, VOCAB, (B, T)))
    if entry.kind == "sampler":
        return (
            lambda: entry.factory(),
            lambda s, x: s(x, torch.randint(0, VOCAB, (B, 3))),
            lambda: torch.randn(B, VOCAB),
        )
    raise AssertionError(f"no contract harness for kind {entry.kind!r}")


@pytest.mark.parametrize("entry", _entries(), ids=_id)
def test_component_contract(entry: Entry, tmp_path: Path) -> None:
    build, run, make_input = _make(entry)
    component = build()
    x = make_input()
    if isinstance(component, nn.Module):
        component.eval()
    with torch.no_grad():
        y = run(component, x)
    expected_shape = (B, T, VOCAB) if entry.kind == "position" else tuple(x.shape)
    assert tuple(y.shape) == expected_shape
    assert y.dtype == torch.float32
    assert not torch.isnan(y).any(), f"{_id(entry)} produced NaN"
    if entry.kind == "sampler":
        assert isinstance(component, Sampler)
        assert torch.isfinite(y).any(dim=-1).all(), "a sampler must leave at least one token possible"
        if component.picks:
            assert component.pick(y).shape == (B,)
        return
    if entry.kind == "position":
        assert isinstance(component.position, Position)
    _check_hf_weights(component.position if entry.kind == "position" else component)

    # bfloat16 in (or a bfloat16 model), bfloat16 out
    with torch.no_grad():
        y16 = run(copy.deepcopy(component).to(torch.bfloat16), x.to(torch.bfloat16) if x.is_floating_point() else x)
    assert y16.dtype == torch.bfloat16 and tuple(y16.shape) == tuple(y.shape)
    assert not torch.isnan(y16).any()

    if entry.kind == "attention":
        _check_attention_interfaces(component, x, y)

    # state dict -> safetensors -> a freshly built (differently initialized) component
    state = {k: v.contiguous() for k, v in component.state_dict().items()}
    if entry.kind == "position":
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}  # tied to wte
    if not state:
        return
    save_file(state, str(tmp_path / "c.safetensors"))
    torch.manual_seed(1)
    fresh = build()
    for p in fresh.parameters():  # make sure the load really changes something
        p.data.add_(1.0)
    missing, unexpected = fresh.load_state_dict(load_file(str(tmp_path / "c.safetensors")), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(run(fresh, x), y)


def _check_attention_interfaces(attn: nn.Module, x: Tensor, full: Tensor) -> None:
    """The KV-cache and FLOPs parts of the attention contract."""
    cache = attn.init_cache(B, T + 1, device=x.device, dtype=x.dtype)
    with torch.no_grad():
        prefill = attn(x[:, :5], AttentionContext(0, None, None, is_causal=True), cache)
        decoded = [attn(x[:, t : t + 1], AttentionContext(t, None, None, is_causal=False), cache) for t in range(5, T)]
    torch.testing.assert_close(torch.cat([prefill, *decoded], dim=1), full, rtol=0, atol=1e-5)
    assert cache.nbytes > 0 and cache.max_len == T + 1
    flops = attn.flops(B, T)
    assert flops and all(isinstance(v, int) and v > 0 for v in flops.values())


def _check_hf_weights(module: nn.Module) -> None:
    """A component's Hugging Face maps, where it has them, cover its state dict exactly."""
    hf_weights = getattr(module, "hf_weights", None)
    if hf_weights is None:
        return
    state = module.state_dict()
    for family in FAMILIES.values():
        maps = hf_weights(family.name)
        if maps is None:
            continue
        assert sorted(m.ours for m in maps) == sorted(state), family.name
        for m in maps:  # export then import gives the tensor back
            assert torch.equal(m.load(m.save(state[m.ours])), state[m.ours])
