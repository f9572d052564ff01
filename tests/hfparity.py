"""Parity with transformers for any family, on random-init checkpoints built from tiny configs (no
network): the checks every family's tests run, so that each family proves the same things.

- :func:`save_hf`: a random checkpoint whose 1-D tensors (biases, norm weights) are perturbed, so a
  bias or norm mapped to the wrong place shows in the logits;
- :func:`check_family`: float32 logits within 1e-4 and the same 32 greedy tokens, with gptzoo's SDPA
  and eager attentions against transformers' SDPA and eager kernels, on prompts longer than any
  sliding window; cached decoding that crosses the window equal to full recomputation; export, then
  ``transformers.AutoModelForCausalLM.from_pretrained`` of the export, gives the same logits, and
  importing the export gives the same tensors;
- :func:`config_problem` and :func:`refusal`: what a family says of a config.json it must refuse, and of a
  recipe it cannot export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from cli_run import run_json

import gptzoo
from gptzoo.errors import RecipeError
from gptzoo.hf import FAMILIES, NoEquivalentError, check_recipe_matches, export_hf, hf_recipe, load_hf
from gptzoo.inference.generate import generate
from gptzoo.model.build import assemble
from gptzoo.recipe import Recipe, validate

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

KERNELS = {
    "sdpa": {"causal": "causal", "sliding_window": "sliding_window"},
    "eager": {"causal": "eager", "sliding_window": "eager"},
}
"""gptzoo's attention for each of transformers' kernels: the same parameters (window, scale, ...), another kernel
(an attention with one kernel, such as mla, runs it against both)."""


def save_hf(
    tmp_path: Path, name: str, config: transformers.PretrainedConfig, *, seed: int = 0, wide: tuple[str, ...] = ()
) -> Path:
    """``wide``: suffixes of the parameters drawn from normal(0, 1) instead (a router's: its choices then
    rest on clear margins, not on near-ties that rounding could flip)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith(wide):
                p.normal_()
            elif p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path / name
    model.save_pretrained(path)
    return path


def with_kernel(recipe: Recipe, kernel: str) -> Recipe:
    """The recipe with every attention (in [model] and each layer type) computed by ``kernel``'s counterpart."""
    data = recipe.to_dict()
    data.pop("provenance", None)
    model = data["model"]
    for table in (model, *model.get("layer_types", {}).values()):
        attention = table.get("attention")
        if attention is not None:
            attention = {"name": attention} if isinstance(attention, str) else dict(attention)
            attention["name"] = KERNELS[kernel].get(attention["name"], attention["name"])
            table["attention"] = attention
    return validate(data, recipe.source, name=recipe.name)


def hf_model(path: Path, kernel: str) -> Any:
    """transformers' model with that attention kernel, or its eager one where it has no other (Gemma 2)."""
    config = transformers.AutoConfig.from_pretrained(path)
    if not getattr(transformers.AutoModelForCausalLM._model_mapping[type(config)], "_supports_sdpa", True):
        kernel = "eager"
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=kernel
    ).eval()


def prompt(vocab: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def hf_greedy(model: Any, ids: torch.Tensor, n: int) -> list[int]:
    """transformers' greedy continuation. The attention mask is explicit: without one, generate takes
    every prompt token equal to pad_token_id (0 here, a token random prompts hold) for padding."""
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, ids.shape[1] :].tolist()


def check_family(path: Path, *, length: int, kernels: tuple[str, ...] = ("sdpa", "eager"), window: int = 0) -> Recipe:
    """Every parity check on the checkpoint at ``path`` with a prompt of ``length`` tokens (longer than
    any sliding window); ``window``: the smallest sliding window, whose boundary cached decoding crosses.
    Returns the recipe derived from config.json."""
    derived = hf_recipe(path)
    ids = prompt(derived.model.vocab_size, length)
    for kernel in kernels:
        theirs = hf_model(path, kernel)
        ours = load_hf(path, with_kernel(derived, kernel)).eval()
        with torch.no_grad():
            expected = theirs(ids).logits
            got = ours(ids)
        diff = (got - expected).abs().max().item()
        assert diff <= 1e-4, f"{kernel}: max |delta logits| {diff}"
        assert generate(ours, [ids[0].tolist()], 32)[0] == hf_greedy(theirs, ids, 32), f"{kernel}: greedy tokens"
    ours = load_hf(path).eval()
    check_cached_decoding(ours, ids, window)
    check_export(ours, ids, path.parent / f"{path.name}-export")
    return derived


def check_cached_decoding(model: gptzoo.GPT, ids: torch.Tensor, window: int) -> None:
    """Prefill up to just before the window's end, then decode one token at a time past it: every
    step's logits equal those of one full pass."""
    prefill = max(1, min(window - 2, ids.shape[1] - 4)) if window else ids.shape[1] // 2
    with torch.no_grad():
        full = model(ids)
        cache = model.init_cache(1, ids.shape[1])
        steps = [model(ids[:, :prefill], cache)]
        steps += [model(ids[:, t : t + 1], cache) for t in range(prefill, ids.shape[1])]
    diff = (torch.cat(steps, dim=1) - full).abs().max().item()
    assert diff <= 1e-4, f"cached decoding differs from full recomputation by {diff}"


def check_export(model: gptzoo.GPT, ids: torch.Tensor, out: Path) -> None:
    export_hf(model, out)
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        diff = (exported(ids).logits - model(ids)).abs().max().item()
    assert diff <= 1e-4, f"the export's logits in transformers differ by {diff}"
    again = load_hf(out)
    mine, theirs = model.state_dict(), again.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def official_counts(config: dict[str, Any]) -> tuple[int, int]:
    """transformers' parameter count of an official config.json (on the meta device), and the parameters
    one token uses: that, less the experts a token skips in each layer that has them (num_experts_per_tok
    of each experts module's num_experts; an expert's share of the module, biases included)."""
    hf = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    total = sum(p.numel() for p in model.parameters())
    k = config["num_experts_per_tok"]
    experts = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
    skipped = sum((m.num_experts - k) * sum(p.numel() for p in m.parameters()) // m.num_experts for m in experts)
    return total, total - skipped


def check_shipped_recipe(tmp_path: Path, name: str, config: dict[str, Any], capsys: Any) -> tuple[int, int]:
    """The shipped recipe ``name`` is what gptzoo derives from the official config.json, and ``gptzoo build``
    counts its total and active parameters as transformers does (:func:`official_counts`); returns them."""
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    shipped, derived = gptzoo.load_recipe(name), hf_recipe(path)
    assert shipped.model == derived.model
    check_recipe_matches(shipped, derived, gptzoo.get_registry())
    params = run_json(capsys, "build", name)["params"]
    assert (params["total"], params["active"]) == official_counts(config)
    return params["total"], params["active"]


def config_problem(path: Path) -> str:
    """What hf_recipe says of the config.json in ``path``, which it must refuse."""
    with pytest.raises(RecipeError) as excinfo:
        hf_recipe(path)
    return str(excinfo.value)


def refusal(name: str, overrides: list[str], family: str) -> str:
    """Why the family's export refuses the shipped recipe ``name`` with ``overrides``."""
    loaded = gptzoo.load_recipe(name, overrides)
    components: list = []
    skeleton = assemble(loaded, gptzoo.get_registry(), torch.device("meta"), components)
    with pytest.raises(NoEquivalentError) as excinfo:
        FAMILIES[family].config(loaded, skeleton, components)
    return str(excinfo.value)
