"""Hugging Face interop: read GPT-2, Llama, Gemma 2 and 3, Qwen2 and 3, Mistral, GPT-NeoX, Phi-3,
OLMo 2, the mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, gpt-oss) and DeepSeek-V2/V3
checkpoints into gptzoo models, derive their recipes from config.json, and export gptzoo models back.
The conversion is convert.py; this package's face hands on its names.
"""

from gptzoo.hf.convert import FAMILIES as FAMILIES
from gptzoo.hf.convert import check_recipe_matches as check_recipe_matches
from gptzoo.hf.convert import equivalent as equivalent
from gptzoo.hf.convert import export_hf as export_hf
from gptzoo.hf.convert import family_for as family_for
from gptzoo.hf.convert import hf_recipe as hf_recipe
from gptzoo.hf.convert import load_hf as load_hf
from gptzoo.hf.family import NoEquivalentError as NoEquivalentError
from gptzoo.hf.files import locate as locate
