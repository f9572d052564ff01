"""The ``gptzoo`` command: rich tables for people, ``--json`` for machines.

Each command is a module of this package (``build``, ``generate``, ``eval``, ...) with its
``add_parser(sub, common)`` and its ``run(args, out, err)``: it parses its flags, calls the library and
renders the result. ``app`` holds ``main``; ``args`` the argument types and shared parsers; ``model``
how a command that takes a model reads MODEL, ``--hf`` and ``--checkpoint``; ``console``, ``render`` and
``library`` what every command writes with, how values appear in messages, and how a command reaches the
library; ``torchrun`` which process of a launch reports.

User errors (and usage errors) print one message on stderr and exit with status 2; Ctrl-C prints
``interrupted`` (and what was kept) and exits with status 130; ``--debug`` also prints the traceback.
With ``--json``, stdout holds one JSON document: the result, or ``{"error": MESSAGE, "exit": STATUS}``
(anything else that writes to stdout meanwhile, a plugin's print say, goes to stderr). Anything else is
a bug and keeps its traceback (status 1).

Parsing imports nothing heavy: each command imports the library modules it calls (torch, transformers)
when it runs, so ``--help``, ``recipes``, ``list`` and ``plugins`` import neither (nor tiktoken, nor but
for ``list`` the recipe validator).
"""

from gptzoo.cli.app import main

__all__ = ["main"]
