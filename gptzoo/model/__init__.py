"""The model room: the GPT module (gpt), its assembly from a recipe (build), what it costs
(summary) and its files on disk (checkpoint)."""

from gptzoo.model.gpt import GPT

__all__ = ["GPT"]
