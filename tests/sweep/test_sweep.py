"""`gptzoo sweep`: specs checked whole before anything starts, matched variants, a sweep killed with SIGKILL
and resumed equal to one run straight, divergence reported, the report and its plots; and the shipped
norm-placement, position and moe sweeps end to end at a reduced budget (the moe sweep's report with each
variant's active and total parameters and expert-load balance), and the moe sweep's matched variants."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tiny import TRAIN

from gptzoo.cli import main
from gptzoo.sweep.matching import active_parameters, match_variant, parameters, train_flops
from gptzoo.sweep.runner import run_sweep
from gptzoo.sweep.spec import read_spec
from gptzoo.training.data import prepare
from tests.cli_run import run_error, run_json

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Python's documentation in bytes: a prepared corpus that needs no download."""
    return Path(prepare("stdlib-docs", tmp_path_factory.mktemp("data") / "docs", tokenizer="bytes")["out"])


def write_spec(folder: Path, data: Path, body: str, *, steps: int = 12, seeds: str = "[0, 1]", top: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.toml"
    path.write_text(
        f'base = "shakespeare-bytes"\nset = {json.dumps(TRAIN)}\nseeds = {seeds}\ntarget_loss = 3.5\n{top}'
        f'[data]\npath = "{data}"\n[budget]\nsteps = {steps}\n[eval]\nlengths = [32, 64]\nmax_tokens = 2000\n{body}',
        encoding="utf-8",
    )
    return path


TWO = '[[variants]]\nname = "pre"\n[[variants]]\nname = "post"\nset = ["model.norm_placement=post"]\n'


def _without_timing(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "tokens_per_s"}


def results(out: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted((out / "results").glob("*/seed-*.json")):
        found[f"{path.parent.name}/{path.stem}"] = _without_timing(json.loads(path.read_text()))
    return found


def test_a_spec_with_problems_lists_them_all_and_starts_nothing(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(
        tmp_path,
        data,
        '[[variants]]\nname = "a"\nset = ["model.norm=nosuchnorm"]\n'
        '[[variants]]\nname = "b"\nset = ["model.n_layerz=2", "train.max_steps=5"]\n'
        '[[variants]]\nname = "c"\nset = ["model.position.theta=10"]\n'
        '[[variants]]\nname = "a"\nmatch = "bytes"\n',
        top='colour = "blue"\n',
        seeds="[0, 99999999999999999999999]",
    )
    out = tmp_path / "out"
    message = run_error(capsys, "sweep", str(spec), "--out", str(out))
    for expected in (
        "unknown key 'colour'",
        "variant 'a': [model] norm: unknown norm 'nosuchnorm'",
        "variant 'b':",
        "n_layerz",
        "train.max_steps=5 is the budget's to set",
        "variant 'c':",
        "match must be one of params, active_params, flops, not 'bytes'",
        "two variants are named 'a'",
    ):
        assert expected in message, (expected, message)
    assert not out.exists()


def test_matched_variants_are_within_one_percent_of_the_base() -> None:
    spec = read_spec("activation")
    from gptzoo.registry import default_registry

    registry = default_registry()
    base = parameters(spec.recipes["gelu"], registry)
    for name in ("swiglu", "geglu"):
        recipe = spec.recipes[name]
        assert recipe.model.mlp.name == "gated" and recipe.model.d_ff == 341  # 2/3 of 512, computed
        assert abs(parameters(recipe, registry) / base - 1) < 0.01
    flops = match_variant(spec.recipes["swiglu"], spec.recipes["gelu"], "flops", "model.d_ff", 8, registry)
    target = train_flops(spec.recipes["gelu"], registry)
    assert flops.model.d_ff % 8 == 0 and abs(train_flops(flops, registry) / target - 1) < 0.01


def test_killed_and_resumed_equals_straight(tmp_path: Path, data: Path) -> None:
    spec_path = write_spec(tmp_path / "spec", data, TWO, steps=40)
    straight = tmp_path / "straight"
    report = run_sweep(read_spec(spec_path), straight)
    assert [r["status"] for r in report["runs"]] == ["done"] * 4
    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gptzoo", "sweep", str(spec_path), "--out", str(killed), "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:  # kill it while a run is between checkpoints, after one run has finished
        deadline = time.time() + 240
        while time.time() < deadline:
            finished = list((killed / "results").glob("*/*.json"))
            checkpoints = list((killed / "runs").glob("*/seed-*/checkpoints/step-*"))
            mid_run = [
                c
                for c in checkpoints
                if not (killed / "results" / c.parents[2].name / f"{c.parents[1].name}.json").exists()
            ]
            if finished and mid_run:
                break
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
    assert 1 <= len(list((killed / "results").glob("*/*.json"))) < 4, "the sweep was killed mid-way"
    assert mid_run, "a run was killed between checkpoints: the resume continues it"
    resumed = run_sweep(read_spec(spec_path), killed, resume=True)
    assert results(killed) == results(straight)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rows]  # noqa: E731
    assert strip(resumed["variants"]) == strip(report["variants"])


def test_a_diverging_variant_is_reported_and_the_sweep_goes_on(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = TWO + '[[variants]]\nname = "blowup"\nset = ["train.lr=1e30", "train.grad_clip=0", "train.warmup_steps=0"]\n'
    spec = write_spec(tmp_path, data, body, steps=6, seeds="[0]")
    report = run_json(capsys, "sweep", str(spec), "--out", str(tmp_path / "out"))
    rows = {row["variant"]: row for row in report["variants"]}
    assert rows["blowup"]["diverged"] == 1 and rows["pre"]["diverged"] == rows["post"]["diverged"] == 0
    (blowup,) = [r for r in report["runs"] if r["variant"] == "blowup"]
    assert blowup["status"] == "diverged" and "is nan" in blowup["reason"] or "is inf" in blowup["reason"]
    assert blowup["eval"] is None and rows["pre"]["final_val_loss"]["mean"] < 5.6
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| blowup |" in md and "| 1/1 |" in md.replace(" ⚠", "") and "- blowup: step" in md


def test_a_sweep_whose_every_run_diverged_reports_it_and_has_nothing_to_plot(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blowup = '[[variants]]\nname = "blowup"\nset = ["train.lr=1e30", "train.grad_clip=0", "train.warmup_steps=0"]\n'
    out = tmp_path / "out"
    assert main(["sweep", str(write_spec(tmp_path, data, blowup, steps=2, seeds="[0]")), "--out", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "blowup: step 2: the loss is nan" in shown or "blowup: step 2: the loss is inf" in shown
    assert run_error(capsys, "plot", str(out)) == (
        f"error: {out} has nothing to plot: no run of the sweep logged a validation loss; {out / 'report.md'} says "
        "why each ended (one that diverged: try a lower train.lr)"
    )
    assert not list(out.glob("*.png"))


def test_report_plots_and_resume_rules(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, data, TWO, steps=6, seeds="[0]")
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "sweep tiny" in shown and "post" in shown and "report:" in shown
    md = (out / "report.md").read_text()
    assert md.startswith("# Sweep tiny") and "| variant | params |" in md and "Perplexity by evaluation length" in md
    for png in ("val_loss_by_step.png", "val_loss_by_flops.png", "perplexity_by_length.png"):
        assert f"![{png}]({png})" in md
        (out / png).unlink()
    assert run_json(capsys, "plot", str(out))["png"] == [
        str(out / p) for p in ("val_loss_by_step.png", "val_loss_by_flops.png", "perplexity_by_length.png")
    ]
    import matplotlib.image

    for png in out.glob("*.png"):
        assert png.read_bytes().startswith(PNG) and matplotlib.image.imread(png).shape[2] in (3, 4)
    report = json.loads((out / "report.json").read_text())
    assert [r["variant"] for r in report["variants"]] == ["pre", "post"]
    assert report["variants"][0]["params"] == report["runs"][0]["params"] > 0
    assert "already" in run_error(capsys, "sweep", str(spec), "--out", str(out))  # not without --resume
    assert "no sweep to resume" in run_error(capsys, "sweep", str(spec), "--out", str(tmp_path / "new"), "--resume")
    other = run_error(capsys, "sweep", str(spec), "--out", str(out), "--resume", "--budget", "steps=7")
    assert "holds another sweep (its budget differ" in other
    again = run_json(capsys, "sweep", str(spec), "--out", str(out), "--resume")  # nothing left: the same report
    assert [r["final_val_loss"] for r in again["variants"]] == [r["final_val_loss"] for r in report["variants"]]


def test_a_length_that_no_variant_can_score_is_shown_beside_the_scored_ones(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, data, '[[variants]]\nname = "pre"\n', steps=2, seeds="[0]")
    spec.write_text(spec.read_text().replace("lengths = [32, 64]", "lengths = [32, 1000]"))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out")]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert (
        "pre: length 1000 refused: length 1000 is longer than the 256 positions that LearnedPosition encodes; "
        "evaluate at 256 or fewer" in shown
    )
    (run,) = json.loads((tmp_path / "out" / "report.json").read_text())["runs"]
    assert [(e["length"], e["refused"] is None) for e in run["eval"]] == [(32, True), (1000, False)]


def test_parallel_jobs_give_the_sequential_results(tmp_path: Path, data: Path) -> None:
    spec = read_spec(write_spec(tmp_path, data, TWO, steps=6, seeds="[0]"))
    one, two = run_sweep(spec, tmp_path / "one"), run_sweep(spec, tmp_path / "two", jobs=2)
    for a, b in zip(one["runs"], two["runs"], strict=True):
        assert a["variant"] == b["variant"]
        assert a["final_val_loss"] == pytest.approx(
            b["final_val_loss"], rel=1e-4
        )  # one thread each: close, not bitwise


@pytest.mark.slow
@pytest.mark.parametrize("name", ["norm-placement", "position", "latent-attention", "moe", "token-mixer"])
def test_shipped_sweeps_run_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    out = tmp_path / name
    report = run_json(capsys, "sweep", name, "--out", str(out), "--budget", "steps=4")
    spec = read_spec(name)
    assert len(report["runs"]) == len(spec.variants) * len(spec.seeds)
    assert all(r["status"] in ("done", "diverged") for r in report["runs"])
    md = (out / "report.md").read_text()
    assert f"# Sweep {name}" in md and "| variant | params |" in md
    pngs = sorted(p.name for p in out.glob("*.png"))
    expected = ["val_loss_by_flops.png", "val_loss_by_step.png"]
    if name == "position":
        expected = ["perplexity_by_length.png", *expected]
        learned = next(row for row in report["variants"] if row["variant"] == "learned")
        assert [e["refused"] is not None for e in learned["lengths"]] == [False, True, True]
        rope = next(row for row in report["variants"] if row["variant"] == "rope")
        assert [e["refused"] for e in rope["lengths"]] == [None, None, None]
    if name == "latent-attention":  # MLA at MQA's and GQA's cache bytes, and the plot of loss against them
        expected = sorted([*expected, "val_loss_by_kv_bytes.png"])
        kv = {row["variant"]: row["kv_bytes_per_token"] for row in report["variants"]}
        assert (kv["mla-32"], kv["mla-64"]) == (kv["mqa"], kv["gqa"]) == (4 * 32 * 4, 4 * 64 * 4)
    if name == "token-mixer":  # 3 mixer layers' states: gated DeltaNet's convolution inputs and 4 x 32 x 32 state,
        # the short convolution's last 2 inputs of 128 channels, Mamba-2's last 3 inputs of 256 + 2 x 16 channels and
        # 8 x 16 x 32 state; one full-attention layer's keys and values
        expected = sorted(["perplexity_by_length.png", "val_loss_by_kv_bytes.png", *expected])
        rows = {row["variant"]: row for row in report["variants"]}
        state = {name: row["state_bytes_per_sequence"] for name, row in rows.items()}
        assert state == {
            "full": 0,
            "sliding": 0,
            "deltanet-3to1": 3 * (384 * 3 + 4 * 32 * 32) * 4,
            "short-conv-3to1": 3 * 128 * 2 * 4,
            "mamba2-3to1": 3 * (288 * 3 + 8 * 16 * 32) * 4,
        }
        assert rows["deltanet-3to1"]["kv_bytes_per_token"] == rows["full"]["kv_bytes_per_token"] // 4 == 2 * 128 * 4
        assert "| KV bytes/token | state bytes/seq | tok/s |" in md
    if name == "moe":
        expected = ["expert_load_max_mean_by_step.png", *expected]
        _check_moe_report(report, md)
    assert pngs == expected
    import matplotlib.image

    for png in pngs:
        assert (out / png).read_bytes().startswith(PNG) and f"![{png}]({png})" in md
        assert matplotlib.image.imread(out / png).shape[2] in (3, 4)  # it opens


@pytest.mark.slow
def test_under_torchrun_each_run_is_distributed(tmp_path: Path, data: Path) -> None:
    """Two processes with micro-batches of 2 train what one process does with 2 x 2 accumulated."""
    two = write_spec(tmp_path / "two", data, TWO, steps=4, seeds="[0]")
    one = write_spec(tmp_path / "one", data, TWO + "", steps=4, seeds="[0]")
    one.write_text(one.read_text().replace('"train.warmup_steps=2"', '"train.warmup_steps=2", "train.grad_accum=2"'))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "gptzoo",
            "sweep",
            str(two),
            "--out",
            str(tmp_path / "dist"),
            "--json",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    distributed = json.loads(proc.stdout)  # one report, from the first process
    single = run_sweep(read_spec(one), tmp_path / "single")
    for a, b in zip(distributed["runs"], single["runs"], strict=True):
        assert a["variant"] == b["variant"] and a["tokens_per_step"] == b["tokens_per_step"] == 128
        for (step_a, loss_a), (step_b, loss_b) in zip(a["val_curve"], b["val_curve"], strict=True):
            assert step_a == step_b and loss_a == pytest.approx(loss_b, rel=1e-5)
    assert sorted(p.name for p in (tmp_path / "dist").glob("*.png")) == sorted(
        p.name for p in (tmp_path / "single").glob("*.png")
    )


def test_a_run_killed_after_its_last_checkpoint_is_evaluated_not_trained_again(tmp_path: Path, data: Path) -> None:
    spec = read_spec(write_spec(tmp_path / "spec", data, TWO, steps=6, seeds="[0]"))
    out = tmp_path / "out"
    run_sweep(spec, out)
    before = results(out)
    run = out / "runs" / "post" / "seed-0"
    # as if killed after the save, before its validation: a run directory of the order before issue 26
    (out / "results" / "post" / "seed-0.json").unlink()
    metrics = [
        line
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if '"val_loss"' not in line or '"step": 6,' not in line
    ]
    (run / "metrics.jsonl").write_text("\n".join(metrics) + "\n")
    saved = (run / "checkpoints" / "step-000006" / "model.safetensors").stat().st_mtime_ns
    run_sweep(spec, out, resume=True)
    assert (run / "checkpoints" / "step-000006" / "model.safetensors").stat().st_mtime_ns == saved  # not retrained
    assert results(out) == before


PRE_16 = TWO.replace('name = "pre"', 'name = "pre"\nset = ["train.seq_len=16"]')


@pytest.mark.parametrize(
    ("body", "lengths", "expected"),
    [
        (
            TWO + '[grid]\n"train.lr" = [1979-05-27]\n',
            "lengths = [32]",
            "grid key 'train.lr': cannot write datetime.date(1979, 5, 27) as TOML",
        ),
        (TWO + "[grid]\ntrain.lr = [1e-3]\n", "lengths = [32]", "grid key 'train' is a table: quote a dotted key"),
        (TWO, "lengths = [16, 64]\nstride = 24", "eval.stride 24 is longer than the length 16"),
        (PRE_16, "stride = 24", "variant 'pre': eval.stride 24 is longer than its training length"),
        (
            TWO,
            "lengths = [300, 1000]",
            "tiny.toml: 2 problems - variant 'pre' can score none of the [eval] lengths: 300, the shortest, is "
            "longer than the 256 positions that LearnedPosition encodes; give [eval] lengths of 256 or fewer - "
            "variant 'post' can score none",
        ),
    ],
)
def test_more_spec_problems_are_found_before_anything_starts(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str], body: str, lengths: str, expected: str
) -> None:
    spec = write_spec(tmp_path, data, body)
    spec.write_text(spec.read_text().replace("lengths = [32, 64]", lengths))
    message = run_error(capsys, "sweep", str(spec), "--out", str(tmp_path / "out"))
    assert expected in message, message
    assert not (tmp_path / "out").exists()


def test_a_bad_data_source_is_a_spec_problem_and_command_line_data_stands_in(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, data, TWO, steps=2, seeds="[0]")
    spec.write_text(spec.read_text().replace(f'path = "{data}"', 'prepare = "shakespear"'))
    message = run_error(capsys, "sweep", str(spec), "--out", str(tmp_path / "out"))
    assert "data.prepare: unknown source 'shakespear'" in message and "did you mean 'shakespeare'" in message
    assert not (tmp_path / "out").exists()
    spec.write_text(
        "\n".join(
            line
            for line in spec.read_text().splitlines()
            if "prepare" not in line and "[data]" not in line and "steps = 2" not in line and "[budget]" not in line
        )
    )
    report = run_json(
        capsys, "sweep", str(spec), "--out", str(tmp_path / "out"), "--data", str(data), "--budget", "tokens=128"
    )
    assert [r["steps"] for r in report["runs"]] == [2, 2]  # 128 tokens of 2 x 32 per step


MOE = {  # variant: (d_ff, total parameters, active parameters), from models built on the meta device
    "dense": (512, 858_880, 858_880),
    "e4-top1-active": (510, 2_433_248, 858_872),
    "e4-top2-active": (255, 1_384_688, 859_384),
    "e8-top1-active": (508, 4_518_016, 858_864),
    "e8-top2-active": (254, 2_429_120, 859_376),
    "e4-top1-total": (127, 858_352, 465_148),
    "e4-top2-total": (127, 858_352, 596_216),
    "e8-top1-total": (63, 858_336, 401_404),
    "e8-top2-total": (63, 858_336, 466_680),
}


def test_the_moe_sweeps_variants_have_the_dense_models_active_or_total_parameters() -> None:
    from gptzoo.registry import default_registry

    registry, spec = default_registry(), read_spec("moe")
    found = {
        name: (recipe.model.d_ff, parameters(recipe, registry), active_parameters(recipe, registry))
        for name, recipe in spec.recipes.items()
    }
    assert found == MOE
    for name, (_, total, active) in MOE.items():
        target = total if name.endswith("-total") else active
        assert abs(target / 858_880 - 1) < 0.01, name


def _check_moe_report(report: dict[str, Any], md: str) -> None:
    """The moe sweep's tiny run reports every variant's active and total parameters, and the MoE variants'
    expert load per layer (between 1, even, and E / k, collapsed)."""
    rows = {row["variant"]: row for row in report["variants"]}
    assert {
        name: (row["matched"]["value"] if row["matched"] else 512, row["params"], row["active_params"])
        for name, row in rows.items()
    } == MOE
    assert rows["dense"]["balance"] == {}
    for name in MOE.keys() - {"dense"}:
        layers = rows[name]["balance"]["expert_load_max_mean"]
        assert sorted(layers) == [f"blocks.{i}.mlp" for i in range(4)]
        assert all(1.0 <= v <= int(name[1]) for v in layers.values()), (name, layers)
    assert "| variant | params | active | FLOPs/token |" in md and "expert_load max/mean |" in md
    assert "| e8-top1-total (d_ff=63) | 858k | 401k |" in md


def test_a_run_shows_its_evaluation_as_it_goes(tmp_path: Path, data: Path) -> None:
    """The bar counts the final evaluation's windows (after the steps), so a long evaluation does not look hung."""
    import io

    from rich.console import Console

    from gptzoo.sweep.display import RunBar

    seen: list[tuple[int, int]] = []

    class Recording(RunBar):
        def evaluating(self, done: int, total: int) -> None:
            seen.append((done, total))
            super().evaluating(done, total)

    spec = read_spec(
        write_spec(tmp_path / "spec", data, TWO.split('[[variants]]\nname = "post"')[0], seeds="[0]", steps=2)
    )
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    run_sweep(spec, tmp_path / "out", display=lambda task, k, total: Recording(console, task.variant, 2))
    total = seen[-1][1]
    assert total > 1 and seen[-1] == (total, total) and all(t == total for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_a_misspelt_sweep_lists_what_there_is_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_error(capsys, "sweep", "positon") == (
        "error: no sweep spec 'positon': no such file, nor a shipped or a plugin's sweep; did you mean 'position'? "
        "(available: activation, attention, latent-attention, moe, norm-placement, position, token-mixer)"
    )
