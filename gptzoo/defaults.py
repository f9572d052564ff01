"""Defaults and limits that modules importing torch use and the command line shows or checks while it
parses: kept here, apart from those modules, so that parsing a command line imports neither torch nor
transformers."""

from dataclasses import dataclass

from gptzoo.errors import GptzooError

MAX_DIM = 2**31 - 1
"""The largest value of any [model] dimension (an int32 index), and of [generate] max_new_tokens (and so
of the command line's counts: --batch, --seq-len, --max-new-tokens)."""
SEED_LIMIT = 2**64
"""Seeds run from 0 to SEED_LIMIT - 1: what ``torch.Generator.manual_seed`` takes."""


@dataclass(frozen=True)
class Precision:
    """A precision a model runs in (``dtype=`` of gptzoo.load_model, ``--dtype``): the dtype of its
    weights, activations and KV cache, and whether its Linear layers hold quantized weights."""

    name: str
    dtype: str
    """The torch dtype, by name."""
    quantized: bool = False
    """Every plain nn.Linear becomes the module gptzoo.inference.quantize.QUANTIZED has for this precision's
    name (int8: an Int8Linear, int4: an Int4Linear); the rest stays in ``dtype``."""


PRECISIONS = {
    p.name: p
    for p in (
        Precision("float32", "float32"),
        Precision("bfloat16", "bfloat16"),
        Precision("int8", "float32", quantized=True),
        Precision("int4", "float32", quantized=True),
    )
}
"""Every precision by name; ``generate --dtype`` and ``eval --dtype`` take each."""
DTYPE_NAMES = tuple(name for name, p in PRECISIONS.items() if not p.quantized)
"""The precisions that are plain dtypes: what ``compare --dtype`` takes (transformers runs them too) and
``build`` sizes weights and KV cache in (gptzoo.model.summary.DTYPES)."""


def precision(value: object) -> Precision:
    """The precision ``value`` names: a name of PRECISIONS or a torch dtype of one (torch.bfloat16).

    Raises:
        GptzooError: any other value, listing the names.
    """
    name = value if isinstance(value, str) else str(value).removeprefix("torch.")
    found = PRECISIONS.get(name)
    if found is None:
        *most, last = PRECISIONS
        raise GptzooError(f"dtype {value!r} is not a precision gptzoo runs models in; give {', '.join(most)} or {last}")
    return found


TOKENIZER_NAMES = ("gpt2", "hf", "bytes")
"""The names a recipe's ``[tokenizer] name`` may take (gptzoo.tokenizer builds them)."""
DEFAULT_PROMPT = "The history of the Roman Empire began"
"""What ``compare`` runs without a prompt."""
