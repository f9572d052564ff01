"""lm-evaluation-harness's model for any gptzoo model: ``gptzoo eval MODEL --tasks ...``, or
``lm_eval --model gptzoo --model_args pretrained=MODEL`` once this module is imported.

:class:`GptzooLM` is the harness's own ``hf`` model (``HFLM``) with gptzoo's model in place of
transformers': the harness tokenizes, splits context from continuation, batches, windows rolling
log-likelihoods and cuts generations at their stop strings exactly as it does for ``hf``, and gptzoo
computes the logits (``_model_call``) and the generations (``_model_generate``, through
gptzoo.inference.generate, so with the native CPU decoding step). What HFLM asks of a transformers
model (``device``, ``config``, a call that returns ``.logits``) is :class:`Forward`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch
import transformers
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from gptzoo.errors import GptzooError
from gptzoo.evaluation.tasks import Tasks
from gptzoo.inference.generate import generate_text
from gptzoo.inference.sampling import SamplerChain, chain_spec
from gptzoo.loader import Loaded, load_any
from gptzoo.model.gpt import GPT
from gptzoo.registry import Registry, get_registry
from gptzoo.tokenizer import HFTokenizer, Tokenizer, gpt2_transformers_tokenizer


class Forward:
    """A gptzoo model as HFLM calls a transformers one: ``model(input_ids).logits``."""

    def __init__(self, model: GPT, context: int) -> None:
        self.gpt = model
        self.device = model.wte.weight.device
        self.dtype = model.wte.weight.dtype
        self.config = transformers.PretrainedConfig(max_position_embeddings=context)

    def __call__(self, input_ids: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.gpt(input_ids))

    def parameters(self) -> Any:
        return self.gpt.parameters()


def hf_tokenizer(tokenizer: Tokenizer) -> Any:
    """The transformers tokenizer the harness tokenizes with: the model's own, or GPT-2's built from the
    same BPE files tiktoken reads.

    Raises:
        GptzooError: a tokenizer transformers has no counterpart of (bytes).
    """
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer.tokenizer
    if tokenizer.name == "gpt2":
        return gpt2_transformers_tokenizer()
    raise GptzooError(
        f"lm-evaluation-harness tokenizes with a transformers tokenizer, and the {tokenizer.name} tokenizer has "
        "none; evaluate a model with a Hugging Face or GPT-2 tokenizer"
    )


@register_model("gptzoo")
class GptzooLM(HFLM):
    """The harness's ``hf`` model computing with a gptzoo model (any MODEL ``gptzoo`` commands take)."""

    def __init__(
        self,
        pretrained: str | Loaded,
        *,
        batch_size: int | str = 1,
        max_length: int | None = None,
        registry: Registry | None = None,
        **kwargs: Any,
    ) -> None:
        """pretrained: a MODEL name (``gptzoo.loader.load_any``) or a model already loaded."""
        loaded = load_any(pretrained) if isinstance(pretrained, str) else pretrained
        model = loaded.model.eval()
        self.gpt = model
        self.gptzoo_tokenizer = loaded.tokenizer()
        self.registry = registry or get_registry()
        context = model.context_length or model.max_positions or 2048
        quiet = logging.getLogger("lm_eval.models.huggingface")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # its warnings that a model object ignores HF loading options
        try:
            super().__init__(
                pretrained=Forward(model, context),
                backend="causal",
                tokenizer=hf_tokenizer(self.gptzoo_tokenizer),
                batch_size=batch_size,
                max_length=max_length,
                **kwargs,
            )
        finally:
            quiet.setLevel(level)

    def _model_generate(
        self, context: torch.Tensor, max_length: int, stop: Sequence[str], **generation_kwargs: Any
    ) -> torch.Tensor:
        """The contexts (B, T), left-padded, followed by their new tokens (then padding), as transformers'
        ``generate`` returns them: greedy unless ``do_sample`` or a temperature above 0 asks to sample."""
        mask = generation_kwargs.pop("attention_mask", None)
        rows = context.tolist() if mask is None else [r[m.bool()].tolist() for r, m in zip(context, mask, strict=True)]
        temperature = float(generation_kwargs.get("temperature") or 0.0)
        sampler = None
        if generation_kwargs.get("do_sample") or temperature > 0:
            flags = {"temperature": temperature or 1.0, "top_p": generation_kwargs.get("top_p")}
            flags["top_k"] = generation_kwargs.get("top_k")
            spec = chain_spec([], flags, registry=self.registry)
            sampler = SamplerChain.from_registry(self.registry, spec)
        width = context.shape[1]
        results, _ = generate_text(
            self.gpt, self.gptzoo_tokenizer, rows, max_length - width, sampler=sampler, stop=stop
        )
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        out = torch.full((len(rows), max_length), pad, dtype=context.dtype, device=context.device)
        out[:, :width] = context
        for i, result in enumerate(results):
            out[i, width : width + len(result.tokens)] = torch.tensor(result.tokens, dtype=context.dtype)
        return out


def run_tasks(
    loaded: Loaded,
    tasks: Tasks,
    *,
    limit: int | None = None,
    batch_size: int = 1,
    registry: Registry | None = None,
    log_samples: bool = False,
) -> dict[str, Any]:
    """The harness's ``simple_evaluate`` of ``tasks`` (built and checked by
    :func:`gptzoo.evaluation.tasks.check_tasks`, with its ``num_fewshot``) with :class:`GptzooLM` over the
    loaded model."""
    from lm_eval import simple_evaluate

    model = GptzooLM(loaded, batch_size=batch_size, registry=registry)
    results = simple_evaluate(
        model=model,
        tasks=tasks.built,
        limit=limit,
        task_manager=tasks.manager,
        log_samples=log_samples,
    )
    if results is None:
        raise GptzooError("lm-evaluation-harness returned no results")
    return results


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The harness's results without its samples and configs: what ``--json`` prints."""
    keys = ("results", "groups", "versions", "n-shot", "higher_is_better", "n-samples")
    return json.loads(json.dumps({k: results[k] for k in keys if k in results}, default=str))


def table(results: dict[str, Any]) -> str:
    """The harness's own table of the results (and of its groups, where a task is a group)."""
    from lm_eval.utils import make_table

    text = make_table(results)
    if results.get("groups"):
        text += "\n" + make_table(results, "groups")
    return text
