"""The builder: it uses the entries validation resolved (each name looked up once per command), it
assembles a model once on a real device (the memory check counts during that assembly), and seeded
random weights stay what they were."""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cli_run import run_error, run_json
from fakedist import FakeSite

import gptzoo
import gptzoo.model.build as build_module
from gptzoo.errors import GptzooError
from gptzoo.model import fits
from gptzoo.recipe import Component, entry_of, load_recipe, override_recipe
from gptzoo.registry import Registry


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """How often the registry resolved a name ("get") and the builder assembled a model ("assemble")."""
    counted: Counter[str] = Counter()
    get, assemble = Registry.get, build_module.assemble

    def counting_get(self: Registry, kind: str, name: str) -> gptzoo.registry.Entry:
        counted["get"] += 1
        return get(self, kind, name)

    def counting_assemble(*args: object, **kwargs: object) -> gptzoo.GPT:
        counted["assemble"] += 1
        return assemble(*args, **kwargs)

    monkeypatch.setattr(Registry, "get", counting_get)
    monkeypatch.setattr(build_module, "assemble", counting_assemble)
    yield counted


def test_a_validated_component_holds_its_entry_which_is_never_compared_shown_or_written(
    registry: Registry,
) -> None:
    recipe = load_recipe("gpt2-tiny", registry=registry)
    norm = recipe.model.norm
    assert norm.entry is registry.get("norm", "layernorm")
    assert norm == Component("layernorm", norm.params) and hash(norm) == hash(Component("layernorm", norm.params))
    assert "entry" not in repr(norm) and "Entry" not in recipe.to_toml()
    assert pickle.loads(pickle.dumps(norm)).entry is None  # another process looks it up in its own registry
    assert [
        s.entry for s in load_recipe("gpt2-tiny", ["generate.samplers=['top_k']"], registry=registry).generate.samplers
    ] == [registry.get("sampler", "top_k")]


def test_an_override_resolves_the_new_name(registry: Registry) -> None:
    recipe = override_recipe(load_recipe("gpt2-tiny", registry=registry), ["model.norm=rmsnorm"], registry=registry)
    assert recipe.model.norm.entry is registry.get("norm", "rmsnorm")


def test_an_entry_of_another_registry_or_none_is_looked_up_in_the_one_given(registry: Registry) -> None:
    other = gptzoo.get_registry()
    validated = load_recipe("gpt2-tiny", registry=registry).model.norm
    assert entry_of("norm", validated, registry) is validated.entry
    assert entry_of("norm", validated, other) is other.get("norm", "layernorm") is not validated.entry
    assert entry_of("norm", Component("rmsnorm"), other) is other.get("norm", "rmsnorm")
    model = gptzoo.build_model(load_recipe("gpt2-tiny", registry=registry), device="meta", registry=other)
    assert model.registry is other


@pytest.mark.parametrize(
    ("argv", "assemblies"),
    [
        (["build", "gpt2-small"], 1),  # the summary's, on the meta device
        (["build", "gpt2-small", "--out", "{out}"], 2),  # the summary's, then the checkpoint's on the CPU
    ],
)
def test_a_command_looks_each_name_up_once_and_assembles_once_per_device(
    calls: Counter[str], capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], assemblies: int
) -> None:
    run_json(capsys, *(a.format(out=tmp_path / "out") for a in argv))
    assert dict(calls) == {"get": 5, "assemble": assemblies}  # norm, activation, mlp, position, attention


def test_loading_a_recipe_looks_each_name_up_once_and_assembles_once(calls: Counter[str]) -> None:
    gptzoo.load_model("gpt2-tiny", seed=0)
    assert dict(calls) == {"get": 5, "assemble": 1}


def test_a_recipe_made_by_hand_looks_each_name_up_once_per_assembly(registry: Registry, calls: Counter[str]) -> None:
    recipe = pickle.loads(pickle.dumps(load_recipe("gpt2-small", registry=registry)))  # no entries, as by hand
    assert recipe.model.norm.entry is None
    calls.clear()
    gptzoo.build_model(recipe, device="meta", registry=registry)
    assert dict(calls) == {"get": 5, "assemble": 1}  # 12 blocks, 25 norms: each name once


def test_build_out_of_a_model_too_large_assembles_twice(
    calls: Counter[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(build_module, "available_bytes", lambda device: 16 * 2**30)
    message = run_error(capsys, "build", "gpt2-small", "--set", "model.n_layer=1000", "--out", str(tmp_path / "o"))
    assert message.startswith("error: recipe 'gpt2-small' needs 26.55 GiB for its float32 weights on cpu, and 16.00")
    assert calls["assemble"] == 2  # the summary's structure (whose total the check takes), the first real block


@pytest.mark.parametrize(
    ("name", "overrides", "total", "first"),
    [
        ("gpt2-tiny", [], 330.9817356167486, [0.0009591978741809726, -0.02405737154185772]),
        ("llama-tiny", [], 310.6189100194255, [0.009922834113240242, -0.021206311881542206]),
        (
            "gemma3-270m",
            ["model.n_layer=2", "model.vocab_size=512", "model.n_embd=64", "model.d_ff=128", "model.head_dim=16"],
            -8.404525324277984,
            [0.017100222408771515, -0.008908145129680634],
        ),
    ],
)
def test_seeded_random_weights_are_those_before_the_builder_assembled_once(
    name: str, overrides: list[str], total: float, first: list[float]
) -> None:
    """The values of the builder that assembled on the meta device first, then again on the CPU."""
    state = gptzoo.load_model(name, overrides=overrides, seed=0, recipe_weights=False).model.state_dict()
    assert sum(float(t.double().sum()) for t in state.values()) == pytest.approx(total, rel=1e-9)
    assert state["wte.weight"].flatten()[:2].tolist() == pytest.approx(first, rel=1e-6)


WASTEFUL = """
import torch
from torch import nn

import gptzoo


class Wasteful(nn.Module):
    \"\"\"A norm whose constructor registers a 4 MiB buffer in a module it then throws away.\"\"\"

    def __init__(self, dim: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        scratch = nn.Module()
        scratch.register_buffer("table", torch.zeros(2**20))
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.weight


@gptzoo.hookimpl
def register_norms(register):
    register("wasteful", Wasteful)
"""


def test_a_count_over_the_free_memory_is_judged_by_the_exact_total(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch, calls: Counter[str]
) -> None:
    fake_site.add("wasteful", "gptzoo_fake_wasteful", WASTEFUL)
    recipe = load_recipe("gpt2-tiny", ["model.norm=wasteful"])
    exact = fits.float32_bytes(gptzoo.build_model(recipe, device="meta"))
    monkeypatch.setattr(build_module, "available_bytes", lambda device: exact)  # the scratch tables count over it
    calls.clear()
    gptzoo.load_model(recipe, seed=0)
    assert calls["assemble"] == 1  # the exact total is the meta structure's, built above
    recipe = load_recipe("gpt2-tiny", ["model.norm=wasteful"])  # another Recipe: its total is not known
    calls.clear()
    fitted = gptzoo.load_model(recipe, seed=0).model.state_dict()
    assert calls["assemble"] == 2  # the real one, and a structure for the exact total
    monkeypatch.setattr(build_module, "available_bytes", lambda device: None)  # nothing checked
    unchecked = gptzoo.load_model(recipe, seed=0).model.state_dict()
    assert all(torch.equal(fitted[k], unchecked[k]) for k in unchecked)  # the exact total drew no random number
    monkeypatch.setattr(build_module, "available_bytes", lambda device: exact - 1)
    with pytest.raises(GptzooError) as excinfo:
        gptzoo.build_model(recipe, device="cpu")
    assert str(excinfo.value) == (
        f"recipe 'gpt2-tiny' needs {gptzoo.memory.format_bytes(exact)} for its float32 weights on cpu, and "
        f"{gptzoo.memory.format_bytes(exact - 1)} is free; make the model smaller (n_layer, n_embd, d_ff, vocab_size, "
        "context_length) or summarize it without --out (gptzoo build works on the meta device)"
    )


def test_a_model_too_large_is_refused_after_its_first_block(
    calls: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    registered: list[int] = []
    monkeypatch.setattr(build_module, "available_bytes", lambda device: 16 * 2**30)
    hook = torch.nn.modules.module.register_module_parameter_registration_hook(
        lambda module, name, p: registered.append(p.numel()) if not p.is_meta else None
    )
    try:
        with pytest.raises(GptzooError, match=r"^recipe 'gpt2-small' needs 26\.55 GiB .* and 16\.00 GiB is free;"):
            gptzoo.build_model(load_recipe("gpt2-small", ["model.n_layer=1000"]), device="cpu")
    finally:
        hook.remove()
    block = 7_087_872  # one GPT-2 small block's parameters
    assert (sum(registered), calls["assemble"]) == (1024 * 768 + block, 2)  # positions, one block; the exact total


def test_an_allocator_out_of_memory_during_assembly_is_the_refusal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from gptzoo_plugins import _mlps

    init = _mlps.DenseMLP.__init__

    def out_of_memory(self: torch.nn.Module, *args: object, **kwargs: object) -> None:
        if torch.get_default_device().type != "meta":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        init(self, *args, **kwargs)

    monkeypatch.setattr(_mlps.DenseMLP, "__init__", out_of_memory)
    monkeypatch.setattr(build_module, "available_bytes", lambda device: 2**30)
    assert run_error(capsys, "build", "gpt2-tiny", "--out", str(tmp_path / "out")) == (
        "error: recipe 'gpt2-tiny' needs 12.68 MiB for its float32 weights on cpu, more than the allocator could "
        "give; make the model smaller (n_layer, n_embd, d_ff, vocab_size, context_length) or summarize it without "
        "--out (gptzoo build works on the meta device)"
    )
