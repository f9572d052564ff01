"""The tokenizer a recipe names: its ``[tokenizer]`` section, or the Hugging Face checkpoint's own."""

from __future__ import annotations

from pathlib import Path

from gptzoo.errors import GptzooError
from gptzoo.recipe.schema import Recipe
from gptzoo.tokenizer import GPT2_N_VOCAB, ByteTokenizer, Tokenizer, load_tokenizer


def recipe_tokenizer(recipe: Recipe, hf_dir: str | Path | None = None) -> Tokenizer:
    """The tokenizer of ``recipe``'s ``[tokenizer]`` (none: the Hugging Face checkpoint's own, ``"hf"``).

    Raises:
        GptzooError: as :func:`load_tokenizer`; for ``"hf"`` without ``hf_dir`` (a recipe built or
            trained from scratch, a gptzoo checkpoint) the message names the recipe and the fix.
    """
    name = recipe.tokenizer.name if recipe.tokenizer is not None else "hf"
    if name == "hf" and hf_dir is None:
        section = '[tokenizer] name = "hf"' if recipe.tokenizer is not None else 'no [tokenizer] (so "hf")'
        vocab = recipe.model.vocab_size
        fits = [n for n, size in (("bytes", ByteTokenizer.vocab_size), ("gpt2", GPT2_N_VOCAB)) if size <= vocab]
        fix = (
            f"or choose an offline tokenizer that its vocab_size {vocab} covers: --set tokenizer.name={fits[0]}, or "
            f'[tokenizer] name = "{fits[0]}" in a checkpoint\'s recipe.toml'
            if fits
            else f"(no offline tokenizer fits its vocab_size {vocab})"
        )
        raise GptzooError(
            f"recipe {recipe.name!r} has {section}, the tokenizer that comes with Hugging Face weights, and this "
            f"model has none; generate from the Hugging Face checkpoint (--hf DIR) {fix}"
        )
    return load_tokenizer(name, hf_dir=hf_dir)
