"""One way to name a model: `generate`, `eval` and `compare` take MODEL (a checkpoint, a run directory, a
Hugging Face directory, a recipe with [weights], a recipe beside --hf) or the flags --hf and --checkpoint, and
`export` takes MODEL; every form of the same weights gives the same result; two names of a model are one error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import transformers
from cli_run import run_error, run_json

from gptzoo.cli import main
from gptzoo.tokenizer import gpt2_bpe_files
from gptzoo.training.run_dir import CHECKPOINTS, STATE

TEXT = "The quick brown fox jumps over the lazy dog. " * 8


@pytest.fixture(scope="module")
def names(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The same tiny GPT-2 weights as a Hugging Face directory, a gptzoo checkpoint, a run directory and a
    recipe with [weights]; a recipe without, and a text file."""
    tmp = tmp_path_factory.mktemp("names")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=50257, n_positions=64)
    hf = tmp / "hf"
    transformers.AutoModelForCausalLM.from_config(config).eval().save_pretrained(hf)
    vocab_bpe, encoder_json = gpt2_bpe_files()
    transformers.GPT2Tokenizer(vocab=str(encoder_json), merges=str(vocab_bpe)).save_pretrained(hf)
    ck = tmp / "ck"
    assert main(["build", "--hf", str(hf), "--out", str(ck), "--json"]) == 0
    step = tmp / "run" / CHECKPOINTS / "step-000001"
    shutil.copytree(ck, step)
    (step / STATE).write_bytes(b"")  # complete as a run's checkpoint; only the weights are read
    recipe = tmp / "with-weights.toml"
    recipe.write_text((ck / "recipe.toml").read_text() + f"\n[weights]\nhf = {str(hf)!r}\n", encoding="utf-8")
    (tmp / "text.txt").write_text(TEXT, encoding="utf-8")
    return {
        "hf": str(hf),
        "ck": str(ck),
        "run": str(tmp / "run"),
        "recipe": str(recipe),
        "bare": str(ck / "recipe.toml"),
        "text": str(tmp / "text.txt"),
    }


FORMS = {
    "MODEL=hf": ["{hf}"],
    "MODEL=checkpoint": ["{ck}"],
    "MODEL=run": ["{run}"],
    "MODEL=recipe with [weights]": ["{recipe}"],
    "MODEL=recipe --hf": ["{bare}", "--hf", "{hf}"],
    "--hf": ["--hf", "{hf}"],
    "--checkpoint": ["--checkpoint", "{ck}"],
}
"""Every way to name the same weights, and the command line of each."""


def form(names: dict[str, str], name: str) -> list[str]:
    return [arg.format(**names) for arg in FORMS[name]]


def test_generate_takes_every_form(names: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--prompt", "The quick", "--max-new-tokens", "4", "--temperature", "0"]
    tokens = {name: run_json(capsys, "generate", *form(names, name), *argv)["tokens"] for name in FORMS}
    assert len({str(t) for t in tokens.values()}) == 1, tokens


def test_eval_takes_every_form(names: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--text", names["text"], "--lengths", "32"]
    losses = {name: run_json(capsys, "eval", *form(names, name), *argv)["scores"][0]["loss"] for name in FORMS}
    assert len(set(losses.values())) == 1, losses


def test_compare_takes_every_form_of_hugging_face_weights(
    names: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("MODEL=hf", "MODEL=recipe with [weights]", "MODEL=recipe --hf", "--hf"):
        result = run_json(capsys, "compare", *form(names, name), "--prompt", "The quick", "--new-tokens", "2")
        assert [row["greedy_match"] for row in result["prompts"]] == [True], name
    assert run_error(capsys, "compare", "--checkpoint", names["ck"]) == (
        f"error: compare runs transformers on a Hugging Face checkpoint, and --checkpoint {names['ck']} is a gptzoo "
        f"one: export it (gptzoo export {names['ck']} --hf DIR) and compare DIR"
    )
    assert run_error(capsys, "compare", names["ck"]) == (
        f"error: {names['ck']} is not a Hugging Face checkpoint: config.json is missing"
    )


@pytest.mark.parametrize("command", ["generate", "eval", "compare"])
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{ck}", "--hf", "{hf}"], "{ck!r} and --hf {hf!r} both name the model"),
        (["{hf}", "--checkpoint", "{ck}"], "{hf!r} and --checkpoint {ck!r} both name the model"),
        (["{run}", "--hf", "{hf}"], "{run!r} and --hf {hf!r} both name the model"),
    ],
    ids=["checkpoint --hf", "hf --checkpoint", "run --hf"],
)
def test_two_names_of_a_model_are_one_error(
    names: dict[str, str], capsys: pytest.CaptureFixture[str], command: str, argv: list[str], message: str
) -> None:
    extra = {"generate": ["--prompt", "a"], "eval": ["--text", names["text"]], "compare": []}[command]
    line = run_error(capsys, command, *(a.format(**names) for a in argv), *extra, "--json")
    assert line == (
        f"error: {message.format(**names)}; give one of them (beside --hf, MODEL may only be a recipe: the one its "
        "weights must fit)"
    )


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_a_checkpoint_beside_a_recipe_or_hf_is_the_loaders_error(
    names: dict[str, str], capsys: pytest.CaptureFixture[str], command: str
) -> None:
    extra = ["--prompt", "a"] if command == "generate" else ["--text", names["text"]]
    for argv in (["gpt2-tiny", "--checkpoint", names["ck"]], ["--hf", names["hf"], "--checkpoint", names["ck"]]):
        assert run_error(capsys, command, *argv, *extra) == (
            "error: give either --checkpoint DIR or RECIPE / --hf, not both"
        )


@pytest.mark.parametrize("command", ["generate", "eval", "compare"])
def test_no_model_is_one_error(capsys: pytest.CaptureFixture[str], command: str) -> None:
    extra = {"generate": ["--prompt", "a"], "eval": [], "compare": []}[command]
    assert run_error(capsys, command, *extra) == (
        "error: name the model: MODEL (a recipe, a checkpoint or run directory, a Hugging Face directory or a "
        "fetchable name), --hf DIR|NAME or --checkpoint DIR"
    )


def test_export_takes_a_checkpoint_or_a_run(
    names: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    written = [run_json(capsys, "export", names[n], "--hf", str(tmp_path / n))["hf"] for n in ("ck", "run")]
    first, second = (load_file(Path(w) / "model.safetensors") for w in written)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
