"""The gptzoo command: build summaries, checkpoints, listings and user errors (exit status 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_run import run_error, run_json  # tests/ is on sys.path (pyproject: pythonpath)

import gptzoo
from gptzoo.cli import main
from gptzoo.model import checkpoint


@pytest.mark.parametrize(
    ("name", "total"),
    [
        ("gpt2-small", 124_439_808),
        ("gpt2-medium", 354_823_168),
        ("gpt2-large", 774_030_080),
        ("gpt2-xl", 1_557_611_200),
    ],
)
def test_build_json_reports_official_gpt2_parameter_counts(
    capsys: pytest.CaptureFixture[str], name: str, total: int
) -> None:
    s = run_json(capsys, "build", name)
    assert s["params"]["total"] == total
    p = s["params"]
    assert p["token_embedding"] + p["position"] + p["blocks"] + p["final_norm"] + p["head"] == total
    assert p["tied"] is True and p["head"] == 0
    assert s["memory"]["weights_bytes"] == {"float32": 4 * total, "bfloat16": 2 * total}


def test_build_header_says_which_overrides_changed_the_base_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "gpt2-small", "--set", "model.position=rope", "--set", "model.n_layer=2"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header == (
        "gpt2-small with --set model.position=rope --set model.n_layer=2  (the base recipe: OpenAI GPT-2 small "
        "(124M): Pre-LN, learned positions, tanh GELU, tied head)"
    )
    assert main(["build", "gpt2-small"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "gpt2-small  OpenAI GPT-2 small (124M): Pre-LN, learned positions, tanh GELU, tied head"
    )
    s = run_json(capsys, "build", "gpt2-small", "--set", "model.position=rope")
    assert s["recipe"]["overrides"] == ["model.position=rope"]
    assert s["recipe"]["resolved"]["model"]["position"] == "rope"


def test_build_json_flops_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    s = run_json(capsys, "build", "gpt2-small")
    T, d, L, V = 1024, 768, 12, 50257
    forward = L * (24 * T * d * d + 4 * T * T * d) + 2 * T * V * d
    f = s["flops"]
    assert (f["batch"], f["seq_len"], f["forward"]) == (1, 1024, forward)
    assert isinstance(f["forward"], int) and f["convention"].startswith("1 multiply-add = 2 FLOPs")
    assert f["train_per_token"] == 3 * forward // T
    assert s["memory"]["kv_cache_bytes_per_token"] == {"float32": 2 * L * d * 4, "bfloat16": 2 * L * d * 2}
    s = run_json(capsys, "build", "gpt2-small", "--batch", "4", "--seq-len", "128")
    assert s["flops"]["forward"] == 4 * (L * (24 * 128 * d * d + 4 * 128 * 128 * d) + 2 * 128 * V * d)
    components = {c["key"]: c for c in s["components"]}
    assert components["norm"]["name"] == "layernorm" and components["norm"]["params"] == {"eps": 1e-5}
    assert components["activation"]["plugin"] == "gptzoo_plugins.activations"
    assert components["activation"]["distribution"] == "gptzoo"


def test_build_llama_reports_gqa_cache_and_untied_head(capsys: pytest.CaptureFixture[str]) -> None:
    s = run_json(capsys, "build", "tinyllama-1.1b", "--set", "model.n_layer=2")
    assert s["params"]["tied"] is False and s["params"]["head"] == 32000 * 2048
    assert s["memory"]["kv_cache_bytes_per_token"]["bfloat16"] == 2 * 2 * 4 * 64 * 2  # k+v, layers, kv heads, hs, bytes
    assert s["recipe"]["resolved"]["model"]["n_layer"] == 2


def test_build_table_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "gpt2-small-postln"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps titles at the console width
    for text in (
        "Components",
        "layernorm",
        "gptzoo_plugins.norms",
        "124,438,272",
        "Forward FLOPs",
        "1 multiply-add = 2 FLOPs",
        "KV cache per token",
        "norm_placement=post",
    ):
        assert text in out, text


def test_build_out_writes_a_checkpoint_that_loads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ckpt"
    s = run_json(capsys, "build", "llama-tiny", "--set", "model.n_layer=1", "--out", str(out))
    assert s["checkpoint"] == str(out)
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "recipe.toml"]
    model = gptzoo.load_checkpoint(out)
    assert model.recipe.model.n_layer == 1 and not model.tied
    idx = torch.randint(0, 512, (1, 9))
    again = gptzoo.load_checkpoint(out)
    assert torch.equal(model(idx), again(idx))
    # the tied GPT-2 head is stored once and re-tied on load
    run_json(capsys, "build", "gpt2-tiny", "--out", str(tmp_path / "gpt2"))
    gpt2 = gptzoo.load_checkpoint(tmp_path / "gpt2")
    assert gpt2.tied
    # an existing checkpoint is never overwritten
    message = run_error(capsys, "build", "gpt2-tiny", "--out", str(out))
    assert message == f"error: {out} already exists and is not an empty directory; choose another one or remove it"
    assert torch.equal(gptzoo.load_checkpoint(out).wte.weight, model.wte.weight)


def test_interrupted_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = gptzoo.build_model("gpt2-tiny")

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        gptzoo.save_checkpoint(model, model.recipe, tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_load_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(gptzoo.CheckpointError, match="is not a gptzoo checkpoint: model.safetensors is missing"):
        gptzoo.load_checkpoint(tmp_path)
    model = gptzoo.build_model("gpt2-tiny")
    gptzoo.save_checkpoint(model, model.recipe, tmp_path / "c")
    recipe = tmp_path / "c" / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("n_embd = 64", "n_embd = 32"))
    with pytest.raises(
        gptzoo.CheckpointError, match=r"wte.weight has shape \(50257, 64\), the recipe needs \(50257, 32\)"
    ):
        gptzoo.load_checkpoint(tmp_path / "c")
    weights = tmp_path / "c" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(gptzoo.CheckpointError, match="cannot read .*model.safetensors"):
        gptzoo.load_checkpoint(tmp_path / "c")


def test_list_and_recipes(capsys: pytest.CaptureFixture[str]) -> None:
    rows = run_json(capsys, "list", "position")
    assert [r["name"] for r in rows] == gptzoo.get_registry().names("position")
    assert all(r["kind"] == "position" and r["doc"] for r in rows)
    assert {r["name"] for r in rows if r["distribution"] == "gptzoo"} == set(
        gptzoo.get_registry(third_party=False).names("position")
    )
    assert {r["kind"] for r in run_json(capsys, "list")} >= {
        "norm",
        "activation",
        "mlp",
        "position",
        "attention",
        "sampler",
    }
    recipes = {r["name"]: r for r in run_json(capsys, "recipes")}
    assert recipes["gpt2-xl"]["n_layer"] == 48 and recipes["gpt2-xl"]["description"].startswith("OpenAI GPT-2 XL")
    assert main(["recipes"]) == 0 and "tinyllama-1.1b" in capsys.readouterr().out


def test_user_errors_exit_2_with_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('extends = "gpt2-small"\n[model]\nn_embd = 100\nnorm = "rmsnrom"\nwidth = 3\n')
    message = run_error(capsys, "build", str(bad))
    assert message.startswith(f"error: {bad.resolve()}: 3 problems")
    assert "- [model] unknown key 'width'" in message
    assert "- [model] norm: unknown norm 'rmsnrom'; did you mean 'rmsnorm'?" in message
    assert "- [model] n_embd=100 is not divisible by n_head=12" in message
    assert run_error(capsys, "build", "gpt2-smal").startswith(
        "error: gpt2-smal: unknown recipe 'gpt2-smal'; did you mean 'gpt2-small' or 'gpt2-small-postln'?"
    )
    message = run_error(capsys, "build", "gpt2-small", "--set", "model.n_layer=x", "--set", "oops")
    assert (
        "- --set 'oops' is not SECTION.KEY=VALUE" in message
        and "- [model] n_layer must be an integer, got 'x' (str)" in message
    )
    assert main(["build", "gpt2-smal", "--debug"]) == 2  # the same status, with the traceback before the line
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "gptzoo.errors.RecipeError: gpt2-smal" in err
    assert err.endswith(
        "error: gpt2-smal: unknown recipe 'gpt2-smal'; did you mean 'gpt2-small' or 'gpt2-small-postln'? (available: "
        + err.split("(available: ")[-1]
    )
    assert run_error(capsys, "build", "gpt2-small", "--seq-len", "4096") == (
        "error: --seq-len 4096 is longer than the 1024 positions that LearnedPosition encodes; give at most 1024"
    )
    (tmp_path / "file").write_text("x")
    assert run_error(capsys, "build", "gpt2-tiny", "--out", str(tmp_path / "file" / "sub")).startswith(
        f"error: cannot write to {tmp_path / 'file' / 'sub'}: "
    )
    assert run_error(capsys, "build", "gpt2-tiny", "--out", "") == "error: '' is not a directory name to write to"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml", "file"]  # nothing half-written


def test_console_script_and_module_entry_points(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    ok = subprocess.run(
        [sys.executable, "-m", "gptzoo", "build", "gpt2-xl", "--json"], capture_output=True, text=True, env=env
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["params"]["total"] == 1_557_611_200
    bad = subprocess.run(
        ["gptzoo", "build", "gpt2-small", "--set", "model.n_head=7"], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.endswith("[model] n_embd=768 is not divisible by n_head=7 (or set head_dim explicitly)\n")
    assert "Traceback" not in bad.stderr
    usage = subprocess.run(["gptzoo", "build"], capture_output=True, text=True, env=env)
    assert (
        usage.returncode == 2
        and usage.stderr == "error: give a RECIPE, or --hf DIR|NAME to derive one from a Hugging Face checkpoint\n"
    )
    misplaced = subprocess.run(["gptzoo", "--json", "recipes"], capture_output=True, text=True, env=env)
    assert misplaced.returncode == 2 and "unrecognized arguments: --json" in misplaced.stderr


def warning_while_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gptzoo recipes` warns twice of one thing and once of another, as a library call would, and
    raises a warning of another category (Python's to show, not a `warning:` line)."""
    import warnings

    import gptzoo.recipe

    real = gptzoo.recipe.shipped_recipes

    def warning(*args: object, **kwargs: object) -> object:
        for message in ("plugin 'old' implements an older contract", "plugin 'old' implements an older contract"):
            warnings.warn(message, gptzoo.errors.GptzooWarning, stacklevel=2)
        shadowed = "norm 'layernorm' of plugin 'x' is shadowed by the built-in"
        warnings.warn(shadowed, gptzoo.errors.GptzooWarning, stacklevel=2)
        warnings.warn("not gptzoo's", UserWarning, stacklevel=2)
        return real(*args, **kwargs)

    monkeypatch.setattr(gptzoo.recipe, "shipped_recipes", warning)  # what `gptzoo recipes` imports when it runs


@pytest.mark.parametrize("json_output", [False, True], ids=["table", "json"])
def test_a_gptzoo_warning_is_one_warning_line_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], json_output: bool
) -> None:
    warning_while_listing(monkeypatch)
    with pytest.warns(UserWarning, match="not gptzoo's"):  # shown as Python shows it
        assert main(["recipes", *(["--json"] if json_output else [])]) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        "warning: plugin 'old' implements an older contract\n"
        "warning: norm 'layernorm' of plugin 'x' is shadowed by the built-in\n"
    )
    if json_output:
        assert "gpt2-small" in [row["name"] for row in json.loads(captured.out)]
    else:
        assert captured.out.startswith("Recipes") and "warning" not in captured.out
    with pytest.warns(UserWarning):
        assert main(["recipes", "--json"]) == 0  # every command says it again
    assert capsys.readouterr().err.count("warning: plugin 'old' implements an older contract\n") == 1


def test_the_command_list_mentions_eval_s_benchmarks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = " ".join(capsys.readouterr().out.split())
    assert "eval loss, perplexity and bits per byte on held-out text, at several lengths; or benchmarks (--tasks)" in (
        listed
    )
