"""Defaults and limits that modules importing torch use and the command line shows or checks while it
parses: kept here, apart from those modules, so that parsing a command line imports neither torch nor
transformers."""

MAX_DIM = 2**31 - 1
"""The largest value of any [model] dimension (an int32 index), and of [generate] max_new_tokens (and so
of the command line's counts: --batch, --seq-len, --max-new-tokens)."""
SEED_LIMIT = 2**64
"""Seeds run from 0 to SEED_LIMIT - 1: what ``torch.Generator.manual_seed`` takes."""
DTYPE_NAMES = ("float32", "bfloat16")
"""The dtypes a model runs in for ``compare`` and ``generate`` (--dtype), and that ``build`` sizes its
weights and KV cache in (gptzoo.model.summary.DTYPES)."""
GENERATE_DTYPES = (*DTYPE_NAMES, "int8")
"""What ``generate --dtype`` takes: int8 is weight-only int8 (gptzoo.inference.quantize) on float32."""
TOKENIZER_NAMES = ("gpt2", "hf", "bytes")
"""The names a recipe's ``[tokenizer] name`` may take (gptzoo.tokenizer builds them)."""
DEFAULT_PROMPT = "The history of the Roman Empire began"
"""What ``compare`` runs without a prompt."""
