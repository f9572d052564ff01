"""Fine-tuning with low-rank adapters: a model's projections adapted (gptzoo.adapters.lora) and trained by
gptzoo's trainer on a frozen base, written in peft's format (gptzoo.adapters.peft_format).

    RUN/adapter.json      what the run adapts: the base model, the targets, rank, alpha, dropout, DoRA, rsLoRA
    RUN/adapter/          the trained adapter in peft's format, written at the end of the run
    RUN/...               what `gptzoo train` writes: recipe.toml, metrics.jsonl, checkpoints/ (adapters only)

The base's weights are not saved: a checkpoint holds the adapter tensors and their optimizer state, and a
resumed run loads the base from where adapter.json says it came. A text or JSON Lines file given as data
is tokenized once with the base's tokenizer into the cache ($GPTZOO_CACHE/finetune-data/SHA), keyed by
the file's contents and the tokenizer's vocabulary, so resuming finds it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from gptzoo.adapters.lora import LoRASpec, attach
from gptzoo.adapters.peft_format import peft_files, save_peft
from gptzoo.adapters.run import ADAPTER, SPEC, FinetuneSpec, read_spec
from gptzoo.adapters.targets import Part, default_targets, model_parts, offered, select
from gptzoo.errors import CheckpointError, GptzooError
from gptzoo.loader import Loaded, load_any
from gptzoo.model.checkpoint import read_recipe
from gptzoo.recipe import Recipe, override_recipe
from gptzoo.registry import Registry
from gptzoo.training import run_dir

TRAIN_DEFAULTS = (
    "train.lr=0.0002",
    "train.min_lr=0.00002",
    "train.warmup_steps=10",
    "train.weight_decay=0.0",
    "train.max_steps=100",
    "train.micro_batch_size=4",
    "train.eval_every=50",
    "train.eval_batches=8",
)
"""Fine-tuning's [train] settings before --set: LoRA's usual learning rate (peft's and litgpt's examples), no
weight decay, a short schedule. The sequence length is the model's context, capped at MAX_SEQ_LEN."""
MAX_SEQ_LEN = 512


def check_lora(spec: LoRASpec, parts: Sequence[Part], model: torch.nn.Module) -> None:
    """A rank of at least 1 and at most every adapted projection's smaller side, alpha > 0, dropout in [0, 1)."""
    problems = []
    if spec.rank < 1:
        problems.append(f"--lora-rank {spec.rank} must be at least 1")
    else:
        for part in parts:
            linear = model.get_submodule(part.linear)
            side = min(linear.in_features, part.stop - part.start)
            if spec.rank > side:
                problems.append(
                    f"--lora-rank {spec.rank} is above {part.target}'s size ({part.stop - part.start} x "
                    f"{linear.in_features}): a rank of at most {side} fits it"
                )
                break
    if not spec.alpha > 0:
        problems.append(f"--lora-alpha {spec.alpha} must be above 0")
    if not 0 <= spec.dropout < 1:
        problems.append(f"--lora-dropout {spec.dropout} must be in [0, 1)")
    if problems:
        raise GptzooError("; ".join(problems))


def targets_table(model: torch.nn.Module, registry: Registry | None) -> dict[str, list[Part]]:
    """What the model offers: target name -> its parts (gptzoo.adapters.targets)."""
    return offered(model_parts(model, registry))


def tokenizer_source(loaded: Loaded) -> str:
    """What `gptzoo prepare --tokenizer` takes for the model's tokenizer: its name, or its directory."""
    name = loaded.recipe.tokenizer.name if loaded.recipe.tokenizer is not None else "hf"
    if name != "hf":
        return name
    if loaded.hf_dir is None:
        raise GptzooError(
            f"{loaded.source} has no tokenizer files to prepare text with; give --data a directory `gptzoo prepare` "
            "made with the model's tokenizer"
        )
    return str(loaded.hf_dir)


def data_dir(data: str, loaded: Loaded, say: Callable[[str], None]) -> Path:
    """A prepared directory as it is; a text or JSON Lines file tokenized (once) into the cache."""
    from gptzoo.fetch import cache_root
    from gptzoo.training.data import META, prepare, resolve_tokenizer, vocab_sha256

    path = Path(data).expanduser()
    if not str(data):
        raise GptzooError("--data is empty; give a text or JSON Lines file, or a `gptzoo prepare` directory")
    if path.is_dir() and (path / META).is_file():
        return path.resolve()
    if not path.is_file():
        raise GptzooError(
            f"--data {data}: no such file; give a text (.txt, .md) or JSON Lines (.jsonl) file, or a directory "
            "`gptzoo prepare` made"
        )
    tokenizer = tokenizer_source(loaded)
    tok, _ = resolve_tokenizer(tokenizer, say)
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    digest.update(path.suffix.encode() + b"\0" + vocab_sha256(tok).encode())
    out = cache_root() / "finetune-data" / digest.hexdigest()[:32]
    if not (out / META).is_file():
        say(f"tokenizing {path} into {out}")
        prepare(str(path), out, tokenizer=tokenizer)
    return out


def finetune_recipe(recipe: Recipe, overrides: Sequence[str], registry: Registry | None) -> Recipe:
    """The base's recipe with fine-tuning's [train] defaults, then ``overrides`` (train.* keys only: the
    model is the base's)."""
    wrong = [o for o in overrides if not o.strip().startswith("train.")]
    if wrong:
        raise GptzooError(
            f"--set {wrong[0]}: fine-tuning sets [train] keys only (train.max_steps=30, train.lr=1e-4...); the model "
            "is the base's"
        )
    seq_len = f"train.seq_len={min(recipe.model.context_length, MAX_SEQ_LEN)}"
    return override_recipe(recipe, [*TRAIN_DEFAULTS, seq_len, *overrides], registry=registry)


def where(model: str) -> str:
    """MODEL as adapter.json keeps it: a directory as its absolute path (the run is then resumed, and used as a
    MODEL, from any working directory), a name as given."""
    return str(Path(model).resolve()) if Path(model).exists() else model


def check_same(saved: FinetuneSpec, asked: FinetuneSpec, run: Path) -> None:
    """A resumed run asks for what it trained: the same base (the same directory, however it is written) and
    adapters."""
    changed = [
        f"{f.name} {getattr(saved, f.name)!r} there, {getattr(asked, f.name)!r} here"
        for f in fields(FinetuneSpec)
        if getattr(saved, f.name) != getattr(asked, f.name)
        and not (f.name == "base" and where(saved.base) == where(asked.base))
    ]
    if changed:
        raise CheckpointError(
            f"{run} fine-tunes other adapters: {'; '.join(changed)}; resume with the run's own settings "
            f"({run / SPEC}) or start a new --out"
        )


def write_adapter(model: torch.nn.Module, run: Path, base: str, registry: Registry | None) -> Path:
    """RUN/adapter in peft's format, replacing the one an earlier part of the run wrote only once complete."""
    final = run / ADAPTER
    fresh = run / ".adapter-new"
    shutil.rmtree(fresh, ignore_errors=True)
    save_peft(model, fresh, base=base, registry=registry)  # type: ignore[arg-type]
    if final.exists():
        old = run / ".adapter-old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(fresh, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(fresh, final)
    return final


def base_name(model: str, loaded: Loaded) -> str:
    """base_model_name_or_path: the Hugging Face directory the weights came from, else the MODEL given (a
    directory as an absolute path)."""
    if loaded.hf_dir is not None and loaded.checkpoint is None:
        return str(loaded.hf_dir.resolve())
    return str(Path(model).resolve()) if Path(model).exists() else model


def load_for_finetune(model: str, registry: Registry | None) -> Loaded:
    loaded = load_any(model, registry=registry)
    if loaded.model.recipe is None:
        loaded.model.recipe = loaded.recipe
    return loaded


def finetune(
    model: str,
    *,
    data: str | None,
    out: Path,
    targets: Sequence[str] | None,
    lora: LoRASpec,
    overrides: Sequence[str] = (),
    resume: bool = False,
    registry: Registry | None = None,
    say: Callable[[str], None] = lambda _: None,
    **hooks: Any,
) -> dict[str, Any]:
    """Train adapters of ``model`` (any MODEL) on ``data`` into the run directory ``out``; the run's summary.
    ``hooks`` go to gptzoo.training.trainer.train (log, started, stepped, planned, timed)."""
    from gptzoo.training.trainer import seq_len_of, train

    if not str(out):
        raise GptzooError("--out is empty; give the run directory")
    saved = read_spec(out) if resume else None
    if resume and saved is None:
        raise GptzooError(f"{out} is not a fine-tuning run ({SPEC} is missing); resume it with `gptzoo train --resume`")
    loaded = load_for_finetune(model, registry)
    table = targets_table(loaded.model, registry)
    chosen = select(table, targets) if targets else default_targets(table)
    parts = [p for name in chosen for p in table[name]]
    check_lora(lora, parts, loaded.model)
    spec = FinetuneSpec(where(model), tuple(chosen), lora.rank, lora.alpha, lora.dropout, lora.dora, lora.rslora)
    if saved is not None:
        check_same(saved, spec, out)
    if data is None and not resume:
        raise GptzooError("--data is needed: a text or JSON Lines file, or a `gptzoo prepare` directory")
    recipe = finetune_recipe(loaded.recipe, overrides, registry)
    if data is None:
        recipe = override_recipe(recipe, [f"train.data={json.dumps(read_recipe(out, registry=registry).train.data)}"])
    torch.manual_seed(recipe.train.seed)  # the adapters' A: the same draw in every run of these settings
    attach(loaded.model, parts, lora)
    try:  # the run ends by writing its adapter in peft's format: a model it cannot describe is refused now
        peft_files(loaded.model, base=base_name(model, loaded), registry=registry)  # type: ignore[arg-type]
    except GptzooError as exc:
        raise GptzooError(
            f"{model}'s adapters cannot be written in peft's format, which a fine-tune ends by writing: {exc}; "
            "fine-tune a model with a Hugging Face equivalent"
        ) from None
    prepared = data_dir(data, loaded, say) if data is not None else None  # resumed: the run's own (recipe.toml)
    total = sum(p.numel() for p in loaded.model.parameters())
    trainable = sum(p.numel() for p in loaded.model.parameters() if p.requires_grad)
    started = hooks.pop("started", None)

    def begin(step: int) -> None:
        run_dir.write_text_atomically(out / SPEC, json.dumps(spec.as_json(), indent=2) + "\n")
        if started is not None:
            started(step)
        if step == 0:  # the validation of the starting weights comes first, and a large model takes a while
            t = recipe.train
            say(
                f"step 0: the validation loss of the starting weights, {t.eval_batches} batches of "
                f"{t.micro_batch_size} x {seq_len_of(recipe)} tokens..."
            )

    try:
        result = train(
            recipe,
            out=out,
            data=prepared,
            resume=resume,
            init=loaded.model,
            hf_dir=loaded.hf_dir,
            registry=registry,
            started=begin,
            evaluate_first=True,
            **hooks,
        )
    except BaseException:  # Ctrl-C too: a new run without a checkpoint leaves nothing (train removed its own files)
        if not resume and run_dir.latest(out) is None:
            (out / SPEC).unlink(missing_ok=True)
        raise
    adapter = write_adapter(loaded.model, out, base_name(model, loaded), registry)
    records = run_dir.read_metrics(out)
    first = next((r["val_loss"] for r in records if r.get("step") == 0 and r.get("val_loss") is not None), None)
    return {
        **result.summary(out),
        "adapter": str(adapter),
        "val_loss_before": first,
        "targets": list(chosen),
        "trainable_parameters": trainable,
        "total_parameters": total,
        "optimizer_bytes": 8 * trainable,  # AdamW's two float32 moments
    }
