"""lm-evaluation-harness through gptzoo (gptzoo.evaluation.harness): the same per-request
log-likelihoods, greedy flags and generations as the harness's own ``hf`` backend on SmolLM2-135M, for
a multiple-choice, a rolling-perplexity and a generation task (the local tasks in examples/lm-eval-tasks),
the same log-likelihoods through ``gptzoo serve`` and the harness's ``local-completions`` backend, and
``gptzoo eval --tasks`` end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

lm_eval = pytest.importorskip("lm_eval")

from cli_run import run_error, run_json  # noqa: E402

import gptzoo  # noqa: E402
from gptzoo.evaluation.harness import check_tasks, run_tasks  # noqa: E402
from gptzoo.fetch import fetch  # noqa: E402
from gptzoo.loader import load_any  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TASKS_DIR = ROOT / "examples" / "lm-eval-tasks"
TASKS = ["gptzoo_capitals", "gptzoo_paragraphs", "gptzoo_arithmetic"]
NAME = "smollm2-135m"


@pytest.fixture(autouse=True)
def at_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the tasks' data_files are relative to the repository's root
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def responses(results: dict[str, Any], task: str) -> dict[int, list[Any]]:
    """Each document's raw responses (per request: a (log-likelihood, is_greedy) pair, or a text)."""
    return {s["doc_id"]: [r[0] for r in s["resps"]] for s in results["samples"][task]}


@pytest.fixture(scope="module")
def ours() -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        found = check_tasks(TASKS, str(TASKS_DIR))
        return run_tasks(load_any(NAME), found, batch_size=4, log_samples=True)


def test_every_request_equals_the_harness_hf_backend(ours: dict[str, Any]) -> None:
    hf = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={fetch(NAME)},dtype=float32",
        device="cpu",
        batch_size=4,
        tasks=TASKS,
        task_manager=check_tasks(TASKS, str(TASKS_DIR)).manager,
        log_samples=True,
    )
    for task in TASKS:
        theirs, mine = responses(hf, task), responses(ours, task)
        assert theirs.keys() == mine.keys() and theirs
        for doc, expected in theirs.items():
            got = mine[doc]
            if task == "gptzoo_arithmetic":
                assert got == expected, (task, doc)
            elif task == "gptzoo_paragraphs":
                assert got[0] == pytest.approx(expected[0], abs=1e-4), (task, doc)
            else:
                assert [g for _, g in got] == [g for _, g in expected], (task, doc)  # is_greedy
                assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in expected], abs=1e-4), (task, doc)
    assert hf["results"]["gptzoo_capitals"]["acc,none"] == ours["results"]["gptzoo_capitals"]["acc,none"]


def test_local_completions_through_gptzoo_serve_gives_the_same_loglikelihoods(ours: dict[str, Any]) -> None:
    from server_process import Server

    server = Server(NAME)
    try:
        through = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=(
                f"base_url=http://127.0.0.1:{server.port}/v1/completions,model={NAME},tokenizer={fetch(NAME)},"
                "tokenizer_backend=huggingface,num_concurrent=2,max_retries=1,batch_size=2"
            ),
            tasks=["gptzoo_capitals"],
            task_manager=check_tasks(TASKS, str(TASKS_DIR)).manager,
            log_samples=True,
        )
    finally:
        assert server.stop() == 0
    theirs, mine = responses(through, "gptzoo_capitals"), responses(ours, "gptzoo_capitals")
    assert theirs.keys() == mine.keys() and theirs
    for doc, expected in theirs.items():
        assert [ll for ll, _ in mine[doc]] == pytest.approx([ll for ll, _ in expected], abs=1e-4), doc
        assert [g for _, g in mine[doc]] == [g for _, g in expected], doc


def test_gptzoo_eval_tasks_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(
        capsys, "eval", NAME, "--tasks", "gptzoo_capitals", "--include-path", str(TASKS_DIR), "--limit", "4"
    )
    result = report["results"]["gptzoo_capitals"]
    assert report["n-samples"]["gptzoo_capitals"] == {"original": 8, "effective": 4}
    assert 0 <= result["acc,none"] <= 1 and "acc_norm,none" in result
    assert json.dumps(report)  # plain JSON, no samples


def test_tasks_run_on_a_gpt2_tokenizer_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Every gpt2-* recipe and checkpoint tokenizes with GPT-2's BPE: the harness's transformers tokenizer of it
    encodes as tiktoken does (it used to have one token and encode everything to nothing, a traceback)."""
    from gptzoo.evaluation.harness import hf_tokenizer
    from gptzoo.tokenizer import load_tokenizer

    ours = load_tokenizer("gpt2")
    text = "The capital of France is Paris.\n<|endoftext|> x"
    assert hf_tokenizer(ours).encode(text) == ours.encode(text)
    model = gptzoo.build_model("gpt2-tiny")
    checkpoint = gptzoo.save_checkpoint(model, model.recipe, tmp_path / "ck")
    report = run_json(
        capsys, "eval", str(checkpoint), "--tasks", "gptzoo_capitals", "--include-path", str(TASKS_DIR), "--limit", "2"
    )
    assert report["n-samples"]["gptzoo_capitals"] == {"original": 8, "effective": 2}
    assert 0 <= report["results"]["gptzoo_capitals"]["acc,none"] <= 1


def test_bad_task_options_are_user_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    message = run_error(capsys, "eval", NAME, "--tasks", "gptzoo_capitalz", "--include-path", str(TASKS_DIR))
    assert "has no task 'gptzoo_capitalz'; did you mean 'gptzoo_capitals'?" in message
    message = run_error(capsys, "eval", NAME, "--tasks", "gptzoo_capitals", "--include-path", str(tmp_path / "no"))
    assert "is not a folder" in message
    assert "--limit is an option of --tasks" in run_error(capsys, "eval", NAME, "--limit", "3")
    assert "give one or the other" in run_error(
        capsys, "eval", NAME, "--tasks", "gptzoo_capitals", "--text", str(TASKS_DIR / "capitals.jsonl")
    )
