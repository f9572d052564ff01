"""Hugging Face interop: read GPT-2, Llama, Gemma 2 and 3, Qwen2 and 3, Mistral, GPT-NeoX, Phi-3,
OLMo 2, the mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, gpt-oss), DeepSeek-V2/V3, and the
hybrids of a recurrent or convolutional token mixer and attention (LFM2, Qwen3.5, Qwen3-Next, OLMo Hybrid,
Granite 4.0-H, Kimi Linear) and SmolLM3 checkpoints into gptzoo models, derive their recipes from config.json,
and export gptzoo models back.
The conversion is convert.py; this package's face hands on its names, importing them when first asked
for (PEP 562), so that the plugin manager's load of gptzoo.hf.hooks imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "FAMILIES": "gptzoo.hf.convert",
    "check_recipe_matches": "gptzoo.hf.convert",
    "equivalent": "gptzoo.hf.convert",
    "export_hf": "gptzoo.hf.convert",
    "family_for": "gptzoo.hf.convert",
    "hf_recipe": "gptzoo.hf.convert",
    "load_hf": "gptzoo.hf.convert",
    "NoEquivalentError": "gptzoo.hf.family",
    "locate": "gptzoo.hf.files",
}
__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
