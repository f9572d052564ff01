"""``gptzoo prepare``: a corpus tokenized into train.bin / val.bin / meta.json."""

from __future__ import annotations

import argparse

from rich.table import Table

from gptzoo.cli.args import Parser, Subparsers, finite_float
from gptzoo.cli.console import Console, print_json
from gptzoo.cli.library import importing
from gptzoo.cli.render import text
from gptzoo.fetch import FETCHABLE
from gptzoo.tables import WholeWords
from gptzoo.training.corpora import CORPORA, DEFAULT_VAL_FRACTION, NAMED_TOKENIZERS


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser(
        "prepare", parents=[common], help="tokenize a corpus into train.bin / val.bin / meta.json for training"
    )
    p.add_argument(
        "source",
        help="a text file, a directory of *.txt / *.md files (recursively), or a corpus: "
        + "; ".join(f"{k}: {v}" for k, v in sorted(CORPORA.items())),
    )
    p.add_argument(
        "--out", required=True, metavar="DIR", help="a new (or empty) directory for train.bin, val.bin and meta.json"
    )
    p.add_argument(
        "--tokenizer",
        default="gpt2",
        metavar="NAME|DIR",
        help=f"{', '.join(NAMED_TOKENIZERS)} (default: gpt2), a Hugging Face tokenizer directory, "
        f"or a name `gptzoo fetch` knows ({', '.join(FETCHABLE)})",
    )
    p.add_argument(
        "--val-fraction",
        type=finite_float,
        default=DEFAULT_VAL_FRACTION,
        metavar="F",
        help=f"the last F of the tokens become val.bin, 0 < F <= 0.5 (default: {DEFAULT_VAL_FRACTION})",
    )
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    with importing():
        from gptzoo.training.data import prepare

    meta = prepare(
        args.source,
        args.out,
        tokenizer=args.tokenizer,
        val_fraction=args.val_fraction,
        log=(lambda msg: err.print(text(msg))) if not args.json else None,
    )
    if args.json:
        print_json(out, meta)
        return
    source, tokenizer = meta["source"], meta["tokenizer"]
    total = meta["train_tokens"] + meta["val_tokens"]
    table = Table(title=f"{text(args.source)} prepared in {text(meta['out'])}", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in (
        ("read", text(source["read"])),
        ("text", f"{source['documents']:,} documents, {source['bytes']:,} bytes, sha256 {source['sha256'][:16]}…"),
        (
            "tokenizer",
            text(tokenizer["name"] + (f" ({tokenizer['directory']})" if "directory" in tokenizer else ""))
            + f", vocab {meta['vocab_size']:,}",
        ),
        ("tokens", f"{total:,} ({source['bytes'] / total:.2f} bytes per token), stored as {meta['dtype']}"),
        ("train.bin", f"{meta['train_tokens']:,} tokens"),
        ("val.bin", f"{meta['val_tokens']:,} tokens (the last {meta['val_fraction']:g} of the stream)"),
        ("time", f"{meta['seconds']:.1f} s ({total / max(meta['seconds'], 1e-9):,.0f} tokens/s)"),
    ):
        table.add_row(key, value)
    out.print(WholeWords(table))
