"""Generation: cached decoding against full recomputation, greedy parity with HF generate,
batching, EOS and stop strings, streaming, seeds, and the `gptzoo generate` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from tiny import PAIRS, tiny_model  # tests/ is on sys.path (pyproject: pythonpath)

import gptzoo
from gptzoo.cli import main
from gptzoo.hf import load_hf
from gptzoo.inference.generate import IncrementalDecoder, generate, generate_text
from gptzoo.inference.quantize import quantize
from gptzoo.inference.sampling import SamplerChain, chain_spec
from gptzoo.tokenizer import load_tokenizer

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()


@pytest.mark.parametrize(("base", "attention", "position"), PAIRS)
def test_cached_decoding_equals_full_recomputation_at_every_step(base: str, attention: str, position: str) -> None:
    model = tiny_model(base, f"model.attention={attention}", f"model.position={position}")
    prompt = torch.randint(0, model.recipe.model.vocab_size, (1, 7))
    tokens = generate(model, prompt.tolist(), 12)[0]
    seq = torch.cat([prompt[0], torch.tensor(tokens)])
    with torch.no_grad():
        cache = model.init_cache(1, 19)
        cached = [model(prompt, cache)[0, -1]] + [model(seq[t : t + 1][None], cache)[0, -1] for t in range(7, 18)]
        for step, logits in enumerate(cached):
            full = model(seq[None, : 7 + step])[0, -1]  # recompute everything so far
            torch.testing.assert_close(logits, full, rtol=0, atol=1e-5)
            assert int(full.argmax()) == tokens[step]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_greedy_equals_hf_generate(tmp_path: Path, family: str) -> None:
    torch.manual_seed(0)
    config = (
        transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=256)
        if family == "gpt2"
        else transformers.LlamaConfig(
            hidden_size=64,
            intermediate_size=176,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            max_position_embeddings=256,
        )
    )
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path).eval()
    prompt = torch.randint(0, config.vocab_size, (1, 11))
    expected = hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        do_sample=False,
        max_new_tokens=48,
        min_new_tokens=48,
        eos_token_id=None,
        pad_token_id=0,
    )
    assert generate(ours, prompt.tolist(), 48)[0] == expected[0, 11:].tolist()


def test_batched_rows_equal_each_row_alone() -> None:
    model = tiny_model("llama-tiny", "model.position=alibi")
    prompts = [[5, 9, 11, 2, 7, 3, 8], [42], [1, 2, 3, 4]]
    batch = generate(model, prompts, 10)
    assert batch == [generate(model, [p], 10)[0] for p in prompts]


def test_eos_ends_a_row_and_others_go_on() -> None:
    model = tiny_model("gpt2-tiny")
    prompts = [[5, 9, 11], [1, 2, 3, 4]]
    free = generate(model, prompts, 8)
    eos = free[0][2]  # the third token row 0 produces
    stopped = generate(model, prompts, 8, eos_token_id=eos)
    assert stopped[0] == free[0][: free[0].index(eos) + 1]  # up to and including EOS
    assert stopped[1] == (free[1][: free[1].index(eos) + 1] if eos in free[1] else free[1])


def test_stop_strings_and_streaming() -> None:
    model = tiny_model("gpt2-tiny")
    tokenizer = load_tokenizer("gpt2")
    prompt = [tokenizer.encode("Hello")]
    (full,), _ = generate_text(model, tokenizer, prompt, 12)
    stop = full.text[5:8]
    pieces: list[str] = []
    (cut,), speed = generate_text(
        model, tokenizer, prompt, 12, stop=[stop], stream=lambda row, text: pieces.append(text)
    )
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index(stop)]
    assert "".join(pieces) == cut.text and speed > 0
    assert full.finish_reason == "length" and len(full.tokens) == 12


def test_streaming_never_splits_a_multibyte_character() -> None:
    tokenizer = load_tokenizer("gpt2")
    text = "naïve café 🙂 日本語 ok"
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.push(t) for t in tokenizer.encode(text)]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert "" in pieces  # some token ended inside a character and was held back


def test_seeded_sampling_repeats() -> None:
    model = tiny_model("gpt2-tiny")
    registry = gptzoo.get_registry()
    chain = SamplerChain.from_registry(registry, chain_spec([], {"temperature": 1.5, "top_k": 100}, registry=registry))
    draw = lambda seed: generate(model, [[1, 2, 3]], 16, sampler=chain, generator=torch.Generator().manual_seed(seed))
    assert draw(7) == draw(7) and draw(7) != draw(8)


def test_chain_spec_from_recipe_and_flags(registry: gptzoo.Registry) -> None:
    recipe = [("temperature", {"temperature": 0.7}), ("top_p", {"p": 0.9})]
    assert chain_spec([], {}, registry=registry) == [("greedy", {})]
    assert chain_spec(recipe, {"top_k": 20, "repetition_penalty": 1.2}, registry=registry) == [
        ("repetition_penalty", {"penalty": 1.2}),
        ("temperature", {"temperature": 0.7}),
        ("top_k", {"k": 20}),
        ("top_p", {"p": 0.9}),
    ]
    assert chain_spec(recipe, {"temperature": 1.1}, registry=registry) == [
        ("temperature", {"temperature": 1.1}),
        ("top_p", {"p": 0.9}),
    ]
    assert chain_spec(recipe, {"temperature": 0, "repetition_penalty": 1.3}, registry=registry) == [
        ("repetition_penalty", {"penalty": 1.3}),
        ("greedy", {}),
    ]
    chain = SamplerChain.from_registry(registry, chain_spec(recipe, {"top_k": 5}, registry=registry))
    assert chain.describe() == "temperature(temperature=0.7) -> top_k(k=5) -> top_p(p=0.9) -> sample"


def test_cli_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "r.toml").write_text(
        'extends = "gpt2-tiny"\n[generate]\n'
        'samplers = [{ name = "temperature", temperature = 0.9 }, { name = "top_k", k = 40 }]\nmax_new_tokens = 6\n'
    )
    argv = [
        "generate",
        str(tmp_path / "r.toml"),
        "--prompt",
        "Hello",
        "--prompt",
        "The longer second prompt",
        "--seed",
        "3",
        "--json",
    ]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["sampler_chain"] == "temperature(temperature=0.9) -> top_k(k=40) -> sample"
    assert [len(t) for t in first["tokens"]] == [6, 6] and len(first["text"]) == 2 and first["tokens_per_s"] > 0
    assert main(argv) == 0 and json.loads(capsys.readouterr().out)["tokens"] == first["tokens"]  # seeded
    assert main([*argv, "--temperature", "0"]) == 0
    greedy = json.loads(capsys.readouterr().out)
    assert greedy["sampler"] == [{"name": "greedy"}]
    gptzoo.save_checkpoint(tiny_model("gpt2-tiny"), gptzoo.load_recipe("gpt2-tiny"), tmp_path / "ck")
    assert (
        main(["generate", "--checkpoint", str(tmp_path / "ck"), "--prompt", "Hi", "--max-new-tokens", "3", "--json"])
        == 0
    )
    assert len(json.loads(capsys.readouterr().out)["tokens"][0]) == 3


def test_cli_generate_int8_runs_the_quantized_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bytes_tokenizer = ("tokenizer.name=bytes",)
    model = tiny_model("llama-tiny", *bytes_tokenizer)
    gptzoo.save_checkpoint(model, gptzoo.load_recipe("llama-tiny", bytes_tokenizer), tmp_path / "ck")
    argv = ["generate", "--checkpoint", str(tmp_path / "ck"), "--prompt", "Hi there", "--max-new-tokens", "8"]
    assert main([*argv, "--dtype", "int8", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["tokens"][0]
    quantize(model, "int8")
    tokenizer = load_tokenizer("bytes")
    expected = generate(model, [tokenizer.encode("Hi there")], 8, vocab_size=tokenizer.vocab_size)[0]
    assert got == expected and len(got) == 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", ""], "error: --prompt is empty; give some text"),
        (
            ["--prompt", "word " * 200],
            "error: a prompt of 201 tokens is longer than the 128 positions that LearnedPosition encodes; shorten it",
        ),
        (["--prompt", "a", "--top-p", "1.5"], "error: sampler 'top_p': top_p p must be in (0, 1], got 1.5"),
        (
            ["--prompt", "a", "--temperature", "-1"],
            "error: sampler 'temperature': temperature must be > 0 (use the greedy sampler for 0), got -1.0",
        ),
        (["--prompt", "a", "--top-k", "0"], "error: sampler 'top_k': top_k k must be an integer >= 1, got 0"),
        (["--prompt", "a", "--checkpoint", "x"], "error: give either --checkpoint DIR or RECIPE / --hf, not both"),
    ],
)
def test_cli_generate_bad_input(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(["generate", "gpt2-tiny", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err.splitlines() and "Traceback" not in captured.err


def test_unknown_sampler_in_a_recipe(tmp_path: Path) -> None:
    (tmp_path / "r.toml").write_text(
        'extends = "gpt2-tiny"\n[generate]\nsamplers = ["top_kk", { name = "top_p", p = 1.5 }]\n'
    )
    with pytest.raises(gptzoo.RecipeError) as info:
        gptzoo.load_recipe(tmp_path / "r.toml")
    assert info.value.problems == [
        "[generate] samplers[0]: unknown sampler 'top_kk'; did you mean 'top_k'? "
        f"(available: {', '.join(gptzoo.get_registry().names('sampler'))})",
        "[generate] samplers[1] (top_p): top_p p must be in (0, 1], got 1.5",
    ]


@pytest.mark.slow
def test_smollm2_greedy_equals_hf_generate() -> None:
    from gptzoo.fetch import resolve_fetchable

    path = resolve_fetchable("smollm2-135m", fetch_missing=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    ours = load_hf(path, gptzoo.load_recipe("smollm2-135m")).eval()
    tokenizer = load_tokenizer("hf", hf_dir=path)
    prompt = tokenizer.encode("The three primary colours are")
    ids = torch.tensor([prompt])
    expected = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=40,
        min_new_tokens=40,
        eos_token_id=None,
    )
    assert generate(ours, [prompt], 40)[0] == expected[0, len(prompt) :].tolist()


def test_sentencepiece_style_continuations_keep_their_leading_space() -> None:
    """Metaspace tokenizers (Llama 2, Mistral) drop the leading space of a text's first token, so
    new tokens are decoded after the prompt's last ones."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from gptzoo.tokenizer import HFTokenizer

    raw = RawTokenizer(models.WordLevel({"<unk>": 0, "▁Hello": 1, "▁world": 2, "▁again": 3}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    raw.decoder = decoders.Metaspace(prepend_scheme="first")
    tokenizer = HFTokenizer(PreTrainedTokenizerFast(tokenizer_object=raw), directory=Path("."))
    prompt = tokenizer.encode("Hello")
    assert tokenizer.decode([2, 3]) == "world again"  # the problem: decoded alone, the space is gone
    decoder = IncrementalDecoder(tokenizer, prompt)
    assert "".join(decoder.push(t) for t in (2, 3)) == " world again"


def test_flags_override_a_recipe_that_ends_in_greedy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], registry: gptzoo.Registry
) -> None:
    assert chain_spec([("greedy", {})], {"temperature": 0.9}, registry=registry) == [
        ("temperature", {"temperature": 0.9})
    ]
    assert chain_spec([("greedy", {})], {"repetition_penalty": 1.2}, registry=registry) == [
        ("repetition_penalty", {"penalty": 1.2}),
        ("greedy", {}),
    ]
    (tmp_path / "r.toml").write_text('extends = "gpt2-tiny"\n[generate]\nsamplers = ["greedy", "top_k"]\n')
    with pytest.raises(gptzoo.RecipeError, match=r"samplers\[0\] \(greedy\) chooses the token, so it must come last"):
        gptzoo.load_recipe(tmp_path / "r.toml")
    assert main(["generate", "gpt2-tiny", "--prompt", "hi", "--stop", ""]) == 2
    assert "error: --stop is empty; give some text" in capsys.readouterr().err
    assert main(["generate", "gpt2-tiny", "--prompt", "a :smile: b", "--max-new-tokens", "1", "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("a :smile: b")  # model text is printed as it is
