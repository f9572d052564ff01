"""Tables at 80 columns fold their headers between words, never inside one: the sweep's table (too wide
for 80 columns even at its narrowest cells), the listings, and a table that fits as rich lays it out."""

from __future__ import annotations

import io
from typing import Any

import pytest
from cli_run import run_json
from rich.console import Console
from rich.table import Table

from gptzoo.cli import main
from gptzoo.sweep.report import render_report
from gptzoo.tables import WholeWords

VERTICALS = "┃│"


def headers(rendered: str) -> list[str]:
    """Each column's header as the rendered lines show it, its pieces (one per line) joined by spaces: the
    header itself when every line break falls between words, "FLOPs/to ken" when one falls inside a word."""
    lines = rendered.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    pieces: list[list[str]] = []
    for line in lines[top + 1 :]:
        if line.startswith("┡"):
            break
        cells = [cell.strip() for cell in line.strip(VERTICALS).split("┃")]
        pieces = pieces or [[] for _ in cells]
        for column, cell in zip(pieces, cells, strict=True):
            column.extend([cell] if cell else [])
    return [" ".join(column) for column in pieces]


def render(renderable: Any, width: int = 80) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, legacy_windows=False).print(renderable)
    return out.getvalue()


def variant(name: str, flops: float, matched: dict[str, Any] | None = None) -> dict[str, Any]:
    loss = {"mean": 2.3456, "std": 0.0123}
    return {
        "variant": name,
        "matched": matched,
        "params": 1_234_567,
        "train_flops_per_token": flops,
        "kv_bytes_per_token": 12_288,
        "tokens_per_s": {"mean": 12_345.0},
        "final_val_loss": loss,
        "best_val_loss": loss,
        "bits_per_byte": loss,
        "max_grad_norm": 12.34,
        "steps_to_target": {"mean": 1234.0},
        "reached_target": "3/3",
        "diverged": 0,
        "seeds": [0, 1, 2],
        "max_spike": 0.0,
        "reasons": [],
        "lengths": [
            {"length": n, "refused": None, "perplexity": {"mean": 10.5, "std": 0.25}} for n in (128, 256, 512, 1024)
        ],
    }


def test_the_sweep_table_folds_its_headers_between_words_at_80_columns() -> None:
    report = {
        "sweep": "position",
        "target_loss": 2.5,
        "variants": [variant("rope", 7.4e6, {"key": "model.d_ff", "value": 1234}), variant("learned", 7.3e6)],
    }
    out = io.StringIO()
    render_report(report, Console(file=out, width=80, color_system=None))
    rendered = out.getvalue()
    assert headers(rendered) == [
        "variant",
        "params",
        "FLOPs/token",
        "tok/s",
        "final val loss",
        "bits/byte",
        "to target",
        "diverged",
    ]
    assert "(max ‖g‖ left out at 80 columns; a wider terminal shows it)" in rendered.splitlines()
    assert max(len(line) for line in rendered.splitlines()) <= 80
    assert "perplexity by evaluation length" in rendered


def test_names_stay_whole_and_the_least_needed_columns_go_first() -> None:
    """The README sweep's variant names at 80 and 60 columns: whole on one line each (they used to fold as
    `gelu_ta` over `nh+lr=0`), the columns of report.md a terminal can go without left out, as a line says."""
    names = ["gelu_tanh+lr=0.0003", "gelu_tanh+lr=0.003", "swiglu+lr=0.0003", "swiglu+lr=0.003"]
    report = {"sweep": "my-sweep", "target_loss": None, "variants": [variant(n, 5.7e6) for n in names]}
    for width, left_out in ((80, "max ‖g‖"), (60, "max ‖g‖, FLOPs/token and params")):
        out = io.StringIO()
        render_report(report, Console(file=out, width=width, color_system=None))
        lines = out.getvalue().splitlines()
        assert max(len(line) for line in lines) <= width
        for name in names:
            assert sum(line.split("│")[1].strip() == name for line in lines if line.startswith("│")) == 2, name
        assert any(line.startswith(f"({left_out} left out at {width} columns") for line in lines), lines


def test_a_table_with_optional_columns_renders_the_same_twice() -> None:
    t = Table()
    for header in ("name", "description", "from"):
        t.add_column(header, overflow="fold")
    t.add_row("gptzoo_plugins.activations", "a rather long description " * 3, "gptzoo_plugins.activations (gptzoo 0.1)")
    once = render(WholeWords(t, optional=("from",)), 60)
    assert once == render(WholeWords(t, optional=("from",)), 60)
    assert "gptzoo_plugins.activations │" in once and "(from left out at 60 columns" in once
    assert render(WholeWords(t, optional=("from",)), 120) == render(t, 120)  # wide enough: every column


def test_a_table_that_fits_is_laid_out_as_rich_lays_it_out() -> None:
    def table() -> Table:
        t = Table(title="t", title_justify="left")
        for header in ("name", "FLOPs/token", "final val loss"):
            t.add_column(header, overflow="fold")
        t.add_row("rope", "7.4M", "2.346")
        return t

    assert render(WholeWords(table())) == render(table())


@pytest.mark.parametrize("width", [80, 100])
def test_many_columns_of_long_words_fold_between_words(width: int) -> None:
    words = ["FLOPs/token", "diverged", "perplexity", "bits/byte", "tokens/s", "parameters"]
    t = Table()
    for header in words:
        t.add_column(f"{header} x", overflow="fold")
    t.add_row(*("1234567890123" for _ in words))
    rendered = render(WholeWords(t), width)
    assert headers(rendered) == [f"{w} x" for w in words]
    assert max(len(line) for line in rendered.splitlines()) <= width


def test_the_listings_fold_their_headers_between_words(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["list"]) == 0
    rendered = capsys.readouterr().out
    assert headers(rendered) == ["kind", "name", "description"]  # each name whole: the provenance left out
    assert "(shipped recipes and from left out at 80 columns; a wider terminal shows them)" in rendered
    assert max(len(line) for line in rendered.splitlines()) <= 80
    rows = run_json(capsys, "list")
    assert len(rows) > 20
    shown = {line.split("│")[2].strip() for line in rendered.splitlines() if line.startswith("│")}
    assert {row["name"] for row in rows} <= shown
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["list"]) == 0
    assert headers(capsys.readouterr().out) == ["kind", "name", "description", "shipped recipes", "from"]


def eval_report() -> dict[str, Any]:
    score = {
        "text": "/a/rather/long/path/to/held-out/shakespeare.txt",
        "length": 1024,
        "longest": 1024,
        "tokens": 426_113,
        "loss": 3.04817,
        "loss_ci": [3.03521, 3.06122],
        "perplexity": 21.0741,
        "bits_per_byte": 1.23456,
        "refused": None,
    }
    return {
        "recipe": "gpt2-small",
        "weights": "/a/checkpoint/somewhere/deep/in/the/file/system",
        "dtype": "float32",
        "context_length": 1024,
        "max_positions": 1024,
        "scores": [score, {**score, "length": 256, "longest": 256}],
    }


@pytest.mark.parametrize("width", [80, 60])
def test_no_number_of_the_eval_table_is_split_across_lines(width: int) -> None:
    from gptzoo.evaluation.display import render_eval

    out = io.StringIO()
    render_eval(eval_report(), Console(file=out, width=width, color_system=None))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width
    table = "\n".join(lines)
    assert "426,113" in table  # whole, on one line (a fold would put "426,11" over "3")
    for number in ("1024", "426,113", "3.0482", "3.0352–3.0612", "21.074", "1.2346"):
        assert any(number in line for line in lines), (number, table)


@pytest.mark.parametrize("width", [80, 60])
def test_no_number_of_the_sweep_table_is_split_across_lines(width: int) -> None:
    report = {"sweep": "position", "target_loss": 2.5, "variants": [variant("rope", 7.4e6), variant("learned", 7.3e6)]}
    out = io.StringIO()
    render_report(report, Console(file=out, width=width, color_system=None))
    lines = out.getvalue().splitlines()
    shown = ("1.23M", "7.4M") if width > 60 else ()  # params and FLOPs/token: left out at 60 columns
    for number in (*shown, "12.3k", "2.346", "±.012", "1234", "(3/3)", "0/3"):
        assert any(number in line for line in lines), (number, out.getvalue())


def test_the_eval_table_names_one_text_in_its_title_and_several_in_a_column() -> None:
    """One text (the usual case): its path in the title, not folded into a narrow column on every row
    (the README's `eval runs/shakespeare --data data/shakespeare-bytes` showed `data/sh`, `akespea`, ...)."""
    from gptzoo.evaluation.display import render_eval

    def rendered(report: dict[str, Any]) -> list[str]:
        out = io.StringIO()
        render_eval(report, Console(file=out, width=80, color_system=None))
        return out.getvalue().splitlines()

    one = eval_report()
    lines = rendered(one)
    path = one["scores"][0]["text"]
    assert path in "".join(lines[:3]).replace(" ", "") or path in " ".join(lines[:3])
    assert headers("\n".join(lines))[0] == "length"
    two = eval_report()
    two["scores"][1] = {**two["scores"][1], "text": "notes.txt"}
    lines = rendered(two)
    assert headers("\n".join(lines))[0] == "text"
    assert any("notes" in line for line in lines)
