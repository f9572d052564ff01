"""Samplers as plugins: flags derived from the registry, ``--sampler NAME:k=v``, ``--temperature 0``
dropping every sampling-only step, and the chain order against Hugging Face's."""

from __future__ import annotations

import json
import warnings

import pytest
from cli_run import run_error, run_json
from fakedist import FakeSite

import gptzoo
from gptzoo.cli import main
from gptzoo.cli.args import sampler_step
from gptzoo.errors import GptzooError
from gptzoo.inference.sampling import SamplerChain, chain_spec

SAMPLERS = '''
import torch

from gptzoo.interfaces import Sampler, SamplerFlag


class TokenBoost(Sampler):
    """Add bias to the logit of token 0 (a flagged step that only matters when sampling)."""

    flag = SamplerFlag("bias", 45, "add this to the logit of token 0")
    sampling_only = True

    def __init__(self, bias: float = 1.0) -> None:
        self.bias = bias

    def __call__(self, logits, input_ids):
        return logits + torch.nn.functional.one_hot(torch.tensor(0), logits.shape[-1]) * self.bias


class Ban(Sampler):
    """Forbid one token id (no flag; it applies to greedy decoding too)."""

    def __init__(self, token: int = 0) -> None:
        self.token = token

    def __call__(self, logits, input_ids):
        logits = logits.clone()
        logits[:, self.token] = float("-inf")
        return logits


class Flatten(Sampler):
    """Divide logits by 2 (no flag, sampling only)."""

    sampling_only = True

    def __call__(self, logits, input_ids):
        return logits / 2


@gptzoo.hookimpl
def register_samplers(register):
    register("token_boost", TokenBoost)
    register("ban", Ban)
    register("flatten", Flatten)
'''

BAD_FLAG = """
from gptzoo.interfaces import Sampler, SamplerFlag


class Fast(Sampler):
    flag = "--fast"


class Wrong(Sampler):
    flag = SamplerFlag("speed", 5, "go faster")

    def __init__(self, p: float = 0.5) -> None:
        self.p = p


class Clash(Sampler):
    flag = SamplerFlag("p", 5, "a good flag of a name that another sampler's flag has")

    def __init__(self, p: float = 0.5) -> None:
        self.p = p


@gptzoo.hookimpl
def register_samplers(register):
    register({name!r}, {cls})
"""

ARGV = ("generate", "gpt2-tiny", "--prompt", "Hello", "--max-new-tokens", "4", "--seed", "3")


@pytest.fixture
def site(fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> FakeSite:
    monkeypatch.delenv("GPTZOO_NO_PLUGINS", raising=False)
    monkeypatch.delenv("GPTZOO_STRICT_PLUGINS", raising=False)
    fake_site.add("samplers", "gptzoo_fake_samplers", SAMPLERS)
    return fake_site


def _chain(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[str, list[list[int]]]:
    result = run_json(capsys, *ARGV, *extra)
    return result["sampler_chain"], result["tokens"]


def test_a_plugin_samplers_flag_is_in_generate_help(site: FakeSite, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--help"])
    assert exit_.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "--token-boost BIAS add this to the logit of token 0 "
        "(from gptzoo_fake_samplers (gptzoo-fake-samplers 1.0))" in help_text
    )
    for flag in ("--repetition-penalty PENALTY", "--temperature TEMPERATURE", "--top-k K", "--top-p P", "--min-p P"):
        assert flag in help_text
    assert "--ban" not in help_text and "--flatten" not in help_text  # no flag: reachable as --sampler


def test_a_plugin_flag_takes_its_place_in_the_chain_and_works(
    site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    chain, tokens = _chain(capsys, "--token-boost", "1e9")
    assert chain == "token_boost(bias=1000000000.0) -> sample"
    assert tokens == [[0, 0, 0, 0]]
    chain, _ = _chain(capsys, "--min-p", "0.01", "--token-boost", "2", "--top-k", "5", "--temperature", "0.5")
    assert chain == "temperature(temperature=0.5) -> top_k(k=5) -> token_boost(bias=2.0) -> min_p(p=0.01) -> sample"


def test_a_sampler_without_a_flag_works_through_the_sampler_option(
    site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    chain, greedy = _chain(capsys)
    assert chain == "greedy"
    first = greedy[0][0]
    chain, banned = _chain(capsys, "--sampler", f"ban:token={first}")
    assert chain == f"ban(token={first}) -> greedy"  # nothing samples: greedy, as Hugging Face's default
    assert banned[0][0] != first
    chain, _ = _chain(capsys, "--sampler", "ban:token=7", "--temperature", "0.9", "--sampler", "flatten")
    assert chain == "temperature(temperature=0.9) -> ban(token=7) -> flatten -> sample"
    chain, _ = _chain(capsys, "--sampler", "top_k:k=3", "--sampler", "token_boost")  # a flagged step: by its order
    assert chain == "top_k(k=3) -> token_boost -> sample"
    chain, _ = _chain(capsys, "--sampler", "greedy", "--sampler", "flatten")  # a picking step goes last
    assert chain == "flatten -> greedy"


def test_a_step_written_before_contract_4_gets_neither_real_nor_generator(
    site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    chain = SamplerChain.from_registry(gptzoo.get_registry(), [("ban", {"token": 7}), ("greedy", {})])
    assert chain.keywords == [(), ()]  # __call__(logits, input_ids) and the built-in greedy: called as before
    chain.steps[0].reset = lambda token: None  # a method of that name that is not the contract's
    assert len(SamplerChain(chain.steps).resets) == 1  # left alone; greedy's (the base class's) is called
    argv = [*ARGV, "--sampler", "ban:token=7", "--prompt", "a much longer second prompt"]
    tokens = run_json(capsys, *argv)["tokens"]  # two prompts: the first is left-padded
    assert len(tokens) == 2 and all(len(row) == 4 and 7 not in row for row in tokens)


def test_sampler_steps_replace_the_recipes_and_drop_its_greedy(
    site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = ("--set", 'generate.samplers=[{ name = "ban", token = 1 }, { name = "top_k", k = 9 }, "greedy"]')
    chain, _ = _chain(capsys, *recipe)
    assert chain == "ban(token=1) -> top_k(k=9) -> greedy"
    chain, _ = _chain(capsys, *recipe, "--sampler", "ban:token=2", "--sampler", "flatten")
    assert chain == "ban(token=2) -> top_k(k=9) -> flatten -> sample"  # a sampling-only step asks for sampling


def test_temperature_zero_drops_every_sampling_only_step(site: FakeSite, capsys: pytest.CaptureFixture[str]) -> None:
    _, greedy = _chain(capsys)
    chain, tokens = _chain(capsys, "--temperature", "0", "--token-boost", "1e9", "--top-p", "0.5")
    assert chain == "greedy" and tokens == greedy
    chain, _ = _chain(capsys, "--temperature", "0", "--sampler", "flatten", "--sampler", "ban:token=3")
    assert chain == "ban(token=3) -> greedy"
    recipe = ("--set", 'generate.samplers=["token_boost", "repetition_penalty", "flatten", "top_k"]')
    chain, _ = _chain(capsys, *recipe, "--temperature", "0")
    assert chain == "repetition_penalty -> greedy"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--token-boost", "abc"], "gptzoo generate: error: argument --token-boost: 'abc' is not a number"),
        (["--token-boost", "inf"], "gptzoo generate: error: argument --token-boost: inf is not a finite number"),
        (["--top-k", "2.5"], "gptzoo generate: error: argument --top-k: '2.5' is not an integer"),
        (
            ["--ban", "3"],
            "gptzoo generate: error: unrecognized arguments: --ban 3 (sampler 'ban' has no flag of its own: give it as "
            "--sampler ban:PARAM=VALUE)",
        ),
        (
            ["--sampler", "ban:token=abc"],
            "gptzoo generate: error: argument --sampler: 'ban:token=abc': token=abc is not a TOML number, "
            "true/false or quoted string",
        ),
        (
            ["--sampler", ":token=3"],
            "gptzoo generate: error: argument --sampler: ':token=3' has no sampler name; write NAME or NAME:K=V,...",
        ),
        # a qualified name: what is available is listed qualified (whatever else is installed)
        (["--sampler", "ban:token"], "error: unknown sampler 'ban:token' (available: "),
        (
            ["--sampler", "ban:token=1,token=2"],
            "gptzoo generate: error: argument --sampler: 'ban:token=1,token=2' sets token twice",
        ),
        (
            ["--sampler", "ban:token=1,x"],
            "gptzoo generate: error: argument --sampler: 'ban:token=1,x': 'x' is not K=V (e.g. top_k:k=40)",
        ),
        (["--sampler", "ban:token=1.5"], "error: --sampler ban.token must be an integer, got 1.5 (float)"),
        (
            ["--sampler", "ban:tokn=1"],
            "error: --sampler ban.tokn: sampler 'ban' has no parameter 'tokn'; did you mean 'token'? "
            "(available: token)",
        ),
        (["--sampler", "bann"], "error: unknown sampler 'bann'; did you mean 'ban'? (available: "),
        (
            ["--top-k", "3", "--sampler", "top_k:k=4"],
            "error: --top-k 3 and --sampler top_k both set sampler 'top_k'; give it once",
        ),
        (
            ["--sampler", "ban", "--sampler", "ban:token=2"],
            "error: --sampler ban and --sampler ban both set sampler 'ban'; give it once",
        ),
        (
            ["--token-boost", "1", "--sampler", "greedy", "--sampler", "greedy"],
            "error: --sampler greedy and --sampler greedy both set sampler 'greedy'; give it once",
        ),
    ],
)
def test_bad_sampler_flags_are_one_message_and_exit_2(
    site: FakeSite, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    text = run_error(capsys, *ARGV, *extra)
    assert text.endswith(message) if not message.endswith("(available: ") else message in text, text
    if message.endswith("(available: "):
        listed = text.split("(available: ", 1)[1].rstrip(")").split(", ")
        assert ("gptzoo-fake-samplers:ban" if "ban:token" in message else "ban") in listed
    assert text.count("error:") == 1
    if message.startswith("gptzoo"):
        assert text.startswith("usage: gptzoo")
    else:
        assert text.startswith("error: ") or text.startswith("warning: ")


@pytest.mark.parametrize(
    ("name", "cls", "problem"),
    [
        (
            "seed",
            "Clash",
            "declares the flag --seed, which gptzoo generate already has; rename the sampler (it "
            "stays usable as --sampler)",
        ),
        ("fast", "Fast", "its flag is '--fast', not a gptzoo.interfaces.SamplerFlag"),
        ("wrong", "Wrong", "its flag's param 'speed' is not a parameter of its factory"),
        ("top-k", "Clash", None),
    ],
)
def test_a_malformed_flag_names_its_plugin(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str], name: str, cls: str, problem: str | None
) -> None:
    fake_site.add("bad", "gptzoo_fake_bad", BAD_FLAG.format(name=name, cls=cls))
    who = f"sampler {name!r} from gptzoo_fake_bad (gptzoo-fake-bad 1.0)"
    if problem is None:  # "top-k" and the built-in "top_k" both make --top-k
        assert run_error(capsys, *ARGV) == (
            f"error: {who} and sampler 'top_k' from gptzoo_plugins.samplers (gptzoo {gptzoo.__version__}) declare "
            "the same flag --top-k; rename one of the samplers (each stays usable as --sampler)"
        )
        return
    fix = "" if problem.startswith("declares") else "; fix the plugin, or choose another sampler"
    assert run_error(capsys, *ARGV, "--json") == f"error: {who} {problem}{fix}"
    assert main(["build", "gpt2-tiny", "--json"]) == 0  # other commands do not read sampler flags
    assert json.loads(capsys.readouterr().out)["recipe"]["name"] == "gpt2-tiny"


def test_sampler_option_syntax() -> None:
    assert sampler_step("top_k:k=40") == ("top_k", {"k": 40})
    assert sampler_step("x:p=0.9, on=true,s='a:b'") == ("x", {"p": 0.9, "on": True, "s": "a:b"})
    assert sampler_step("greedy") == ("greedy", {})
    assert sampler_step("gptzoo-extras:typical_p") == ("gptzoo-extras:typical_p", {})  # a qualified name
    assert sampler_step("gptzoo-extras:typical_p:p=0.9") == ("gptzoo-extras:typical_p", {"p": 0.9})


def test_library_flags_name_registered_samplers(registry: gptzoo.Registry) -> None:
    with pytest.raises(GptzooError) as excinfo:
        chain_spec([], {"top_kk": 3}, registry=registry)
    assert str(excinfo.value).startswith("no registered sampler has the flag --top-kk; flags: --repetition-penalty, ")


HF_PROCESSORS = {
    "RepetitionPenaltyLogitsProcessor": "repetition_penalty",
    "TemperatureLogitsWarper": "temperature",
    "TopKLogitsWarper": "top_k",
    "TopPLogitsWarper": "top_p",
    "MinPLogitsWarper": "min_p",
}
"""Hugging Face's logits processors of the built-in samplers' flags."""


@pytest.mark.parametrize(
    "flags",
    [
        {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.2},
        {"min_p": 0.1, "temperature": 1.3},
        {"top_p": 0.8, "repetition_penalty": 1.1},
        {"temperature": 0, "top_k": 5, "repetition_penalty": 1.3},
    ],
)
def test_the_chain_of_the_flags_is_hugging_faces(registry: gptzoo.Registry, flags: dict[str, float]) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8, bos_token_id=None, eos_token_id=None
    )
    model = transformers.GPT2LMHeadModel(config)
    sampling = flags.get("temperature") != 0
    hf_flags = {k: v for k, v in flags.items() if sampling or k == "repetition_penalty"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unset = {"top_k": None, "top_p": None}  # GenerationConfig's defaults (50, 1.0) would add steps
        generation = transformers.GenerationConfig(do_sample=sampling, **{**unset, **hf_flags})
        hf = [HF_PROCESSORS[type(p).__name__] for p in model._get_logits_processor(generation, device="cpu")]
    ours = [name for name, _ in chain_spec([], flags, registry=registry)]
    assert ours == [*hf, *([] if sampling else ["greedy"])]


def test_only_generate_builds_the_registry_before_parsing_and_only_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = []
    real = gptzoo.cli.library.get_registry

    def counting(*args: object, **kwargs: object) -> gptzoo.Registry:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(gptzoo.cli.library, "get_registry", counting)
    for argv in (["--help"], ["build", "--help"], ["recipes", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
    assert calls == []  # `gptzoo --help` and other commands do not load plugins to parse
    capsys.readouterr()
    run_json(capsys, *ARGV, "--top-k", "3")
    assert calls == [1]
