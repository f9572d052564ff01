"""Parity with Hugging Face: the same checkpoint through transformers and through gptzoo, on the
same tokens. Reports max and mean |delta logits|, top-1 agreement, KL(HF || gptzoo) and whether
greedy continuations agree token for token."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from gptzoo.defaults import DEFAULT_PROMPT
from gptzoo.errors import CheckpointError
from gptzoo.hf.convert import load_hf
from gptzoo.hf.files import Checkpoint, open_checkpoint
from gptzoo.inference.generate import check_lengths, check_prompts, encode_prompts, generate
from gptzoo.model.gpt import GPT
from gptzoo.recipe import Recipe, recipe_tokenizer
from gptzoo.registry import Registry
from gptzoo.untrusted import check_directory


class SideAdapter(Protocol):
    """What :func:`compare` puts on both sides before it runs them (a LoRA adapter)."""

    def gptzoo(self, model: GPT, registry: Registry | None) -> GPT:
        """gptzoo's side (float32) with it, as gptzoo loads it."""
        ...

    def transformers(self, model: Any) -> Any:
        """transformers' side with it, as its reference library loads it."""
        ...


def hf_config(path: Path) -> Any:
    """config.json as transformers reads it (it validates fields gptzoo does not read).

    Raises:
        CheckpointError: transformers refuses config.json, with its reason.
    """
    from transformers import AutoConfig

    check_directory(path)  # transformers opens files by name: none may lead outside the checkpoint
    try:
        return AutoConfig.from_pretrained(path)
    except Exception as exc:  # transformers raises many kinds (validation, key, type errors) for one file
        raise CheckpointError(
            f"transformers refuses {path}/config.json: {type(exc).__name__}: {' '.join(str(exc).split())} (compare "
            "runs the checkpoint in transformers as well: fix config.json, or run it with gptzoo alone, e.g. "
            "gptzoo generate --hf)"
        ) from None


def hf_model(path: Path, dtype: torch.dtype) -> Any:
    """The checkpoint through transformers, as it is (no quantization, which gptzoo has refused by
    now), with transformers' own attention kernel whatever config.json's _attn_implementation asks.

    Raises:
        CheckpointError: transformers cannot load it (it validates config.json more strictly than
            gptzoo, which reads only the fields that decide the model).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    check_directory(path)  # transformers opens files by name: none may lead outside the checkpoint
    try:
        config = AutoConfig.from_pretrained(path)
        model_class = AutoModelForCausalLM._model_mapping[type(config)]
        # config.json's own kernel wins over from_pretrained(attn_implementation=); Gemma 2 has no sdpa
        config._attn_implementation = "sdpa" if getattr(model_class, "_supports_sdpa", True) else "eager"
        return AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype).eval()
    except Exception as exc:  # transformers raises many kinds (validation, import, type errors) for one file
        raise CheckpointError(
            f"transformers cannot load {path}: {type(exc).__name__}: {' '.join(str(exc).split())} (compare loads "
            "it with transformers as well: fix the checkpoint, or run it with gptzoo alone, e.g. gptzoo generate --hf)"
        ) from None


@torch.no_grad()
def hf_greedy(model: Any, input_ids: Tensor, max_new_tokens: int) -> Tensor:
    """Greedy decoding through a transformers model with its own KV cache (no EOS stop)."""
    # transformers renamed past_key_values to cache in 5.x
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids, use_cache=True)
    new = []
    for step in range(max_new_tokens):
        nxt = out.logits[:, -1].float().argmax(dim=-1)
        new.append(nxt)
        if step + 1 < max_new_tokens:
            out = model(nxt[:, None], use_cache=True, **{name: getattr(out, name)})
    return torch.stack(new, dim=1)


def logit_stats(ours: Tensor, theirs: Tensor) -> dict[str, float]:
    """ours and theirs (T, V) -> how far apart they are."""
    ours, theirs = ours.float(), theirs.float()
    diff = (ours - theirs).abs()
    log_p, log_q = F.log_softmax(theirs, dim=-1), F.log_softmax(ours, dim=-1)
    return {
        "max_abs_diff": diff.max().item(),
        "mean_abs_diff": diff.mean().item(),
        "top1_agreement": (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item(),
        "kl_hf_gptzoo": (log_p.exp() * (log_p - log_q)).sum(-1).clamp(min=0).mean().item(),  # >= 0 up to rounding
    }


@torch.no_grad()
def compare(
    source: str | Path | Checkpoint,
    recipe: Recipe | None = None,
    *,
    prompts: Sequence[str | Sequence[int]] = (DEFAULT_PROMPT,),
    dtype: torch.dtype = torch.float32,
    new_tokens: int = 32,
    chat: bool = False,
    registry: Registry | None = None,
    adapter: SideAdapter | None = None,
) -> dict[str, Any]:
    """Run transformers and gptzoo on the same checkpoint and prompts (text, or token ids); ``registry``
    builds gptzoo's side (default: gptzoo.registry.default_registry()). ``adapter``: what to put on both
    sides first (gptzoo.adapters.peft_format.PeftSides: a LoRA adapter in peft's format, through peft on
    transformers' side and gptzoo's own reading on gptzoo's)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    checkpoint = open_checkpoint(source)
    path = checkpoint.path
    ours = load_hf(checkpoint, recipe, dtype=torch.float32 if adapter else dtype, registry=registry).eval()
    if adapter is not None:
        ours = adapter.gptzoo(ours, registry).to(dtype)
    hf_config(path)  # before the tokenizer, which transformers would load it for, and blame

    texts = [p for p in prompts if isinstance(p, str)]
    tokenizer = recipe_tokenizer(ours.recipe, path) if texts else None
    all_ids = [encode_prompts(tokenizer, [p], chat=chat)[0] if isinstance(p, str) else list(p) for p in prompts]
    check_prompts(ours, all_ids, tokenizer)
    check_lengths(ours, all_ids, new_tokens)
    theirs = hf_model(path, dtype)
    if adapter is not None:
        theirs = adapter.transformers(theirs)
    rows = []
    for prompt, ids in zip(prompts, all_ids, strict=True):
        input_ids = torch.tensor([ids])
        ours_logits, ours_new = ours(input_ids)[0], generate(ours, [ids], new_tokens)[0]
        try:
            theirs_logits = theirs(input_ids).logits[0]
            theirs_new = hf_greedy(theirs, input_ids, new_tokens)[0].tolist()
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # a config transformers loads but cannot run (e.g. a null sliding window)
            raise CheckpointError(
                f"transformers loads {path} but fails to run it: {type(exc).__name__}: {' '.join(str(exc).split())}"
                " (run it with gptzoo alone, e.g. gptzoo generate --hf)"
            ) from None
        stats = logit_stats(ours_logits, theirs_logits)
        row = {
            "prompt": prompt,
            "n_tokens": len(ids),
            **stats,
            "greedy_match": ours_new == theirs_new,
            "gptzoo_tokens": ours_new,
            "hf_tokens": theirs_new,
        }
        if tokenizer is not None:
            row["gptzoo_text"], row["hf_text"] = tokenizer.decode(ours_new), tokenizer.decode(theirs_new)
        rows.append(row)
    n = sum(r["n_tokens"] for r in rows)
    return {
        "source": str(path),
        "recipe": ours.recipe.name,
        "dtype": str(dtype).removeprefix("torch."),
        "new_tokens": new_tokens,
        "max_abs_diff": max(r["max_abs_diff"] for r in rows),
        "mean_abs_diff": sum(r["mean_abs_diff"] * r["n_tokens"] for r in rows) / n,
        "top1_agreement": sum(r["top1_agreement"] * r["n_tokens"] for r in rows) / n,
        "kl_hf_gptzoo": sum(r["kl_hf_gptzoo"] * r["n_tokens"] for r in rows) / n,
        "greedy_match": all(r["greedy_match"] for r in rows),
        "prompts": rows,
    }
