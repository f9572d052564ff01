"""``gptzoo train``: a recipe trained on prepared data (also under torchrun)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gptzoo.cli.args import Parser, Subparsers, add_offline, add_set
from gptzoo.cli.console import Console, print_json
from gptzoo.cli.library import command_registry, importing
from gptzoo.cli.render import text
from gptzoo.cli.torchrun import first_process
from gptzoo.errors import GptzooError, Interrupted


def add_parser(sub: Subparsers, common: Parser) -> Parser:
    p = sub.add_parser(
        "train", parents=[common], help="train a recipe on prepared data (also under torchrun: DDP or FSDP2)"
    )
    p.add_argument("recipe", help="a shipped recipe name or a .toml file; its [train] section sets the run")
    add_set(p, "override a recipe key, e.g. train.max_steps=200")
    p.add_argument("--data", metavar="DIR", help="prepared data (`gptzoo prepare`); default: the recipe's train.data")
    p.add_argument(
        "--out", metavar="DIR", help="the run directory: metrics.jsonl and checkpoints (default: runs/RECIPE)"
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
    p.add_argument(
        "--init-from-hf",
        metavar="DIR|NAME",
        help="start from a Hugging Face checkpoint's weights (fine-tuning); it must fit the recipe",
    )
    add_offline(p)
    return p


def run(args: argparse.Namespace, out: Console, err: Console) -> None:
    with importing():
        from gptzoo.adapters.run import SPEC as FINETUNE_SPEC
        from gptzoo.loader import load_model
        from gptzoo.recipe import load_recipe
        from gptzoo.training.display import TrainDisplay, start_line, timed_line
        from gptzoo.training.trainer import train

    try:
        registry = command_registry(err)
        recipe = load_recipe(args.recipe, args.overrides, registry=registry)
        if args.resume and args.init_from_hf:
            raise GptzooError(
                "--resume continues a run from its checkpoint; --init-from-hf starts a new one: give one of them"
            )
        loaded = load_model(recipe, hf=args.init_from_hf, registry=registry) if args.init_from_hf else None
    except KeyboardInterrupt:
        raise Interrupted("before the first step; nothing was written") from None
    run = args.out if args.out is not None else Path("runs") / recipe.name  # an empty --out is refused by train
    if args.resume and (Path(run) / FINETUNE_SPEC).is_file():
        raise GptzooError(
            f"{run} is a fine-tuning run (adapters on a frozen base, {Path(run) / FINETUNE_SPEC}); resume it with "
            f"gptzoo finetune BASE --out {run} --resume"
        )
    main_process = first_process(args)  # under torchrun, only rank 0 reports
    init, hf_dir = (loaded.model, loaded.hf_dir) if loaded is not None else (None, None)
    if args.json or not main_process:
        result = train(recipe, out=run, data=args.data, resume=args.resume, init=init, hf_dir=hf_dir, registry=registry)
    else:
        with TrainDisplay(err, total_steps=recipe.train.max_steps, title=recipe.name) as display:
            result = train(
                recipe,
                out=run,
                data=args.data,
                resume=args.resume,
                init=init,
                hf_dir=hf_dir,
                log=display,
                started=display.start,
                stepped=display.step,
                registry=registry,
                planned=lambda plan: err.print(text(start_line(plan))),
                timed=lambda timing: err.print(text(timed_line(timing))),
            )
    if not main_process:
        return
    summary = result.summary(run)
    if args.json:
        print_json(out, summary)
        return
    val = f", val loss {result.val_loss:.4f}" if result.val_loss is not None else ""
    out.print(f"{result.steps} steps, loss {result.loss:.4f}{val}; checkpoint {text(summary['checkpoint'] or '-')}")
    out.print(
        f"[dim]generate with: gptzoo generate --checkpoint {text(summary['checkpoint'] or '')} --prompt TEXT[/dim]"
    )
