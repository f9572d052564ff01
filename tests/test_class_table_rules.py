"""The one rule of gptzoo.class_table, seen through each subsystem hook: a plugin's row replaces gptzoo's
only with override=True (a plugin written before contract 7 replaced adapter parts and cache movers
without it, and still does), two plugins' rows for one class fail the later plugin unless it overrides,
and the two hooks contract 7 added (rotary tables, quantized linears) work, their older forms with one
warning per class."""

from __future__ import annotations

import warnings

import pytest
import torch
from fakedist import FakeSite

import gptzoo
from gptzoo.adapters.targets import model_parts, offered
from gptzoo.cli import main
from gptzoo.errors import GptzooError, GptzooWarning
from gptzoo.inference import matvec
from gptzoo.inference.decode_plan import compile_step
from gptzoo.inference.quantize import kept_float

SPLIT_GATED = """
import gptzoo
{contract}

@gptzoo.hookimpl
def register_adapter_parts(register):
    split = {{"c_fc": lambda m: [("w1", m.c_proj.in_features), ("w3", -1)]}}
    register("gptzoo_plugins._mlps:GatedMLP", split{override})
"""


def llama(registry: gptzoo.Registry) -> gptzoo.GPT:
    torch.manual_seed(0)
    return gptzoo.build_model(gptzoo.load_recipe("llama-tiny", registry=registry), registry=registry).eval()


def mlp_targets(registry: gptzoo.Registry) -> list[str]:
    return [t for t in offered(model_parts(llama(registry), registry)) if t.startswith("mlp.")]


@pytest.mark.parametrize(
    ("contract", "override", "targets"),
    [
        ("gptzoo_contract = 7", "", ["mlp.gate", "mlp.up", "mlp.down"]),  # gptzoo's row stays
        ("gptzoo_contract = 7", ", override=True", ["mlp.w1", "mlp.w3", "mlp.down"]),
        ("gptzoo_contract = 6", "", ["mlp.w1", "mlp.w3", "mlp.down"]),  # as contract 6 promised
        ("", "", ["mlp.w1", "mlp.w3", "mlp.down"]),  # a plugin that declares no contract: as before
    ],
)
def test_a_plugin_split_replaces_gptzoo_s_with_override_or_as_its_older_contract_did(
    fake_site: FakeSite, contract: str, override: str, targets: list[str]
) -> None:
    fake_site.add("split", "gz_split", SPLIT_GATED.format(contract=contract, override=override))
    registry = gptzoo.get_registry()
    assert registry.failed == []
    assert mlp_targets(registry) == targets


MOVER = """
import gptzoo
gptzoo_contract = 7

def move(dst, i, dst_end, src, j, src_end, n):
    pass

@gptzoo.hookimpl
def register_cache_rows(register):
    register("gz_own:Cache", move{override})
"""


def test_two_plugins_moving_one_cache_class_refuse_the_later_unless_it_overrides(fake_site: FakeSite) -> None:
    """The later plugin's mover is refused, not the plugin: its components (here none) still load, and the
    refusal is in its report, `gptzoo plugins` and each command's warnings."""
    fake_site.add("mover_a", "gz_mover_a", MOVER.format(override=""))
    fake_site.add("mover_b", "gz_mover_b", MOVER.format(override=""))
    registry = gptzoo.get_registry()
    assert registry.failed == []
    (later,) = [p for p in registry.plugins if p.distribution == "gptzoo-fake-mover_b"]
    assert later.refused == (
        "its register_cache_rows was refused (the mover of gz_own:Cache is registered by both "
        "gz_mover_a (gptzoo-fake-mover_a 1.0) and gz_mover_b (gptzoo-fake-mover_b 1.0); register the later one "
        "with override=True)",
    )
    (row,) = registry.rows["register_cache_rows"]
    assert row.provenance.plugin == "gz_mover_a"
    fake_site.add("mover_c", "gz_mover_c", MOVER.format(override=", override=True"))
    (row,) = gptzoo.get_registry().rows["register_cache_rows"]
    assert (row.provenance.plugin, row.overrides.plugin) == ("gz_mover_c", "gz_mover_a")


ROTATION = """
import gptzoo
gptzoo_contract = 7


class OwnRotation:
    '''A plugin's rotation, wrapping the built-in one's arithmetic.'''

    def __init__(self, inner):
        self.inner = inner

    def apply(self, q, k):
        return self.inner.apply(q, k)


def tables(rotation):
    inner = rotation.inner
    return inner.cos.reshape(-1), inner.sin.reshape(-1), inner.in_float32


@gptzoo.hookimpl
def register_rotary_tables(register):
    register(OwnRotation, {tables})
"""


@pytest.mark.parametrize("by_reference", [False, True])
def test_a_plugin_rotation_decodes_natively_through_the_tables_it_registers(
    fake_site: FakeSite, by_reference: bool
) -> None:
    fake_site.add(
        "rotation", "gz_rotation", ROTATION.format(tables="'gz_rotation:tables'" if by_reference else "tables")
    )
    registry = gptzoo.get_registry()
    assert registry.failed == []
    import gz_rotation

    model = llama(registry)
    rope = model.position

    class OwnRoPE(type(rope)):
        def rotary(self, positions: torch.Tensor) -> object:
            return gz_rotation.OwnRotation(super().rotary(positions))

    rope.__class__ = OwnRoPE
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    eager_cache, plan_cache = model.init_cache(1, 16), model.init_cache(1, 16)
    with torch.no_grad(), matvec.native_decoding(model), warnings.catch_warnings():
        warnings.simplefilter("error", GptzooWarning)
        model(prompt, eager_cache)
        model(prompt, plan_cache)
        step, why = compile_step(model, plan_cache, 1)
        assert step is not None, why
        token = prompt[:, -1:]
        for _ in range(4):
            eager = model(token, eager_cache)[:, -1]
            assert (step(token)[:, -1] - eager).abs().max() < 1e-5
            token = eager.argmax(-1, keepdim=True)


QUANTIZED = """
import gptzoo
gptzoo_contract = 7

@gptzoo.hookimpl
def register_quantized_linears(register):
    register("gptzoo_plugins._mlps:GatedMLP", {linears})
"""


def test_a_plugin_keeps_a_component_s_linears_in_float_through_the_hook(fake_site: FakeSite) -> None:
    fake_site.add("quantized", "gz_quantized", QUANTIZED.format(linears='("c_fc",)'))
    registry = gptzoo.get_registry()
    assert kept_float(llama(registry), registry) == ["blocks.0.mlp.c_proj", "blocks.1.mlp.c_proj"]
    assert kept_float(llama(gptzoo.get_registry(third_party=False))) == []


def test_a_quantized_linears_row_naming_no_linear_is_refused_naming_it(fake_site: FakeSite) -> None:
    fake_site.add("quantized", "gz_quantized", QUANTIZED.format(linears='("w_in",)'))
    registry = gptzoo.get_registry()
    with pytest.raises(GptzooError) as raised:
        kept_float(llama(registry), registry)
    assert str(raised.value) == (
        "gz_quantized (gptzoo-fake-quantized 1.0) registered the quantized linears of gptzoo_plugins._mlps:GatedMLP "
        "as ('w_in',), but 'w_in' is not one of its nn.Linear modules (c_fc, c_proj); fix the plugin"
    )


@pytest.mark.parametrize("linears", ["'all'", "('c_fc', 3)"])
def test_a_malformed_quantized_linears_registration_is_refused(fake_site: FakeSite, linears: str) -> None:
    fake_site.add("quantized", "gz_quantized", QUANTIZED.format(linears=linears))
    registry = gptzoo.get_registry()
    assert registry.failed == [] and registry.rows["register_quantized_linears"] == []
    ((refusal,),) = [p.refused for p in registry.plugins if p.module == "gz_quantized"]
    assert refusal.startswith(
        "its register_quantized_linears was refused (gz_quantized (gptzoo-fake-quantized 1.0) "
        "registered the quantized linears of gptzoo_plugins._mlps:GatedMLP as "
    )
    assert refusal.endswith("; pass True, False or a tuple of the paths of its nn.Linear modules)")


def test_the_int8_attribute_of_contract_4_still_keeps_linears_in_float_with_one_warning() -> None:
    model = llama(gptzoo.get_registry(third_party=False))
    mlp = model.blocks[0].mlp

    class KeepsDown(type(mlp)):
        int8 = ("c_fc",)

    mlp.__class__ = KeepsDown
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kept_float(model) == ["blocks.0.mlp.c_proj"]
        assert kept_float(model) == ["blocks.0.mlp.c_proj"]
    said = [str(w.message) for w in caught if issubclass(w.category, GptzooWarning)]
    assert len(said) == 1 and said[0].startswith(
        "test_class_table_rules:test_the_int8_attribute_of_contract_4_still_keeps_linears_in_float_with_one_warning."
        "<locals>.KeepsDown says which of its linears --dtype int8 and int4 may quantize with a class attribute int8"
    )


NORM_AND_BROKEN_LOWERING = """
import gptzoo
import torch
gptzoo_contract = 7

class MyNorm(torch.nn.Module):
    def __init__(self, dim: int = 8, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.weight

@gptzoo.hookimpl
def register_norms(register):
    register("mynorm", MyNorm, doc="a norm")

@gptzoo.hookimpl
def register_decode_lowerings(register):
    register(MyNorm, "not a function")

@gptzoo.hookimpl
def register_hf_layouts(register):
    raise RuntimeError("the layout table is not ready")
"""


def test_a_refused_subsystem_registration_leaves_the_plugin_s_components(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One refused (or raising) subsystem hook loses that hook's rows, not the plugin: its norm builds,
    `gptzoo plugins` shows the refusals, a command warns of them, and strict mode still fails."""
    from cli_run import run_json

    fake_site.add("brokenlow", "gz_brokenlow", NORM_AND_BROKEN_LOWERING)
    registry = gptzoo.get_registry()
    assert registry.failed == [] and "mynorm" in registry.names("norm")
    (info,) = [p for p in registry.plugins if p.module == "gz_brokenlow"]
    assert info.refused == (
        "its register_decode_lowerings was refused (gz_brokenlow (gptzoo-fake-brokenlow 1.0) registered the "
        "lowering of gz_brokenlow:MyNorm with a reference that is not 'module:attribute': 'not a function')",
        "its register_hf_layouts was refused (RuntimeError: the layout table is not ready)",
    )
    norm = registry.get("norm", "mynorm").factory(dim=4)
    assert torch.equal(norm(torch.full((2, 4), 3.0)), torch.full((2, 4), 3.0))
    report = run_json(capsys, "plugins")
    (row,) = [r for r in report if r["module"] == "gz_brokenlow"]
    assert row["status"] == "ok" and row["refused"] == list(info.refused)
    assert main(["build", "gpt2-tiny", "--set", "model.norm=mynorm"]) == 0
    warned = " ".join(capsys.readouterr().err.split())
    assert f"plugin 'brokenlow' (gptzoo-fake-brokenlow 1.0) loaded, but {info.refused[1]}" in warned
    with pytest.raises(gptzoo.PluginError) as raised:
        gptzoo.get_registry(strict=True)
    assert str(raised.value).startswith(
        "plugin 'brokenlow' (gptzoo-fake-brokenlow 1.0) loaded, but its register_decode_lowerings was refused ("
    )
