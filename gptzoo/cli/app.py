"""The command line and ``main``: parse, run one command, report every error the same way."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from rich.markup import escape

from gptzoo.cli import (
    build,
    compare,
    export,
    fetch,
    finetune,
    generate,
    new_plugin,
    plot,
    plugins,
    prepare,
    recipes,
    serve,
    sweep,
    train,
)
from gptzoo.cli import eval as eval_
from gptzoo.cli import list as list_
from gptzoo.cli.args import Parser, UsageError
from gptzoo.cli.console import Console, print_json, warn
from gptzoo.cli.generate import unflagged_hint
from gptzoo.cli.library import command_registry
from gptzoo.cli.render import text
from gptzoo.cli.torchrun import TORCHRUN_COMMANDS, env_int, first_process
from gptzoo.errors import GptzooError, GptzooWarning, closest, exception_text, terminal_text
from gptzoo.plugin_manager import gptzoo_version
from gptzoo.registry import Registry

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command whose reader went away


COMMANDS = {
    "build": build,
    "compare": compare,
    "generate": generate,
    "eval": eval_,
    "export": export,
    "fetch": fetch,
    "prepare": prepare,
    "train": train,
    "finetune": finetune,
    "serve": serve,
    "sweep": sweep,
    "plot": plot,
    "plugins": plugins,
    "list": list_,
    "recipes": recipes,
    "new-plugin": new_plugin,
}
"""Each command's module, in the order of ``gptzoo --help``: its ``add_parser(sub, common)`` and its
``run(args, out, err)``."""


def make_parser(registry: Registry | None = None) -> argparse.ArgumentParser:
    """The command line; with a registry, ``generate`` also has the flags of its samplers."""
    common = Parser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    common.add_argument("--json", action="store_true", help="print JSON for machines instead of tables")

    parser = Parser(prog="gptzoo", description="Build, inspect and run GPT-style models assembled from plugins.")
    parser.add_argument("--version", action="version", version=f"gptzoo {gptzoo_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        p = module.add_parser(sub, common)
        if name == "generate" and registry is not None:
            generate.add_sampler_flags(p, registry)
        p.set_defaults(func=module.run)
    return parser


def _fail(args: argparse.Namespace | None, out: Console, err: Console, line: str, message: str, code: int) -> int:
    """Report an error on one stderr line (and as a JSON object on stdout with --json); its exit status."""
    err.print(line, highlight=False)
    if out.json_document and first_process(args):
        print_json(out, {"error": message, "exit": code})
    return code


def _debug(args: argparse.Namespace) -> None:
    """With --debug, the traceback of the exception being handled, its control characters escaped."""
    if args.debug:
        sys.stderr.write(terminal_text(traceback.format_exc(), lines=True))


def _run(args: argparse.Namespace, out: Console, err: Console) -> int | None:
    """The command and its exit status (None: 0); with --json, whatever else writes to sys.stdout
    meanwhile goes to stderr."""
    from gptzoo.fetch import offline_mode

    with offline_mode(getattr(args, "offline", False)):
        if not args.json:
            return args.func(args, out, err)
        stdout, sys.stdout = sys.stdout, sys.stderr
        try:
            return args.func(args, out, err)
        finally:
            sys.stdout = stdout


def _document_stream() -> TextIO:
    """Where --json writes its one document: the real stdout, whose file descriptor 1 now leads to
    stderr for everything else in this process (a plugin's os.write, a subprocess, an atexit
    print). When stdout is no file descriptor (a test's capture), sys.stdout itself."""
    if sys.stdout is not sys.__stdout__:  # a caller's own stream (a test's capture): leave its descriptors be
        return sys.stdout
    try:
        fd = sys.stdout.fileno()
        sys.stdout.flush()
        kept = os.dup(fd)
        os.dup2(sys.stderr.fileno(), fd)
    except (AttributeError, OSError, ValueError):
        return sys.stdout
    return os.fdopen(kept, "w", encoding="utf-8")


def _sane_terminal() -> None:
    """What rich reads from the environment and the streams, made safe: a COLUMNS or LINES that is not a
    positive integer is ignored (COLUMNS=0 would print nothing), and a character the terminal's encoding
    cannot show is written as an escape rather than failing the command."""
    for name in ("COLUMNS", "LINES"):
        value = os.environ.get(name)
        if value is not None and not (value.isdigit() and int(value) > 0):
            del os.environ[name]
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


@contextmanager
def _showing_warnings(err: Console) -> Iterator[None]:
    """While the command runs, each GptzooWarning (a plugin written against an older contract, a name a
    built-in shadows) is one ``warning:`` line on stderr, once per message; other warnings are shown as
    Python shows them."""
    seen: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("always", GptzooWarning)  # once per message is counted here, per command
        python_show = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
            if not issubclass(category, GptzooWarning):
                python_show(message, category, *args, **kwargs)
            elif str(message) not in seen:
                seen.add(str(message))
                warn(err, str(message))

        warnings.showwarning = show
        yield


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _sane_terminal()
    err = Console(stderr=True, emoji=False, highlight=False, soft_wrap=True)  # one message, one line
    if sys.stdout is None:  # started with stdout closed (>&-)
        err.print("[red]error:[/red] standard output is closed; give the command somewhere to write", highlight=False)
        return EXIT_USER_ERROR
    json_document = "--json" in argv  # flags are spelled out: this is exactly what argparse will see
    # Model text must reach the terminal as it is: no emoji codes, no highlighting, no hard wraps.
    out = Console(
        file=_document_stream() if json_document else sys.stdout, emoji=False, highlight=False, soft_wrap=True
    )
    out.json_document = json_document
    try:
        with _showing_warnings(err):
            code = _main(argv, out, err)
        out.file.flush()
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as other commands do
        try:  # and the interpreter's last flush finds nowhere to fail
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.file.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
    except OSError as exc:  # writing the output itself failed (stdout on a full disk)
        try:
            err.print(f"[red]error:[/red] cannot write the output: {text(exc.strerror or str(exc))}", highlight=False)
        except OSError:
            pass
        return EXIT_USER_ERROR
    return code


def command_parser(parser: argparse.ArgumentParser | None, argv: list[str]) -> argparse.ArgumentParser | None:
    """The parser of the command ``argv`` names, or None."""
    for action in parser._actions if parser is not None else ():
        if isinstance(action, argparse._SubParsersAction) and argv[:1] and argv[0] in action.choices:
            return action.choices[argv[0]]
    return None


def flag_hint(command: argparse.ArgumentParser, message: str) -> str:
    """``; did you mean --max-new-tokens?`` for each unrecognized flag of ``message`` near one of the command's."""
    flags = [o for action in command._actions for o in action.option_strings if o.startswith("--")]
    hints = []
    for given in message.partition("unrecognized arguments: ")[2].split():
        name = given.partition("=")[0]
        if name.startswith("--") and (near := closest(name, flags)):
            hints.append(f"{name}: did you mean {' or '.join(near)}?")
    return f"; {'; '.join(hints)}" if hints else ""


def _main(argv: list[str], out: Console, err: Console) -> int:
    """Parse and run the command; its exit status, every error reported (output errors propagate)."""
    registry, parser = None, None
    try:
        registry = command_registry(err) if argv[:1] == ["generate"] else None  # its flags come from the samplers
        parser = make_parser(registry)
        args = parser.parse_args(argv)
        args.registry = registry
    except GptzooError as exc:  # a plugin failing in strict mode, a sampler's malformed flag
        message = exception_text(exc)
        return _fail(None, out, err, f"[red]error:[/red] {text(message)}", message, EXIT_USER_ERROR)
    except UsageError as exc:
        command = command_parser(parser, argv) if "unrecognized arguments" in exc.message else None
        if command is not None:  # argparse reports them on the top-level parser: the command's usage is the help
            exc = UsageError(command, f"{exc.message}{flag_hint(command, exc.message)}")
        exc.parser.print_usage(sys.stderr)
        message = str(exc)
        if exc.parser.prog == "gptzoo" and argv and argv[0] in ("--json", "--debug"):
            message += f"; {argv[0]} goes after the command (gptzoo COMMAND {argv[0]} ...)"
        if registry is not None and "unrecognized arguments" in message:
            message += unflagged_hint(registry, argv)
        line = text(f"{exc.parser.prog}: error: {message.removeprefix(exc.parser.prog + ': ')}")
        return _fail(None, out, err, line, message, EXIT_USER_ERROR)
    except KeyboardInterrupt:
        message = "interrupted: nothing was done"
        return _fail(None, out, err, f"[yellow]{message}[/yellow]", message, EXIT_INTERRUPTED)
    code = 0
    try:
        try:
            code = _run(args, out, err) or 0
        except OSError as exc:
            if exc.filename is None or isinstance(exc, BrokenPipeError):
                raise
            # a path the command was given or wrote to, refused by the system: a full disk, a permission...
            raise GptzooError(f"cannot use {exc.filename}: {exc.strerror}; check the path and its permissions") from exc
        except Exception as exc:  # a plugin's component failing while the model ran is the plugin's error
            if isinstance(exc, GptzooError) or "gptzoo.plugin_code" not in sys.modules:  # no component was built
                raise
            from gptzoo.plugin_code import raise_as_plugin_failure

            raise_as_plugin_failure(exc, args.registry if args.registry is not None else command_registry(err))
    except GptzooError as exc:
        _debug(args)
        message = exception_text(exc)
        line = f"[red]error:[/red] {escape(terminal_text(message, lines=exc.multiline))}"
        code = _fail(args, out, err, line, message, EXIT_USER_ERROR)
    except KeyboardInterrupt as exc:  # gptzoo.errors.Interrupted says what was kept
        _debug(args)
        kept = exception_text(exc)
        message = f"interrupted: {kept}" if kept else "interrupted"
        code = _fail(args, out, err, f"[yellow]{text(message)}[/yellow]", message, EXIT_INTERRUPTED)
    if args.command in TORCHRUN_COMMANDS and env_int("WORLD_SIZE", 1) > 1:
        # torch 2.13 with gloo aborted at interpreter exit after DDP in 1 to 3 runs of 6, although the work
        # was done ("terminate called without an active exception"): leave right away, with the run's own status.
        out.file.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
