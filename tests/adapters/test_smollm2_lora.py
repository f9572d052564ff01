"""LoRA and DoRA on real weights, SmolLM2-135M (fetched once into the user cache), proven against peft: an
adapter `gptzoo finetune` trains for 30 steps lowers the held-out loss, and peft's PeftModel over
transformers' model gives the logits of `gptzoo generate --adapter`'s model within 1e-4 in float32; an adapter
peft made on every projection gives gptzoo peft's logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from cli_run import run_json

from gptzoo.cli import main
from gptzoo.fetch import fetch
from gptzoo.loader import load_any, with_adapter

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.slow

IDS = torch.tensor([[1, 504, 2365, 282, 260, 5059, 10416, 3453, 28, 2, 1789, 338, 253, 1476, 30, 42, 1055, 9]])
SHORT = ["--set", "train.seq_len=64", "--set", "train.micro_batch_size=2", "--set", "train.eval_batches=4"]


@pytest.fixture(scope="module")
def hf_dir() -> Path:
    return fetch("smollm2-135m")


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pydoc_data.topics import topics

    path = tmp_path_factory.mktemp("text") / "docs.txt"
    path.write_text("\n\n".join(topics[k] for k in sorted(topics))[:100_000], encoding="utf-8")
    return path


def peft_logits(hf_dir: Path, adapter: Path) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return peft.PeftModel.from_pretrained(model, str(adapter)).eval()(IDS).logits[0]


def gptzoo_logits(adapter: Path) -> torch.Tensor:
    model = with_adapter(load_any("smollm2-135m"), adapter).model.eval()  # as `gptzoo generate --adapter` loads it
    with torch.no_grad():
        return model(IDS)[0]


@pytest.mark.parametrize(
    ("flags", "steps"), [([], 30), (["--dora", "--targets", "q,k,v,o,gate,up,down"], 3)], ids=["lora", "dora"]
)
def test_finetuned_adapter_lowers_the_loss_and_peft_gives_the_same_logits(
    capsys: pytest.CaptureFixture[str], hf_dir: Path, text: Path, tmp_path: Path, flags: list[str], steps: int
) -> None:
    out = tmp_path / "run"
    summary = run_json(
        capsys,
        "finetune",
        "smollm2-135m",
        "--data",
        str(text),
        "--out",
        str(out),
        *SHORT,
        "--set",
        f"train.max_steps={steps}",
        *flags,
    )
    if not flags:
        assert summary["trainable_parameters"] == 30 * 8 * ((576 + 576) + (576 + 192))  # r 8 on q and v
        assert summary["val_loss"] < summary["val_loss_before"]
    theirs = peft_logits(hf_dir, out / "adapter")
    ours = gptzoo_logits(out / "adapter")
    assert (ours - theirs).abs().max() < 1e-4


def test_an_adapter_peft_made_on_every_projection(
    hf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    adapted.save_pretrained(tmp_path / "adapter")
    with torch.no_grad():
        theirs = adapted.eval()(IDS).logits[0]
    base = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        assert (base(IDS).logits[0] - theirs).abs().max() > 0.1  # the adapter matters
    assert (gptzoo_logits(tmp_path / "adapter") - theirs).abs().max() < 1e-4
    # compare --adapter runs both sides with it, and its title says so
    monkeypatch.setenv("COLUMNS", "400")  # the title on one line
    assert main(["compare", "smollm2-135m", "--adapter", str(tmp_path / "adapter"), "--new-tokens", "2"]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert title == (
        f"smollm2-135m: gptzoo vs Hugging Face + peft, both with {tmp_path / 'adapter'}, float32, 2 greedy tokens"
    )
