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
    """A precision: the dtype of a model's weights, activations and KV cache, whether its Linear layers
    hold quantized weights, and where gptzoo takes it."""

    name: str
    dtype: str
    """The torch dtype, by name."""
    quantized: bool = False
    """Every plain nn.Linear becomes the module gptzoo.inference.quantize.QUANTIZED has for this precision's
    name (int8: an Int8Linear, int4: an Int4Linear); the rest stays in ``dtype``."""
    runs: bool = True
    """A model runs in it: ``dtype=`` of gptzoo.load_model, ``--dtype`` of generate, eval and serve."""
    trains: bool = False
    """A recipe's ``[train] precision``: the dtype training's autocast runs matmuls in (float16 with a
    GradScaler, on CUDA only)."""
    stored: bool = False
    """Weights gptzoo reads may be held in it (a checkpoint's, Hugging Face's); other dtypes are refused."""


TABLE: tuple[Precision, ...] = (
    Precision("float32", "float32", trains=True, stored=True),
    Precision("bfloat16", "bfloat16", trains=True, stored=True),
    Precision("float16", "float16", runs=False, trains=True, stored=True),
    Precision("int8", "float32", quantized=True),
    Precision("int4", "float32", quantized=True),
)
"""The one table of precisions; every list of dtypes below is read from it."""
BY_NAME = {p.name: p for p in TABLE}
PRECISIONS = {p.name: p for p in TABLE if p.runs}
"""The precisions a model runs in, by name; ``generate --dtype`` and ``eval --dtype`` take each."""
DTYPE_NAMES = tuple(name for name, p in PRECISIONS.items() if not p.quantized)
"""The precisions a model runs in that are plain dtypes: what ``compare --dtype`` takes (transformers runs
them too) and ``build`` sizes weights and KV cache in (gptzoo.model.summary.DTYPES)."""
TRAIN_PRECISIONS = tuple(p.name for p in TABLE if p.trains)
"""What a recipe's ``[train] precision`` may be."""
WEIGHT_DTYPES = tuple(p.name for p in TABLE if p.stored)
"""The dtypes of the weights gptzoo reads (by torch name); float64, float8, float4 and integers are refused."""


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
