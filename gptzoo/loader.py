"""One way to get a model: from a recipe, a Hugging Face checkpoint or a gptzoo checkpoint, with
``--set`` overrides, validated and built against one registry; and :func:`build`, what
``gptzoo build`` does with one.

Example::

    import gptzoo, torch
    loaded = gptzoo.load_model("gpt2-tiny", overrides=["model.n_layer=1"], seed=0)
    loaded.warnings  # ("recipe 'gpt2-tiny' has no [weights]: the model has random weights",)
    ids = loaded.tokenizer().encode("Hello")
    logits = loaded.model(torch.tensor([ids]))
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from gptzoo.adapters.run import ADAPTER, read_spec
from gptzoo.adapters.run import SPEC as FINETUNE_SPEC
from gptzoo.atomic import check_new_directory
from gptzoo.defaults import PRECISIONS, precision
from gptzoo.errors import CheckpointError, GptzooError, Interrupted, suggest
from gptzoo.hf.convert import check_recipe_matches, hf_recipe, load_hf
from gptzoo.hf.files import Checkpoint, open_checkpoint
from gptzoo.inference.quantize import kept_float, quantize, unfit
from gptzoo.model.build import build_model
from gptzoo.model.checkpoint import FILES as CHECKPOINT_FILES
from gptzoo.model.checkpoint import load_checkpoint, save_checkpoint, tokenizer_files
from gptzoo.model.gpt import GPT
from gptzoo.model.summary import summarize
from gptzoo.plugin_code import failure_of
from gptzoo.recipe import Recipe, load_recipe, override_recipe, recipe_tokenizer, resolve_components, shipped_recipes
from gptzoo.registry import Registry, default_registry
from gptzoo.tokenizer import HF_TOKENIZER_FILES, Tokenizer
from gptzoo.untrusted import check_utf8_path


@dataclass(frozen=True)
class Loaded:
    """A model and what came with it."""

    model: GPT
    recipe: Recipe
    source: str
    """Where the weights come from, in words: a checkpoint, a Hugging Face directory, random, none (meta)."""
    hf_dir: Path | None = None
    """Where the Hugging Face tokenizer files are: the Hugging Face checkpoint directory the weights
    came from, or a gptzoo checkpoint directory that holds them (``gptzoo build --hf DIR --out``)."""
    warnings: tuple[str, ...] = ()
    """What a person should know, e.g. that the weights are random."""
    checkpoint: Path | None = None
    """The gptzoo checkpoint directory the weights came from."""
    precision: str | None = None
    """The precision it was loaded in (gptzoo.defaults.PRECISIONS: "int8" among them); None: the weights' own."""

    def tokenizer(self) -> Tokenizer:
        """The recipe's tokenizer; without a [tokenizer] section, the Hugging Face checkpoint's own
        (a clear error when the weights came from elsewhere: see gptzoo.recipe.recipe_tokenizer)."""
        explicit_hf = self.recipe.tokenizer is not None and self.recipe.tokenizer.name == "hf"
        if self.checkpoint is not None and self.hf_dir is None and explicit_hf:
            raise GptzooError(
                f'checkpoint {self.checkpoint} has no tokenizer files, and its recipe\'s [tokenizer] name = "hf" is '
                "the tokenizer of the Hugging Face checkpoint its weights came from: copy that checkpoint's tokenizer "
                f"files ({', '.join(HF_TOKENIZER_FILES)} and the like) into {self.checkpoint}, or generate from the "
                "Hugging Face checkpoint itself (--hf DIR)"
            )
        return recipe_tokenizer(self.recipe, self.hf_dir)


def resolve_recipe(
    recipe: str | Path | Recipe | None = None,
    *,
    hf: str | Path | None = None,
    overrides: Sequence[str] = (),
    registry: Registry | None = None,
    need_weights: bool = False,
) -> tuple[Recipe, str | Path | Checkpoint | None]:
    """The recipe (given, or derived from the Hugging Face checkpoint ``hf``) with ``overrides``,
    and where its weights come from: ``hf``, else the recipe's [weights] hf, else None.

    A given recipe must agree with ``hf``'s config.json where it decides the model (checked when the
    weights load; see gptzoo.hf.check_recipe_matches). With ``need_weights``, no source is an error.
    """
    registry = registry if registry is not None else default_registry()
    if recipe is None and hf is None:
        raise GptzooError("give a RECIPE, or --hf DIR|NAME to derive one from a Hugging Face checkpoint")
    if recipe is None:
        with _near_names(hf):
            checkpoint = open_checkpoint(hf)
        return hf_recipe(checkpoint, overrides, registry=registry), checkpoint
    if isinstance(recipe, Recipe):
        resolved = override_recipe(recipe, overrides, registry=registry) if overrides else recipe
    else:
        resolved = load_recipe(recipe, overrides, registry=registry)
    source = hf if hf is not None else (resolved.weights.hf if resolved.weights is not None else None)
    if source is None and need_weights:
        raise GptzooError(f"recipe {resolved.name!r} has no [weights] hf; give --hf DIR|NAME")
    return resolved, source


def load_model(
    recipe: str | Path | Recipe | None = None,
    *,
    hf: str | Path | None = None,
    checkpoint: str | Path | None = None,
    overrides: Sequence[str] = (),
    registry: Registry | None = None,
    device: torch.device | str | None = None,
    dtype: str | torch.dtype | None = None,
    seed: int | None = None,
    recipe_weights: bool = True,
) -> Loaded:
    """A model from exactly one of: a recipe (a shipped name, a .toml file or a Recipe), a Hugging Face
    checkpoint ``hf`` (a directory or a name; with a recipe, the recipe must fit it) or a gptzoo
    ``checkpoint`` directory, with ``overrides`` (``--set`` style) validated against ``registry``.

    Args:
        device: where the weights go; ``"meta"`` builds the structure only and reads no weights
            (not for a checkpoint, which is read whole).
        dtype: the precision of the returned model (gptzoo.defaults.PRECISIONS), by name or torch
            dtype: ``"float32"``, ``"bfloat16"``, ``"int8"`` or ``"int4"`` (float32 with every Linear
            layer's weights in int8 or in 4-bit blocks, gptzoo.inference.quantize); default: float32 (or the
            checkpoint's own).
        seed: makes random weights reproducible (the global RNG is left as it was).
        recipe_weights: read a recipe's own [weights] hf; False gives it freshly initialized weights.

    Raises:
        GptzooError: conflicting or missing sources, a recipe or checkpoint problem, overrides that
            do not fit a checkpoint, a ``dtype`` that names no precision.
    """
    chosen = precision(dtype) if dtype is not None else None
    weights_dtype = getattr(torch, chosen.dtype) if chosen is not None else None
    loaded = _load_model(
        recipe,
        hf=hf,
        checkpoint=checkpoint,
        overrides=overrides,
        registry=registry,
        device=device,
        dtype=weights_dtype,
        seed=seed,
        recipe_weights=recipe_weights,
    )
    if chosen is None:
        return loaded
    if chosen.quantized:
        quantized = _quantized(loaded.model, chosen.name, registry)
        return replace(loaded, precision=chosen.name, warnings=(*loaded.warnings, *quantized))
    return replace(loaded, precision=chosen.name)


def with_precision(loaded: Loaded, dtype: str | torch.dtype | None, registry: Registry | None = None) -> Loaded:
    """A loaded model (in float32) in the precision ``dtype`` names, as :func:`load_model` gives it; None: as it is."""
    if dtype is None:
        return loaded
    chosen = precision(dtype)
    if chosen.quantized:
        quantized = _quantized(loaded.model, chosen.name, registry)
        return replace(loaded, precision=chosen.name, warnings=(*loaded.warnings, *quantized))
    loaded.model.to(getattr(torch, chosen.dtype))
    return replace(loaded, precision=chosen.name)


def with_adapters(
    base: Loaded, name: str, adapters: Sequence[str], dtype: str, registry: Registry | None = None
) -> tuple[Loaded, dict[str, GPT]]:
    """The models one base serves: the base (float32, as loaded) as ``name`` with the adapter among
    ``adapters`` that has no name in it, and a copy of the base with each ``NAME=DIR`` adapter as the model
    NAME, every one in ``dtype`` (each adapter goes into the float32 weights first). Returns the base's
    Loaded (with every model's warnings, named) and the models by name.

    Raises:
        GptzooError: the names (:func:`adapter_names`), or what loading an adapter says.
    """
    unnamed, named = adapter_names(name, adapters)
    copies = {n: with_adapter(replace(base, model=copy.deepcopy(base.model)), a, registry) for n, a in named}
    if unnamed:
        base = with_adapter(base, unnamed[0], registry)
    models = {name: with_precision(base, dtype, registry)}
    models.update({n: with_precision(c, dtype, registry) for n, c in copies.items()})
    said = tuple(dict.fromkeys(f"{n}: {w}" if n != name else w for n, m in models.items() for w in m.warnings))
    return replace(models[name], warnings=said), {n: m.model for n, m in models.items()}


def adapter_names(name: str, adapters: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """``--adapter [NAME=]DIR`` texts as the one without a name (at most one: it takes the base's place, as
    ``name``) and the (NAME, text) of the others.

    Raises:
        GptzooError: two adapters without a name, or a name that is empty or ``name`` or given twice.
    """
    from gptzoo.adapters.peft_format import split_adapter

    given = [(split_adapter(a)[0], a) for a in adapters]
    unnamed = [a for n, a in given if n is None]
    named = [(n, a) for n, a in given if n is not None]
    if len(unnamed) > 1:
        raise GptzooError(
            f"--adapter {unnamed[1]} has no name, and only one adapter can take MODEL's place; name the others "
            "with --adapter NAME=DIR"
        )
    names = [name, *(n for n, _ in named)]
    bad = next((n for i, n in enumerate(names) if not n.strip() or n in names[:i]), None)
    if bad is not None:
        raise GptzooError(
            f"--adapter {bad!r}=... names no model or one already served ({', '.join(map(repr, names))}); give each "
            "adapter a name of its own"
        )
    return unnamed, named


def with_adapter(
    loaded: Loaded, adapter: str | Path, registry: Registry | None = None, *, merge: bool = False
) -> Loaded:
    """The model with a LoRA adapter in peft's format (a directory peft or `gptzoo finetune` wrote) merged into
    its weights, or with ``merge=False`` as a low-rank side path that computes what peft's unmerged layers do
    (gptzoo.adapters.peft_format); ``[NAME=]DIR``, the name only labels it.

    Raises:
        CheckpointError: the adapter cannot be read, is not LoRA, is for another base model (by its
            base_model_name_or_path, :func:`check_base`) or does not fit the model.
    """
    from gptzoo.adapters.peft_format import attach_peft, merge_peft, read_peft, split_adapter

    name, directory = split_adapter(str(adapter))
    if loaded.model.recipe is None:
        loaded.model.recipe = loaded.recipe
    read = read_peft(Path(directory).expanduser())
    check_base(read.config.get("base_model_name_or_path"), loaded, directory)
    (merge_peft if merge else attach_peft)(loaded.model, read, registry)
    label = f"{name} ({directory})" if name else directory
    return replace(loaded, source=f"{loaded.source} with adapter {label}")


def known_as(loaded: Loaded) -> list[str]:
    """The names a loaded model goes by, lowercased: its directories', its recipe's, the name its Hugging Face
    config was saved from, the hub's ``models--org--NAME`` cache folder, and what `gptzoo fetch` got it as (the
    fetch name and the GGUF file's model name)."""
    names = [loaded.recipe.name]
    for directory in (loaded.hf_dir, loaded.checkpoint):
        if directory is None:
            continue
        names.append(directory.resolve().name)
        names.extend(part.rsplit("--", 1)[-1] for part in directory.resolve().parts if part.startswith("models--"))
        for file, key in (
            ("config.json", "_name_or_path"),
            ("gptzoo-fetch.json", "name"),
            ("gptzoo-fetch.json", "gguf"),
        ):
            try:
                value = json.loads((directory / file).read_text(encoding="utf-8")).get(key)
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(value, str) and value:
                names.append(Path(value).name.split(".")[0] if key == "gguf" else Path(value).name)
    return list(dict.fromkeys(n.lower() for n in names if n))


def check_base(base: object, loaded: Loaded, adapter: str) -> None:
    """An adapter's ``base_model_name_or_path`` names this model: the directory its weights came from, or one of
    the names it goes by (:func:`known_as`; a hub id ``org/NAME`` by its NAME). An empty one names any model.

    Raises:
        CheckpointError: it names another model, with the names this one goes by (the fix for the same model
            under another name).
    """
    if not isinstance(base, str) or not base.strip():
        return
    given = Path(base).expanduser()
    ours = [p for p in (loaded.hf_dir, loaded.checkpoint) if p is not None]
    if given.exists() and any(given.resolve() == p.resolve() for p in ours):
        return
    names = known_as(loaded)
    if given.name.lower() in names:
        return
    raise CheckpointError(
        f"--adapter {adapter} was made for {base!r} (its adapter_config.json's base_model_name_or_path), not for this "
        f"model ({', '.join(names)}); load it on the model it was made for, or, if this is that model under another "
        f"name, set base_model_name_or_path to one of those names"
    )


INT8_REMEDY = (
    "register its quantized linears as False, or the paths of those it may have quantized "
    "(register_quantized_linears, gptzoo.inference.hooks), or load it in float32 or bfloat16"
)


def quantize_model(model: GPT, dtype: str, registry: Registry | None = None) -> tuple[str, ...]:
    """Quantize a model already in memory, in place, to ``dtype`` ("int8" or "int4") as ``load_model(dtype=...)``
    and ``--dtype`` do (a plugin's tests compare the float and quantized outputs of the same weights); one token
    runs through it. Returns what a person should know: the linears kept in float. ``registry``: where the
    plugins' quantized linears are registered (default: the model's own).

    Raises:
        GptzooError: ``dtype`` is not a quantized precision, or a component cannot run on quantized linears
            (naming it).
    """
    chosen = precision(dtype)
    if not chosen.quantized:
        quantized = [name for name, p in PRECISIONS.items() if p.quantized]
        raise GptzooError(
            f"dtype {dtype!r} is not a quantized precision; give {' or '.join(quantized)} (a float dtype is "
            "model.to(dtype))"
        )
    return _quantized(model, chosen.name, registry if registry is not None else getattr(model, "registry", None))


def _quantized(model: GPT, precision: str, registry: Registry | None) -> tuple[str, ...]:
    """Quantize ``model`` to ``precision`` and run one token through it (a component that cannot run on a
    quantized linear is refused here, naming it, not in the middle of a generation); what a person should
    know: the linears kept in float, as their components declare or for their shape."""
    kept = kept_float(model, registry)
    unfitting = [path for path in unfit(model, precision) if path not in kept]
    quantize(model, precision, registry)
    device = model.wte.weight.device
    if device.type != "meta":
        try:
            with torch.no_grad():
                model(torch.zeros(1, 1, dtype=torch.long, device=device))
        except GptzooError:
            raise
        except Exception as exc:
            when = f"under --dtype {precision} (its nn.Linear modules quantized)"
            failure = failure_of(exc, registry or default_registry(), while_=when, remedy=INT8_REMEDY)
            if failure is None:
                raise
            raise failure from exc
    notes = []
    if kept:
        notes.append(f"{_count(kept)} kept in float as their components declare: {_some(kept)}")
    if unfitting:
        notes.append(f"{_count(unfitting)} kept in float, their inputs not whole blocks of 32: {_some(unfitting)}")
    return tuple(f"{precision}: {note}" for note in notes)


def _count(paths: list[str]) -> str:
    return f"{len(paths)} linear{'s' if len(paths) > 1 else ''}"


def _some(paths: list[str]) -> str:
    return f"{', '.join(paths[:4])}{' and more' if len(paths) > 4 else ''}"


def _load_model(
    recipe: str | Path | Recipe | None,
    *,
    hf: str | Path | None,
    checkpoint: str | Path | None,
    overrides: Sequence[str],
    registry: Registry | None,
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    seed: int | None,
    recipe_weights: bool,
) -> Loaded:
    """:func:`load_model` in ``dtype``, before any Linear layer is quantized."""
    registry = registry if registry is not None else default_registry()
    if checkpoint is not None:
        if recipe is not None or hf is not None:
            raise GptzooError("give either --checkpoint DIR or RECIPE / --hf, not both")
        model = load_checkpoint(checkpoint, overrides=overrides, device=device, dtype=dtype, registry=registry)
        path = Path(checkpoint)
        return Loaded(
            model,
            model.recipe,
            f"checkpoint {checkpoint}",
            hf_dir=path if tokenizer_files(path) else None,
            checkpoint=path,
        )
    resolved, source = resolve_recipe(recipe, hf=hf, overrides=overrides, registry=registry)
    if str(device) == "meta":
        if hf is not None and recipe is not None:  # the recipe must fit, even when no weights are read
            check_recipe_matches(resolved, hf_recipe(hf, registry=registry), registry)
        return Loaded(build_model(resolved, device="meta", registry=registry), resolved, "none (meta device)")
    if source is not None and (recipe_weights or hf is not None):
        checkpoint = open_checkpoint(source)
        model = load_hf(checkpoint, resolved, device=device, dtype=dtype, registry=registry)
        return Loaded(model, resolved, f"Hugging Face checkpoint {checkpoint.path}", hf_dir=checkpoint.path)
    dev = torch.device(device) if device is not None else torch.get_default_device()
    if seed is None:
        model = build_model(resolved, device=dev, dtype=dtype, registry=registry)
    else:
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(seed)
            model = build_model(resolved, device=dev, dtype=dtype, registry=registry)
    warnings = (f"recipe {resolved.name!r} has no [weights]: the model has random weights",) if recipe_weights else ()
    return Loaded(model, resolved, "random initialization", warnings=warnings)


def names_recipe(source: str | Path, registry: Registry | None = None) -> bool:
    """Whether :func:`load_any` reads ``source`` as a recipe: a .toml file, a shipped recipe's name or the
    name of one a plugin of ``registry`` (the default registry's) registers, not a directory."""
    text = str(source)
    if Path(text).is_dir():
        return False
    if text.endswith(".toml") or text in shipped_recipes():
        return True
    return (registry if registry is not None else default_registry()).recipe(text) is not None


@contextmanager
def _near_names(name: str | Path) -> Iterator[None]:
    """A checkpoint name that names nothing (no directory, fetch name or hub name) gets the fetch names and
    shipped recipes nearest it (gptzoo.errors.suggest): ``smolm2`` -> ``smollm2-135m``."""
    try:
        yield
    except CheckpointError as exc:
        from gptzoo.fetch import FETCHABLE

        hint = "" if Path(name).exists() else suggest(str(name), [*FETCHABLE, *shipped_recipes()])
        if not hint:
            raise
        raise CheckpointError(f"{exc}{hint}") from None


def load_any(
    source: str | Path,
    *,
    overrides: Sequence[str] = (),
    registry: Registry | None = None,
    device: torch.device | str | None = None,
    dtype: str | torch.dtype | None = None,
) -> Loaded:
    """A model with real weights from one name, as `gptzoo generate`, `compare` and `eval` take MODEL: a
    gptzoo checkpoint directory, a run directory (its newest checkpoint), a Hugging Face directory, a
    recipe with [weights], or a name `gptzoo fetch` (or the local Hugging Face cache) knows; ``dtype``
    as :func:`load_model` takes it (``"int8"`` among them).

    Raises:
        GptzooError: nothing by that name, a run without checkpoints, a recipe without weights, or a
            ``dtype`` that names no precision.
    """
    from gptzoo.training import run_dir

    text = str(source)
    path = Path(text)
    if path.is_dir() and (path / FINETUNE_SPEC).is_file():  # a fine-tuning run: its base with its adapter
        return _finetuned(path, registry=registry, device=device, dtype=dtype)
    if path.is_dir():
        if all((path / f).is_file() for f in CHECKPOINT_FILES):
            return load_model(checkpoint=path, overrides=overrides, registry=registry, device=device, dtype=dtype)
        if (path / run_dir.CHECKPOINTS).is_dir():
            newest = run_dir.latest(path)
            if newest is None:
                raise GptzooError(f"run {text} has no complete checkpoint yet; train it (or resume it) first")
            return load_model(checkpoint=newest, overrides=overrides, registry=registry, device=device, dtype=dtype)
        if (path / "config.json").is_file():
            return load_model(hf=path, overrides=overrides, registry=registry, device=device, dtype=dtype)
        raise GptzooError(
            f"{text} is a directory but not a model: expected a gptzoo checkpoint ({', '.join(CHECKPOINT_FILES)}), "
            f"a run directory ({run_dir.CHECKPOINTS}/) or a Hugging Face checkpoint (config.json)"
        )
    if names_recipe(text, registry):
        recipe, weights = resolve_recipe(text, overrides=overrides, registry=registry)
        if weights is None:
            raise GptzooError(
                f"recipe {recipe.name!r} has no [weights]: its random weights have nothing to evaluate; give a "
                "checkpoint or run directory (`gptzoo train`), a Hugging Face directory or a fetchable name"
            )
        return load_model(recipe, registry=registry, device=device, dtype=dtype)
    return load_model(hf=text, overrides=overrides, registry=registry, device=device, dtype=dtype)


def _finetuned(
    run: Path, *, registry: Registry | None, device: torch.device | str | None, dtype: str | torch.dtype | None
) -> Loaded:
    """A `gptzoo finetune` run as a model: the base its adapter.json names, with RUN/adapter (as ``--adapter``
    attaches it)."""
    spec = read_spec(run)
    assert spec is not None
    if not (run / ADAPTER).is_dir():
        raise GptzooError(f"fine-tuning run {run} has no {ADAPTER}/ yet: it is written when the run ends; resume it")
    base = load_any(spec.base, registry=registry, device=device)
    return with_precision(with_adapter(base, run / ADAPTER, registry), dtype, registry)


def build(
    recipe: str | Path | Recipe | None = None,
    *,
    hf: str | Path | None = None,
    overrides: Sequence[str] = (),
    batch: int = 1,
    seq_len: int | None = None,
    out: str | Path | None = None,
    registry: Registry | None = None,
) -> dict[str, Any]:
    """``gptzoo build``: what the model is made of and what it costs at (batch, seq_len), as a
    JSON-ready dict (gptzoo.model.summary), from a structure built on the meta device; a recipe's own
    [weights] stay unread. With ``out``, also a checkpoint there (its "checkpoint" key): freshly
    initialized, or with ``hf``'s weights (and its tokenizer files, when the recipe's tokenizer is
    that checkpoint's own); ``out`` is checked before any weight is allocated.
    """
    registry = registry if registry is not None else default_registry()
    if out is not None:
        check_new_directory(out)
        check_utf8_path(out)
    loaded = load_model(recipe, hf=hf, overrides=overrides, registry=registry, device="meta")
    summary = summarize(
        loaded.model, loaded.recipe, resolve_components(loaded.recipe, registry), batch=batch, seq_len=seq_len
    )
    summary["recipe"]["overrides"] = list(overrides)
    if hf is not None:
        summary["hf"] = str(hf)
    if out is not None:
        try:  # initializing a large model's weights takes a while
            real = load_model(loaded.recipe, hf=hf, registry=registry, recipe_weights=False)
        except KeyboardInterrupt:
            raise Interrupted(f"nothing was written to {out}") from None
        uses_hf = loaded.recipe.tokenizer is None or loaded.recipe.tokenizer.name == "hf"
        saved = save_checkpoint(real.model, loaded.recipe, out, tokenizer_from=real.hf_dir if uses_hf else None)
        summary["checkpoint"] = str(saved)
    return summary
