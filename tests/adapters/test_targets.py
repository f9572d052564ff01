"""What a model offers adapters: the built-ins' projections split into q/k/v and gate/up, a plugin's own
projections by their attribute names with no adapter code, and a plugin's fused projection split by the
register_adapter_parts hook (contract 6); the names --targets takes and the errors it gives."""

from __future__ import annotations

import pytest
import torch
from fakedist import FakeSite
from tiny import tiny_model

import gptzoo
from gptzoo.adapters.lora import LoRALinear, LoRASpec, attach, merge
from gptzoo.adapters.targets import model_parts, offered, select
from gptzoo.errors import GptzooError, PluginError

PLUGIN = """
import gptzoo
from torch import nn

gptzoo_contract = 6


class TwinMLP(nn.Module):
    \"\"\"w_out(act(left) + right), with [left; right] = w_in(x).\"\"\"

    def __init__(self, d_model, d_ff, *, activation, bias):
        super().__init__()
        self.w_in = nn.Linear(d_model, 2 * d_ff, bias=bias)
        self.act = activation
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x):
        left, right = self.w_in(x).chunk(2, dim=-1)
        return self.w_out(self.act(left) + right)

    def flops(self, batch, seq_len):
        weights = self.w_in.weight.numel() + self.w_out.weight.numel()
        return {"mlp": 2 * batch * seq_len * weights}


class SplitMLP(TwinMLP):
    \"\"\"The same MLP, its fused projection's halves named through the hook.\"\"\"


@gptzoo.hookimpl
def register_mlps(register):
    register("twin", TwinMLP)
    register("split_twin", SplitMLP)


@gptzoo.hookimpl
def register_adapter_parts(register):
    register(SplitMLP, {"w_in": lambda mlp: [("left", mlp.w_out.in_features), ("right", -1)]})
"""


@pytest.fixture
def registry(fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> gptzoo.Registry:
    monkeypatch.delenv("GPTZOO_NO_PLUGINS", raising=False)
    fake_site.add("twin", "gptzoo_fake_twin", PLUGIN)
    return gptzoo.get_registry()


def table(model: torch.nn.Module, registry: gptzoo.Registry | None = None) -> dict[str, list[tuple[str, int, int]]]:
    return {
        t: [(p.linear, p.start, p.stop) for p in parts] for t, parts in offered(model_parts(model, registry)).items()
    }


def test_the_builtins_offer_q_k_v_o_and_the_mlp_projections() -> None:
    llama = table(tiny_model("llama-tiny"))  # 4 heads of 16 over 2 KV heads, d_ff 128 (gated)
    assert list(llama) == ["attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down"]
    assert llama["attn.k"][0] == ("blocks.0.attn.c_attn", 64, 96) and llama["mlp.up"][1] == (
        "blocks.1.mlp.c_fc",
        176,
        352,
    )
    gpt2 = table(tiny_model("gpt2-tiny"))
    assert list(gpt2) == ["attn.q", "attn.k", "attn.v", "attn.o", "mlp.up", "mlp.down"]
    assert len(gpt2["attn.q"]) == gptzoo.load_recipe("gpt2-tiny").model.n_layer


def test_the_hybrids_offer_each_mixer_s_projections_by_name() -> None:
    """Gated DeltaNet's in_proj is its q, k, v and output gate z, its gate_proj its write strength b and decay a;
    the short convolution's in_proj its gates b and c and input x; each mixer's c_proj is o, as attention's is."""
    qwen = table(tiny_model("qwen3.5-tiny"))  # 3 gated DeltaNet layers (2 key heads of 16, 4 value heads of 16)
    assert list(qwen) == [*(f"attn.{p}" for p in "qkvzba"), "attn.o", "mlp.gate", "mlp.up", "mlp.down"]
    assert qwen["attn.z"][0] == ("blocks.0.attn.in_proj", 128, 192)
    assert qwen["attn.q"][3] == ("blocks.3.attn.c_attn", 0, 128)  # the attention layer's query and its gate
    lfm2 = table(tiny_model("lfm2-tiny"))
    assert sorted(lfm2) == sorted([*(f"attn.{p}" for p in "bcxoqkv"), "mlp.gate", "mlp.up", "mlp.down"])
    assert len(lfm2["attn.o"]) == 4 and len(lfm2["attn.q"]) == 1  # every layer's output, the attention's query
    assert lfm2["attn.x"][0] == ("blocks.0.attn.in_proj", 128, 192)


def test_a_plugin_mlp_is_adaptable_by_its_attribute_names_and_by_its_registered_parts(
    registry: gptzoo.Registry,
) -> None:
    plain = table(tiny_model_with(registry, "twin"), registry)
    assert [t for t in plain if t.startswith("mlp.")] == ["mlp.w_in", "mlp.w_out"]
    split = table(tiny_model_with(registry, "split_twin"), registry)
    assert [t for t in split if t.startswith("mlp.")] == ["mlp.left", "mlp.right", "mlp.w_out"]
    assert split["mlp.right"][0] == ("blocks.0.mlp.w_in", 176, 352)


def tiny_model_with(registry: gptzoo.Registry, mlp: str) -> gptzoo.GPT:
    torch.manual_seed(0)
    return gptzoo.build_model(
        gptzoo.load_recipe("llama-tiny", [f"model.mlp={mlp}"], registry=registry), registry=registry
    )


def test_a_plugin_mlp_trains_adapters_with_no_code_of_its_own(registry: gptzoo.Registry) -> None:
    model = tiny_model_with(registry, "split_twin")
    parts = offered(model_parts(model, registry))
    attach(model, parts["mlp.right"] + parts["mlp.w_out"], LoRASpec(rank=2, alpha=2))
    x = torch.randint(0, 256, (2, 8))
    before = model(x).detach()
    model(x).square().mean().backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert grads == {n for n, p in model.named_parameters() if ".lora_" in n} and len(grads) == 2 * 2 * 2
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_()
        adapted = model(x)
        assert (adapted - before).abs().max() > 1e-3
        merge(model)
        assert not any(isinstance(m, LoRALinear) for m in model.modules())
        torch.testing.assert_close(model(x), adapted, rtol=0, atol=1e-5)


def test_a_split_whose_rows_do_not_add_up_is_refused_by_name(registry: gptzoo.Registry) -> None:
    model = tiny_model_with(registry, "split_twin")
    model.blocks[0].mlp.w_out.in_features = 400  # the split now claims 400 rows of the 352
    with pytest.raises(GptzooError) as raised:
        model_parts(model, registry)
    assert "the adapter parts of gptzoo_fake_twin:SplitMLP.w_in are [400, -48] rows, but it has 352" in str(
        raised.value
    )


def test_a_registration_that_is_not_a_split_is_refused(fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's adapter parts are refused (fatal in strict mode); its mlp still loads."""
    monkeypatch.delenv("GPTZOO_NO_PLUGINS", raising=False)
    fake_site.add("badsplit", "gptzoo_fake_badsplit", PLUGIN.replace('{"w_in": lambda', '{"w_in": 3, "x": lambda'))
    refusal = (
        "its register_adapter_parts was refused (gptzoo_fake_badsplit (gptzoo-fake-badsplit 1.0) registered "
        "adapter parts for gptzoo_fake_badsplit:SplitMLP that are not {attribute: split function}"
    )
    registry = gptzoo.get_registry()
    (info,) = [p for p in registry.plugins if p.distribution == "gptzoo-fake-badsplit"]
    assert info.status == "ok" and info.refused[0].startswith(refusal)
    with pytest.raises(PluginError) as raised:
        gptzoo.get_registry(strict=True)
    assert f"plugin 'badsplit' (gptzoo-fake-badsplit 1.0) loaded, but {refusal}" in str(raised.value)


@pytest.mark.parametrize(
    ("asked", "chosen"),
    [(["q", "v"], ["attn.q", "attn.v"]), (["attn.o", "down"], ["attn.o", "mlp.down"]), (["all"], None)],
)
def test_short_and_full_names(asked: list[str], chosen: list[str] | None) -> None:
    offers = offered(model_parts(tiny_model("llama-tiny")))
    assert select(offers, asked) == (chosen if chosen is not None else list(offers))


def test_unknown_and_ambiguous_targets_are_named_with_the_list(registry: gptzoo.Registry) -> None:
    offers = offered(model_parts(tiny_model("llama-tiny")))
    with pytest.raises(GptzooError) as raised:
        select(offers, ["qq", "w_in"])
    message = str(raised.value)
    assert message.startswith("--targets: 'qq' is not a target of this model")
    assert "'w_in' is not a target of this model" in message
    assert "the model's targets are attn.q, attn.k, attn.v, attn.o, mlp.gate, mlp.up, mlp.down" in message
    twin = offered(model_parts(tiny_model_with(registry, "twin"), registry))
    twin["other.w_out"] = twin["mlp.w_out"]
    with pytest.raises(GptzooError) as raised:
        select(twin, ["w_out"])
    assert "'w_out' is ambiguous: mlp.w_out or other.w_out" in str(raised.value)
