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
from gptzoo.evaluation.harness import run_tasks  # noqa: E402
from gptzoo.evaluation.tasks import check_tasks  # noqa: E402
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


TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""

BROKEN = {  # name -> (the change to a working task, the message's tail)
    "empty": ("data: EMPTY", "): its data file has no documents; give it at least one"),
    "missing": ("data: MISSING", "): a data file is missing (Unable to find '{tmp}/missing.jsonl'); data_files are"),
    "badtype": (
        "output_type: multiple_choise",
        ") cannot be loaded: Got invalid output_type 'multiple_choise', must be in 'loglikelihood,",
    ),
    "field": (
        'doc_to_text: "{{questoin}}"',
        "): a template names a field its documents do not have ('questoin' is undefined)",
    ),
    "target": (
        'doc_to_target: "{{answr}}"',
        "): a template names a field its documents do not have ('answr' is undefined)",
    ),
    "function": (
        "doc_to_text: !function nomodule.text",
        "): Cannot import module 'nomodule' for function 'text' (from YAML in {tmp}); a !function names",
    ),
    "hub": ("dataset_path: nobody/no_such_dataset", "): cannot fetch its dataset (Couldn't reach 'nobody/no_such_"),
}


def task_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The error of ``gptzoo eval *args``, after the datasets library's progress lines."""
    message = run_error(capsys, "eval", *args)
    return message[message.index("error: ") :]


def broken_task(tmp_path: Path, name: str, change: str) -> None:
    text = TASK.format(name=name, data=tmp_path / "capitals.jsonl")
    (tmp_path / "capitals.jsonl").write_text((TASKS_DIR / "capitals.jsonl").read_text())
    (tmp_path / "empty.jsonl").write_text("")
    key = change.split(":")[0]
    if change.startswith("data: "):
        line = f"    test: {tmp_path / change.removeprefix('data: ').lower()}.jsonl"
        text = "\n".join(line if row.startswith("    test:") else row for row in text.splitlines()) + "\n"
    else:
        text = "\n".join(change if row.startswith(key + ":") else row for row in text.splitlines()) + "\n"
        if key == "dataset_path":
            text = text.replace("dataset_kwargs:\n  data_files:\n", "").replace("    test: ", "# ")
    (tmp_path / f"{name}.yaml").write_text(text)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_task_is_named_before_the_model_loads(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each mistake in a task of one's own is a message naming the task, its file and the fix (exit 2),
    before the model loads; they were tracebacks, or read "cannot write the output"."""
    import gptzoo.cli.model as cli_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(cli_model, "load_named", lambda *a, **k: pytest.fail("the model loaded"))
    change, tail = BROKEN[name]
    broken_task(tmp_path, f"mine_{name}", change)
    message = task_error(capsys, NAME, "--tasks", f"mine_{name}", "--include-path", str(tmp_path))
    assert message.startswith(f"error: task 'mine_{name}' ({tmp_path / f'mine_{name}.yaml'})")
    assert tail.format(tmp=tmp_path) in message


def test_a_task_file_that_is_not_yaml_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken_task(tmp_path, "mine", "metric_list:")
    (tmp_path / "mine.yaml").write_text((tmp_path / "mine.yaml").read_text() + "  bad: [unclosed\n")
    message = run_error(capsys, "eval", NAME, "--tasks", "mine", "--include-path", str(tmp_path))
    assert message == (
        f"error: lm-evaluation-harness has no task 'mine'; {tmp_path / 'mine.yaml'} names it but is not valid YAML "
        "(expected <block end>, but found '?' at line 13, column 3): fix the file"
    )


@pytest.mark.parametrize(("split", "most"), [("", 8), ("fewshot_split: test\n", 7)])
def test_num_fewshot_beyond_the_documents_is_refused(
    split: str, most: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Examples drawn from the evaluated split leave the question out (one fewer) where the harness does."""
    broken_task(tmp_path, "mine", "metric_list:")
    (tmp_path / "mine.yaml").write_text((tmp_path / "mine.yaml").read_text() + split)
    shots = str(most + 1)
    message = task_error(capsys, NAME, "--tasks", "mine", "--include-path", str(tmp_path), "--num-fewshot", shots)
    assert message == (
        f"error: --num-fewshot {shots}: task 'mine' ({tmp_path / 'mine.yaml'}) has {most} document(s) to draw "
        f"examples from; give --num-fewshot {most} or fewer"
    )
    found = check_tasks(["mine"], str(tmp_path), most)  # the most it names is accepted
    assert [task.get_config("num_fewshot") for task in found.built] == [most]
