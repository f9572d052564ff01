"""Generation against hostile input: non-finite weights, extreme temperatures, seeds, vocabularies
that disagree, invalid UTF-8, lengths that do not fit, and recipes without a usable tokenizer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from cli_run import run_error, run_json  # tests/ is on sys.path (pyproject: pythonpath)
from tiny import tiny_model
from torch import nn

import gptzoo
from gptzoo.cli import main
from gptzoo.errors import GptzooError
from gptzoo.inference import generate as generate_module
from gptzoo.inference.generate import (
    check_seed,
    encode_prompts,
    fit_new_tokens,
    generate,
    generate_text,
    make_generator,
)
from gptzoo.inference.sampling import SamplerChain, chain_spec
from gptzoo.recipe import recipe_tokenizer
from gptzoo.tokenizer import HFTokenizer, load_tokenizer
from gptzoo_plugins._samplers import Temperature


def cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The error line of a command that must exit 2 (after any warning, e.g. about random weights)."""
    message = run_error(capsys, *argv)
    assert "error: " in message
    return message[message.index("error: ") :]


NAN_MESSAGE = (
    "new token {step}: the model's logits for {rows} are not finite (NaN or infinity): its weights hold NaN or "
    "infinity (e.g. from a diverged training run){hint}; check the weights"
)


def _chains() -> list[SamplerChain | None]:
    """No chain (argmax), a chain ending in greedy, and a sampling chain."""
    registry = gptzoo.get_registry()
    return [
        None,
        SamplerChain.from_registry(registry, chain_spec([], {"temperature": 0}, registry=registry)),
        SamplerChain.from_registry(registry, chain_spec([], {"temperature": 0.8, "top_k": 20}, registry=registry)),
    ]


# --- 1. non-finite weights ---------------------------------------------------------------------


@pytest.mark.parametrize("chain", _chains(), ids=["argmax", "greedy", "sampled"])
def test_nan_weights_name_the_new_token_and_the_prompts(chain: SamplerChain | None) -> None:
    model = tiny_model("llama-tiny")  # untied: a NaN embedding row reaches only the prompts holding it
    first = generate(model, [[1, 2]], 1)[0][0]
    with torch.no_grad():
        model.wte.weight[7] = float("nan")
        model.wte.weight[first] = float("inf")
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(GptzooError) as exc:
        generate(model, [[3, 7], [1, 2], [7]], 4, sampler=chain, generator=gen)
    assert str(exc.value) == NAN_MESSAGE.format(step=1, rows="prompts 1, 3", hint="")
    if chain is None or chain.steps[-1].picks:  # greedy: the first new token is `first`, fed back at step 2
        with pytest.raises(GptzooError) as exc:
            generate(model, [[1, 2]], 4, sampler=chain)
        assert str(exc.value) == NAN_MESSAGE.format(step=2, rows="prompt 1", hint="")


def test_nan_weights_in_bfloat16_suggest_float32() -> None:
    model = tiny_model("llama-tiny").to(torch.bfloat16)
    with torch.no_grad():
        model.wte.weight[7] = float("nan")
    with pytest.raises(GptzooError) as exc:
        generate(model, [[7]], 2)
    hint = ", or its activations overflow bfloat16 (try float32)"
    assert str(exc.value) == NAN_MESSAGE.format(step=1, rows="prompt 1", hint=hint)


def test_cli_checkpoint_with_nan_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tiny_model("gpt2-tiny")
    with torch.no_grad():
        model.blocks[0].ln_1.weight[0] = float("nan")
    gptzoo.save_checkpoint(model, gptzoo.load_recipe("gpt2-tiny"), tmp_path / "ck")
    for extra in ([], ["--temperature", "0.7", "--seed", "1"]):
        message = cli_error(
            capsys,
            "generate",
            "--checkpoint",
            str(tmp_path / "ck"),
            "--prompt",
            "hi",
            "--max-new-tokens",
            "3",
            "--json",
            *extra,
        )
        assert message == (  # refused at load, in every dtype (issue 42), before any token
            f"error: {tmp_path / 'ck' / 'model.safetensors'}: 'blocks.0.ln_1.weight' holds NaN or infinite values "
            "(e.g. from a diverged training run), which make every output NaN; load an earlier checkpoint of the run"
        )


def test_int8_refuses_nan_weights_before_rounding_them_away(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tiny_model("gpt2-tiny")
    path, linear = next((p, m) for p, m in model.named_modules() if type(m) is torch.nn.Linear)
    with torch.no_grad():
        linear.weight[0, 0] = float("nan")
    gptzoo.save_checkpoint(model, gptzoo.load_recipe("gpt2-tiny"), tmp_path / "ck")
    text = tmp_path / "text.txt"
    text.write_text("hello world " * 40, encoding="utf-8")
    expected = (  # refused when the checkpoint loads, before int8 could round them away
        f"error: {tmp_path / 'ck' / 'model.safetensors'}: '{path}.weight' holds NaN or infinite values (e.g. from a "
        "diverged training run), which make every output NaN; load an earlier checkpoint of the run"
    )
    ck = str(tmp_path / "ck")
    assert cli_error(capsys, "generate", ck, "--prompt", "hi", "--max-new-tokens", "3", "--dtype", "int8") == expected
    assert cli_error(capsys, "eval", ck, "--text", str(text), "--lengths", "32", "--dtype", "int8") == expected


# --- 2. extreme temperatures -------------------------------------------------------------------


def test_a_tiny_temperature_is_greedy_instead_of_nan() -> None:
    inf = float("inf")
    logits = torch.tensor([[1e9, 0.0, -3.0, -inf], [1.0, 2.0, 3.0, 4.0]])  # row 0 overflows at 1e-30
    assert torch.equal(
        Temperature(1e-30)(logits, None), torch.tensor([[0.0, -inf, -inf, -inf], [1e30, 2e30, 3e30, 4e30]])
    )
    for t in (1e-45, 1e-300):  # a subnormal, and 0 in float32
        assert torch.equal(
            Temperature(t)(logits, None), torch.tensor([[0.0, -inf, -inf, -inf], [-inf, -inf, -inf, 0.0]])
        )
    # a huge temperature is uniform over the tokens still allowed (-inf / inf would be NaN)
    assert torch.equal(Temperature(1e300)(logits, None)[0], torch.tensor([0.0, 0.0, 0.0, -inf]))
    chain = SamplerChain.from_registry(gptzoo.get_registry(), [("temperature", {"temperature": 1e-30})])
    draws = chain(torch.cat([logits] * 32), torch.zeros(64, 1, dtype=torch.long), torch.Generator().manual_seed(0))
    assert draws.tolist() == [0, 3] * 32


def test_cli_tiny_temperatures_equal_greedy(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "gpt2-tiny", "--prompt", "Hello", "--max-new-tokens", "6", "--seed", "5"]
    greedy = run_json(capsys, *argv, "--temperature", "0")["tokens"]
    for t in ("1e-30", "1e-40", "1e-300"):
        assert run_json(capsys, *argv, "--temperature", t, "--top-p", "0.9")["tokens"] == greedy, t


def test_a_chain_that_breaks_the_logits_is_named() -> None:
    chain = SamplerChain.from_registry(gptzoo.get_registry(), [("repetition_penalty", {"penalty": 1e-50})])
    with pytest.raises(GptzooError) as exc:
        chain(torch.tensor([[2.0, 1.0], [1.0, 2.0]]), torch.tensor([[0], [0]]))
    assert str(exc.value) == (
        "the sampler chain repetition_penalty(penalty=1e-50) -> sample turned the logits of prompts 1, 2 into NaN "
        "or infinity (or masked every token): a parameter is too extreme for them (e.g. a penalty near 0)"
    )


# --- 3. seeds ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [2**64, 2**70, -1, True])
def test_seeds_beyond_64_bits(seed: int) -> None:
    with pytest.raises(GptzooError) as exc:
        check_seed(seed)
    assert (
        str(exc.value) == f"--seed {seed!r} is out of range; give an integer from 0 to 18446744073709551615 (2**64 - 1)"
    )
    with pytest.raises(GptzooError):
        make_generator(seed, "cpu")


def test_seeds_at_the_ends_of_the_range() -> None:
    assert make_generator(None, "cpu") is None and check_seed(None) is None
    for seed in (0, 2**64 - 1):
        assert make_generator(seed, "cpu").initial_seed() == seed  # type: ignore[union-attr]


# --- 4, 5. vocabularies that disagree ----------------------------------------------------------


def test_prompt_ids_beyond_the_models_vocabulary(capsys: pytest.CaptureFixture[str]) -> None:
    message = cli_error(
        capsys,
        "generate",
        "gpt2-tiny",
        "--set",
        "model.vocab_size=100",
        "--prompt",
        "hi",
        "--max-new-tokens",
        "3",
        "--json",
    )
    assert message == (
        "error: prompt 1 has token id 5303, outside the model's vocabulary (vocab_size 100), while the gpt2 tokenizer "
        "has 50257 ids; give the model a vocab_size of at least 50257 or use the tokenizer it was trained with"
    )
    model = tiny_model("llama-tiny")
    with pytest.raises(GptzooError) as exc:
        generate(model, [[1], [3, 512]], 2)
    assert str(exc.value) == "prompt 2 has token id 512, outside the model's vocabulary (0..511)"
    with pytest.raises(GptzooError) as exc:
        generate_text(model, load_tokenizer("bytes"), [[1], [3, 300]], 2)
    assert str(exc.value) == "prompt 2 has token id 300, outside the bytes tokenizer's vocabulary (0..255)"


def test_prompt_ids_are_checked_before_anything_is_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ck = tmp_path / "ck"
    run_json(capsys, "build", "llama-tiny", "--set", "tokenizer.name=bytes", "--out", str(ck))  # vocab_size 512
    assert main(["generate", "--checkpoint", str(ck), "--set", "tokenizer.name=gpt2", "--prompt", "hello"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # neither the prompt nor the sampler line went out first
    assert captured.err == (
        "error: prompt 1 has token id 31373, outside the model's vocabulary (vocab_size 512), while the gpt2 "
        "tokenizer has 50257 ids; give the model a vocab_size of at least 50257 or use the tokenizer it was trained "
        "with\n"
    )


def test_ids_the_tokenizer_cannot_decode_are_never_chosen(capsys: pytest.CaptureFixture[str]) -> None:
    model = tiny_model("llama-tiny")
    head = nn.Linear(64, 512, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[300] = 1e4  # the model always wants id 300, which the bytes tokenizer lacks
    model.lm_head = head
    assert generate(model, [[1, 2]], 3) == [[300, 300, 300]]
    assert all(t < 256 for t in generate(model, [[1, 2]], 3, vocab_size=256)[0])
    (result,), _ = generate_text(model, load_tokenizer("bytes"), [[104, 105]], 5)
    assert len(result.tokens) == 5 and all(t < 256 for t in result.tokens)
    # sampling from random weights over 512 ids: half of them would be >= 256 without the mask
    out = run_json(
        capsys,
        "generate",
        "llama-tiny",
        "--set",
        "tokenizer.name=bytes",
        "--prompt",
        "hi",
        "--max-new-tokens",
        "60",
        "--temperature",
        "1.5",
        "--seed",
        "0",
    )
    assert len(out["tokens"][0]) == 60 and max(out["tokens"][0]) < 256


# --- 6. invalid UTF-8 --------------------------------------------------------------------------


UTF8_FIX = "give UTF-8 text (e.g. set the terminal or file to UTF-8)"


@pytest.mark.parametrize("name", ["bytes", "gpt2"])
def test_prompts_that_are_not_utf8(name: str) -> None:
    tokenizer = load_tokenizer(name)
    with pytest.raises(GptzooError) as exc:
        encode_prompts(tokenizer, ["ok", "a\udcffb"])
    assert str(exc.value) == rf"--prompt 'a\udcffb' is not valid UTF-8 (byte 0xff at character 1); {UTF8_FIX}"
    with pytest.raises(GptzooError) as exc:
        tokenizer.encode("x" * 50 + "\ud800")
    assert str(exc.value) == (
        f"text '{'x' * 40}'... is not valid UTF-8 (lone surrogate U+D800 at character 50); {UTF8_FIX}"
    )


def test_hf_tokenizer_rejects_invalid_utf8() -> None:
    tokenizer = _hf_tokenizer()
    with pytest.raises(GptzooError) as exc:
        tokenizer.encode("Hello \udcc3")
    assert str(exc.value) == rf"text 'Hello \udcc3' is not valid UTF-8 (byte 0xc3 at character 6); {UTF8_FIX}"


def test_cli_prompt_that_is_not_utf8(capsys: pytest.CaptureFixture[str]) -> None:
    message = cli_error(
        capsys,
        "generate",
        "llama-tiny",
        "--set",
        "tokenizer.name=bytes",
        "--prompt",
        "a\udcffb",
        "--max-new-tokens",
        "3",
    )
    # "text" until the CLI encodes through encode_prompts, which names --prompt
    assert re.fullmatch(
        rf"error: (text|--prompt) 'a\\udcffb' is not valid UTF-8 \(byte 0xff at character 1\); {re.escape(UTF8_FIX)}",
        message,
    )


def test_cli_stop_string_that_is_not_utf8(capsys: pytest.CaptureFixture[str]) -> None:
    message = cli_error(capsys, "generate", "gpt2-tiny", "--prompt", "a", "--stop", "x\udcff", "--max-new-tokens", "3")
    assert message == rf"error: --stop 'x\udcff' is not valid UTF-8 (byte 0xff at character 1); {UTF8_FIX}"


# --- 7. new tokens that do not fit -------------------------------------------------------------


def test_the_default_number_of_new_tokens_is_capped_to_the_context() -> None:
    model = tiny_model("gpt2-tiny")  # context 128
    assert fit_new_tokens(model, [[1], [1, 2, 3]], 128, explicit=False) == (
        125,
        "generating at most 125 new tokens, not the recipe's max_new_tokens 128: the 128 positions that "
        "LearnedPosition encodes hold 3 prompt tokens; --max-new-tokens N sets it",
    )
    assert fit_new_tokens(model, [[1]], 20, explicit=False) == (20, None)
    assert fit_new_tokens(model, [[1]], 127, explicit=True) == (127, None)
    with pytest.raises(GptzooError) as exc:
        fit_new_tokens(model, [[1]], 128, explicit=True)
    assert str(exc.value) == (
        "1 prompt tokens + 128 new tokens (--max-new-tokens) exceed the 128 positions that LearnedPosition encodes; "
        "ask for at most 127"
    )
    for explicit in (True, False):
        with pytest.raises(GptzooError) as exc:
            fit_new_tokens(model, [list(range(128))], 128, explicit=explicit)
        assert str(exc.value) == (
            "a prompt of 128 tokens fills the 128 positions that LearnedPosition encodes, leaving no room for new "
            "tokens; shorten it"
        )
    with pytest.raises(GptzooError) as exc:
        generate(model, [[1]], 0)
    assert str(exc.value) == "the number of new tokens must be an integer >= 1, got 0"
    for prompts in ([], [[1], []]):
        with pytest.raises(GptzooError) as exc:
            generate_text(model, load_tokenizer("bytes"), prompts, 2)
        assert str(exc.value) == "every prompt needs at least one token"


def test_a_kv_cache_beyond_the_free_memory_is_refused_before_it_is_allocated(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(generate_module, "available_bytes", lambda device: 2**30)
    unlimited = ["llama-tiny", "--set", "model.context_length=2147483647", "--set", "tokenizer.name=bytes"]
    # RoPE has no position limit; 2 layers x (k, v) x 2 KV heads x head_dim 16 x 4 bytes = 512 bytes a token
    message = cli_error(
        capsys, "generate", *unlimited, "--prompt", "hi", "--prompt", "hello", "--max-new-tokens", "2000000000"
    )
    assert message == (
        "error: 2000000000 new tokens after 2 prompts of up to 5 tokens need a KV cache of 1.86 TiB, but 1.00 GiB of "
        "memory is available (cpu); ask for fewer new tokens (--max-new-tokens) or give fewer prompts"
    )
    model = tiny_model("llama-tiny")
    assert model.init_cache(2, 2000000005, device="meta").nbytes == 2 * 2000000005 * 512
    message = cli_error(capsys, "generate", *unlimited, "--prompt", "hi", "--max-new-tokens", "4000000")
    assert message == (
        "error: 4000000 new tokens after a prompt of 2 tokens need a KV cache of 1.91 GiB, but 1.00 GiB of memory is "
        "available (cpu); ask for fewer new tokens (--max-new-tokens) or give fewer prompts"
    )
    out = run_json(capsys, "generate", *unlimited, "--prompt", "hi", "--max-new-tokens", "3")
    assert len(out["tokens"][0]) == 3


# --- 8, 9. recipes and their tokenizers --------------------------------------------------------


def test_a_recipe_whose_tokenizer_comes_with_hf_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head = (
        "the tokenizer that comes with Hugging Face weights, and this model has none; "
        "generate from the Hugging Face checkpoint (--hf DIR) "
    )
    bytes_fix = (
        "or choose an offline tokenizer that its vocab_size {} covers: --set tokenizer.name=bytes, or "
        '[tokenizer] name = "bytes" in a checkpoint\'s recipe.toml'
    )
    run_json(capsys, "build", "llama-tiny", "--out", str(tmp_path / "ck"))
    with pytest.raises(GptzooError) as exc:
        recipe_tokenizer(gptzoo.load_checkpoint(tmp_path / "ck").recipe)
    assert str(exc.value) == f"recipe 'ck' has no [tokenizer] (so \"hf\"), {head}{bytes_fix.format(512)}"
    with (tmp_path / "ck" / "recipe.toml").open("a") as f:
        f.write('[tokenizer]\nname = "bytes"\n')
    argv = ["generate", "--checkpoint", str(tmp_path / "ck"), "--prompt", "hé", "--max-new-tokens", "9"]
    out = run_json(capsys, *argv)
    assert len(out["tokens"][0]) == 9 and max(out["tokens"][0]) < 256  # 512 ids, the bytes' 256 chosen from
    with pytest.raises(GptzooError) as exc:
        recipe_tokenizer(gptzoo.load_recipe("tinyllama-1.1b", ["tokenizer.name=hf"]))
    assert str(exc.value) == f"recipe 'tinyllama-1.1b' has [tokenizer] name = \"hf\", {head}{bytes_fix.format(32000)}"
    with pytest.raises(GptzooError) as exc:
        recipe_tokenizer(gptzoo.load_recipe("llama-tiny", ["model.vocab_size=200"]))
    assert str(exc.value) == (
        f"recipe 'llama-tiny' has no [tokenizer] (so \"hf\"), {head}(no offline tokenizer fits its vocab_size 200)"
    )
    assert recipe_tokenizer(gptzoo.load_recipe("llama-tiny", ["tokenizer.name=bytes"])).name == "bytes"


def test_unknown_tokenizer_name_suggests_one() -> None:
    with pytest.raises(GptzooError) as exc:
        load_tokenizer("byte")
    assert str(exc.value) == "unknown tokenizer 'byte'; did you mean 'bytes'? (available: gpt2, hf, bytes)"


# --- beyond the list ---------------------------------------------------------------------------


def _hf_tokenizer(strip: bool = False) -> HFTokenizer:
    """A word-level HF tokenizer (optionally stripping whitespace, so that " " encodes to nothing)."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.WordLevel({"<unk>": 0, "Hello": 1, "world": 2}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    if strip:
        raw.normalizer = normalizers.Strip()
    return HFTokenizer(PreTrainedTokenizerFast(tokenizer_object=raw), directory=Path("tok"))


def test_prompts_without_tokens() -> None:
    with pytest.raises(GptzooError) as exc:
        encode_prompts(load_tokenizer("bytes"), ["a", ""])
    assert str(exc.value) == "--prompt is empty; give some text"
    with pytest.raises(GptzooError) as exc:
        encode_prompts(_hf_tokenizer(strip=True), ["Hello", "   "])
    assert str(exc.value) == "--prompt '   ' encodes to no tokens with the hf tokenizer"
    assert encode_prompts(_hf_tokenizer(), ["Hello world", "x"]) == [[1, 2], [0]]


def test_chat_without_a_template(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_error(
        capsys,
        "generate",
        "llama-tiny",
        "--set",
        "tokenizer.name=bytes",
        "--prompt",
        "hi",
        "--chat",
        "--max-new-tokens",
        "3",
    ) == ("error: the bytes tokenizer has no chat template; give a plain prompt")
    assert cli_error(capsys, "generate", "gpt2-tiny", "--prompt", "hi", "--chat", "--max-new-tokens", "3") == (
        "error: the gpt2 tokenizer has no chat template (gpt2 is not an instruction-tuned model); give a plain "
        "prompt, or use an instruct checkpoint with --hf DIR"
    )
    with pytest.raises(GptzooError) as exc:
        encode_prompts(_hf_tokenizer(), ["hi"], chat=True)
    assert str(exc.value) == "the tokenizer in 'tok' has no chat template; give a plain prompt"


def test_a_prompt_of_special_tokens_and_a_stop_string_longer_than_the_output(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_json(capsys, "generate", "gpt2-tiny", "--prompt", "<|endoftext|>", "--max-new-tokens", "3")
    assert len(out["tokens"][0]) == 3 and out["finish_reasons"] == ["length"]
    stop = "x" * 500
    argv = ["generate", "gpt2-tiny", "--prompt", "Hi", "--max-new-tokens", "4", "--stop", stop, "--seed", "2"]
    out = run_json(capsys, *argv)
    assert out["finish_reasons"] == ["length"] and len(out["tokens"][0]) == 4 and out["text"][0]
    assert main(argv) == 0  # streamed: the held-back text is printed at the end
    assert capsys.readouterr().out == f"Hi{out['text'][0]}\n"


def test_hf_tokenizer_directory_missing_its_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "GPT2Tokenizer"}')
    with pytest.raises(GptzooError) as exc:
        load_tokenizer("hf", hf_dir=tmp_path)
    assert str(exc.value) == (
        f"the tokenizer in {str(tmp_path)!r} has 1 tokens and encodes 'Hello' to none: its vocabulary is missing "
        "(files: tokenizer_config.json; expected one of tokenizer.json, tokenizer.model, vocab.json, vocab.txt, "
        "spiece.model); save the whole tokenizer there with tokenizer.save_pretrained(DIR)"
    )
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0}))
    with pytest.raises(GptzooError) as exc:
        load_tokenizer("hf", hf_dir=tmp_path)
    assert str(exc.value).startswith(
        f"cannot load the tokenizer in {str(tmp_path)!r} (files: tokenizer_config.json, vocab.json): "
    )
