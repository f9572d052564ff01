"""The conformance kit (gptzoo.testing) on fake plugins: a good ring-window attention with a
ring-buffer cache passes every check; plugins that each break one property fail exactly that check
with the detail a plugin author acts on; ``conformance`` works in an author's own pytest run, and
``gptzoo plugins --check`` reports the same results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fakedist import RING_WINDOW, SCALENORM, FakeSite, unitnorm

import gptzoo
from gptzoo.cli import main
from gptzoo.testing import CheckResult, run_conformance
from gptzoo.testing.harness import SIZES

BUILTIN_ATTENTION = "from gptzoo_plugins._attentions import CausalSelfAttention\n"

NON_CAUSAL = (
    BUILTIN_ATTENTION
    + '''
import torch.nn.functional as F


class Peeking(CausalSelfAttention):
    """Attention that forgets the causal mask."""

    def attend(self, q, k, v, ctx):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1])


@gptzoo.hookimpl
def register_attentions(register):
    register("peeking", Peeking)
'''
)

FORGETFUL_CACHE = (
    BUILTIN_ATTENTION
    + '''

class Forgetful(CausalSelfAttention):
    """Attention that never reads its cache: a decode step sees only its own token."""

    examples = []  # the defaults only, not the built-in's parameter sets

    def forward(self, x, ctx, cache=None):
        return super().forward(x, ctx, None)


@gptzoo.hookimpl
def register_attentions(register):
    register("forgetful", Forgetful)
'''
)

HALVED_FLOPS = (
    BUILTIN_ATTENTION
    + '''

class Halved(CausalSelfAttention):
    """Attention that declares causally halved score FLOPs."""

    examples = []  # the defaults only, not the built-in's parameter sets

    def flops(self, batch, seq_len):
        parts = super().flops(batch, seq_len)
        return {**parts, "attention scores": parts["attention scores"] // 2}


@gptzoo.hookimpl
def register_attentions(register):
    register("halved", Halved)
'''
)

NORM_BASE = '''
import torch
from torch import nn

from gptzoo.hf.tensor_map import TensorMap


class Norm(nn.Module):
    """A LayerNorm of its own."""

    def __init__(self, dim, *, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        return nn.functional.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
'''

HALF_MAPPED = (
    NORM_BASE
    + '''

class HalfMapped(Norm):
    """A norm whose Llama map forgets its bias."""


@gptzoo.hookimpl
def register_norms(register):
    register("half_mapped", HalfMapped)


@gptzoo.hookimpl
def register_hf_layouts(register):
    register(HalfMapped, "llama", weights=lambda norm: [TensorMap("weight", ("weight",))])
'''
)

NAN_IN_BF16 = (
    NORM_BASE
    + '''

class NanNorm(Norm):
    """A norm that overflows in bfloat16."""

    def forward(self, x):
        y = super().forward(x)
        return y * float("nan") if y.dtype == torch.bfloat16 else y


@gptzoo.hookimpl
def register_norms(register):
    register("nan_norm", NanNorm)
'''
)

PICKY = (
    NORM_BASE
    + '''

class Picky(Norm):
    """A norm for widths that are powers of 2."""

    @staticmethod
    def check(dim, *, eps=1e-5):
        return [] if dim & (dim - 1) == 0 else [f"dim {dim} is not a power of 2"]


@gptzoo.hookimpl
def register_norms(register):
    register("picky", Picky)
'''
)

BAD_EXAMPLES = (
    NORM_BASE
    + '''

class Examples(Norm):
    """A norm whose second example is not a dict."""

    examples = [{"eps": 1e-3}, "eps=1e-2"]


@gptzoo.hookimpl
def register_norms(register):
    register("bad_examples", Examples)
'''
)

SAMPLER_BASE = """
import torch

from gptzoo.interfaces import Sampler
"""

UNMASKING = (
    SAMPLER_BASE
    + '''

class Unmask(Sampler):
    """A step that turns -inf into 0."""

    def __call__(self, logits, input_ids):
        return logits.nan_to_num(neginf=0.0)


@gptzoo.hookimpl
def register_samplers(register):
    register("unmask", Unmask)
'''
)

UNSEEDED = (
    SAMPLER_BASE
    + '''

class Jitter(Sampler):
    """A step that adds noise from torch's global generator."""

    def __call__(self, logits, input_ids):
        return logits + 10 * torch.rand(logits.shape)


@gptzoo.hookimpl
def register_samplers(register):
    register("jitter", Jitter)
'''
)


def _results(site: FakeSite, source: str, kind: str, name: str) -> list[CheckResult]:
    site.add(name, f"gz_kit_{name}", source)
    registry = gptzoo.get_registry()
    return run_conformance(registry, [registry.get(kind, name)])


def _failed(results: list[CheckResult]) -> dict[str, str]:
    return {r.check: r.detail for r in results if r.status == "failed"}


def test_the_kit_checks_the_lowering_a_plugin_registers_against_its_forward(fake_site: FakeSite) -> None:
    right = {r.check: (r.status, r.detail) for r in _results(fake_site, unitnorm("plain"), "norm", "unitnorm")}
    assert right["decode_plan"] == ("passed", "decoded 9 tokens through the native plan")


def test_a_component_without_a_lowering_is_checked_on_the_split_path_generate_takes(fake_site: FakeSite) -> None:
    checks = {r.check: (r.status, r.detail) for r in _results(fake_site, SCALENORM, "norm", "scalenorm")}
    assert checks["decode_plan"] == (
        "passed",
        "decoded 9 tokens with its eager forward within the native step: gz_kit_scalenorm.ScaleNorm has no decode "
        "lowering",
    )


def test_a_lowering_that_computes_something_else_fails_the_decode_plan_check(fake_site: FakeSite) -> None:
    wrong = _failed(_results(fake_site, unitnorm("offset"), "norm", "unitnorm"))  # (1 + w) x, not w x
    assert list(wrong) == ["decode_plan", "decode_plan[unbiased]"]
    assert wrong["decode_plan"].startswith("decoding through its lowering differs from its eager forward at position")


PLAIN_MLP = """
from torch import nn

import gptzoo
from gptzoo.flops import linear_flops


class PlainMLP(nn.Module):
    '''c_proj(act(c_fc(x))), with a lowering that only describes unbiased layers.'''

    def __init__(self, d_model, d_ff, *, activation, bias=True):
        super().__init__()
        self.c_fc = nn.Linear(d_model, d_ff, bias=bias)
        self.act = activation
        self.c_proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))

    def flops(self, batch, seq_len):
        return {"mlp": linear_flops(batch * seq_len, self.c_fc, self.c_proj)}


def lower(plan, mlp, src, dst):
    if mlp.c_fc.bias is not None:
        plan.refuse("biased layers")
    h = plan.buffer(mlp.c_proj.in_features)
    plan.call(mlp.c_fc, src, h)
    plan.call(mlp.act, h, h, gated=False)
    plan.call(mlp.c_proj, h, dst)


@gptzoo.hookimpl
def register_mlps(register):
    register("plainmlp", PlainMLP)


@gptzoo.hookimpl
def register_decode_lowerings(register):
    register(PlainMLP, lower)
"""
FORGETS_THE_ACTIVATION = "    plan.call(mlp.act, h, h, gated=False)\n"


@pytest.mark.parametrize("wrong", [False, True])
def test_a_lowering_that_refuses_biases_is_checked_without_them(fake_site: FakeSite, wrong: bool) -> None:
    """The test model has biases, where this lowering refuses and the mlp runs eagerly; the unbiased model
    decodes through it, so a lowering that forgets the activation fails there."""
    assert FORGETS_THE_ACTIVATION in PLAIN_MLP
    source = PLAIN_MLP.replace(FORGETS_THE_ACTIVATION, "") if wrong else PLAIN_MLP
    checks = {r.check: (r.status, r.detail) for r in _results(fake_site, source, "mlp", "plainmlp")}
    assert checks["decode_plan"][0] == "passed" and "biased layers" in checks["decode_plan"][1]
    status, detail = checks["decode_plan[unbiased]"]
    if wrong:
        assert status == "failed" and detail.startswith("decoding through its lowering differs from its eager forward")
    else:
        assert (status, detail) == ("passed", "decoded 9 tokens through the native plan")


def test_a_ring_window_attention_with_a_ring_buffer_passes_every_check(fake_site: FakeSite) -> None:
    results = _results(fake_site, RING_WINDOW, "attention", "ring_window")
    assert [(r.check, r.status, r.detail) for r in results if r.status != "passed"] == []
    positions = gptzoo.get_registry().names("position")
    checks = {r.check: r.detail for r in results}
    assert {r.distribution for r in results} == {"gptzoo-fake-ring_window"}
    for p in positions:  # every registered position, with the default window (16) and the example's (3)
        for name in ("causality", "cache", "cache-padded"):
            assert f"{name}[{p}]" in checks and f"{name}[{p},window=3]" in checks
        # decoding past the window: 2 x 16 + 5 tokens, cut to the context of 32; 3 + 2 x 3 + 2 = 11, at least 12
        assert checks[f"cache[{p}]"] == "decoded 29 tokens after a prefill of 3"
        assert checks[f"cache[{p},window=3]"] == "decoded 9 tokens after a prefill of 3"
    assert checks["examples"] == "1 example parameter set"
    assert {f"build[{s.label},window=3]" for s in SIZES} <= set(checks)
    attn = sys.modules["gz_kit_ring_window"].RingWindowAttention(16, 4, n_kv_head=2, head_dim=4, bias=True, window=3)
    cache = attn.init_cache(2, 32, dtype=torch.bfloat16)
    assert cache.k.shape == (2, 2, 3, 4) and cache.max_len == 32  # only the window is kept
    assert attn.kv_bytes(2, 32, torch.bfloat16) == cache.nbytes == 2 * 2 * 2 * 3 * 4 * 2


def test_a_non_causal_attention_fails_causality_with_every_position(fake_site: FakeSite) -> None:
    failed = _failed(_results(fake_site, NON_CAUSAL, "attention", "peeking"))
    for p in gptzoo.get_registry().names("position"):
        assert failed[f"causality[{p}]"] == (
            "changing token 1 changed the logits at position 0: a query sees a later key; mask every key after "
            "the query"
        )


def test_a_cache_that_disagrees_with_recomputation_fails_the_cache_checks_only(fake_site: FakeSite) -> None:
    failed = _failed(_results(fake_site, FORGETFUL_CACHE, "attention", "forgetful"))
    positions = gptzoo.get_registry().names("position")
    # its cache is the dense one, which serve's movers know: gathered into a batch, it fails there too
    assert set(failed) == {f"{name}[{p}]" for p in positions for name in ("cache", "cache-padded", "cache-rows")}
    # a position bias makes the model's mask (over every key) meet the one key it attends to: that raises
    assert {d for d in (failed[f"cache[{p}]"] for p in positions) if not d.startswith("raised RuntimeError")} == {
        "decoding with the KV cache differs from recomputing without it at position 3 (a prefill of 3 tokens, then "
        "one token at a time to 12)"
    }


def test_wrong_declared_flops_fail_the_flops_check(fake_site: FakeSite) -> None:
    # plain size: d 16, 4 heads of 4, batch 2 x 8 tokens: projections 2 * 16 * (16 * 48 + 16 * 16),
    # scores 4 * 2 * 4 * 8 * 8 * 4 (halved: 4096)
    assert _failed(_results(fake_site, HALVED_FLOPS, "attention", "halved")) == {
        "flops": "flops(2, 8) declares 36864 FLOPs ({'attention projections': 32768, 'attention scores': 4096}), "
        "FlopCounterMode counts 40960 for a cache-less forward over those tokens; count executed matmul FLOPs, "
        "1 multiply-add = 2, attention scores over the full T x T square"
    }


def test_an_incomplete_layout_fails_the_hf_layouts_check(fake_site: FakeSite) -> None:
    assert _failed(_results(fake_site, HALF_MAPPED, "norm", "half_mapped")) == {
        "hf_layouts": "its 'llama' layout leaves bias of its state dict unmapped"
    }


def test_nan_output_fails_the_forward_check_at_every_size(fake_site: FakeSite) -> None:
    assert _failed(_results(fake_site, NAN_IN_BF16, "norm", "nan_norm")) == {
        f"forward[{s.label}]": "its bfloat16 forward produced NaN" for s in SIZES
    }


def test_a_size_the_component_refuses_is_skipped_with_its_reason(fake_site: FakeSite) -> None:
    results = _results(fake_site, PICKY, "norm", "picky")
    assert {r.check: r.detail for r in results if r.status == "skipped"} == {
        f"{check}[odd-heads]": "norm 'picky' refuses size odd-heads: dim 24 is not a power of 2"
        for check in ("build", "forward")
    }
    assert _failed(results) == {}


def test_bad_examples_fail_the_examples_check(fake_site: FakeSite) -> None:
    results = _results(fake_site, BAD_EXAMPLES, "norm", "bad_examples")
    assert _failed(results) == {"examples": "examples[1] is 'eps=1e-2', not a dict of parameter name -> value"}
    assert not any("eps=" in r.check for r in results)  # no example is run from a list that is broken


def test_a_sampler_that_unmasks_minus_inf_fails_the_sampler_check(fake_site: FakeSite) -> None:
    assert _failed(_results(fake_site, UNMASKING, "sampler", "unmask")) == {
        "sampler": "it turned the -inf logit of token 0 in row 1 into 0.0"
    }


def test_a_sampler_drawing_from_the_global_generator_fails_the_seeded_check(fake_site: FakeSite) -> None:
    failed = _failed(_results(fake_site, UNSEEDED, "sampler", "jitter"))
    assert failed.pop("seeded") == (
        "two generations with the same torch.Generator seed picked different tokens: draw random numbers only from "
        "the generator the chain passes (to pick, and to __call__ when it takes generator=), and forget "
        "per-generation state in reset(), which the chain calls before each generation"
    )
    # its noise, from the global generator, differs between the padded and the plain run too
    assert list(failed) == ["padding"] and failed["padding"].startswith("a prompt left-padded by 3 positions")


AUTHOR_TESTS = """
from gptzoo.testing import conformance

test_scalenorm = conformance("norm", "scalenorm")
test_half_mapped = conformance("norm", "half_mapped")
"""


def test_a_plugin_authors_test_file_runs_the_kit_under_pytest(fake_site: FakeSite, tmp_path: Path) -> None:
    fake_site.add("scalenorm", "gz_kit_scalenorm", SCALENORM)
    fake_site.add("half_mapped", "gz_kit_half_mapped", HALF_MAPPED)
    registry = gptzoo.get_registry()
    expected = run_conformance(registry, [registry.get("norm", n) for n in ("scalenorm", "half_mapped")])
    (tmp_path / "test_author.py").write_text(AUTHOR_TESTS, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_author.py"],
        cwd=tmp_path,
        env=fake_site.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"1 failed, {len(expected) - 1} passed" in done.stdout.splitlines()[-1]
    assert "FAILED test_author.py::test_half_mapped[norm:half_mapped-hf_layouts]" in done.stdout


def test_plugins_check_of_a_good_plugin(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # no cell wraps
    fake_site.add("scalenorm", "gz_kit_scalenorm", SCALENORM)
    assert main(["plugins", "--check", "scalenorm", "--json"]) == 0  # by entry-point name
    document = json.loads(capsys.readouterr().out)
    assert (document["components"], document["failed"]) == (1, 0)
    assert {(r["kind"], r["name"], r["distribution"], r["version"], r["status"]) for r in document["results"]} == {
        ("norm", "scalenorm", "gptzoo-fake-scalenorm", "1.0", "passed")
    }
    assert [r["check"] for r in document["results"]][:3] == ["examples", "build[plain]", "forward[plain]"]
    assert main(["plugins", "--check", "gptzoo-fake-scalenorm"]) == 0  # by distribution
    out = " ".join(capsys.readouterr().out.split())
    assert "│ norm:scalenorm │ gptzoo-fake-scalenorm 1.0 │ build[mqa] │ passed │" in out
    assert out.endswith(f"{len(document['results'])} passed, 0 failed, 0 skipped")
    # without NAME: every third-party component, whatever else is installed
    code = main(["plugins", "--check", "--json"])
    everything = json.loads(capsys.readouterr().out)
    third_party = [e for e in gptzoo.get_registry().entries() if e.provenance.distribution != "gptzoo"]
    assert everything["components"] == len(third_party)
    assert {r["distribution"] for r in everything["results"]} == {e.provenance.distribution for e in third_party}
    assert code == (1 if everything["failed"] else 0)


def test_plugins_check_of_a_bad_plugin_exits_1(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    fake_site.add("half_mapped", "gz_kit_half_mapped", HALF_MAPPED)
    assert main(["plugins", "--check", "norm:half_mapped", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    failed = [(r["check"], r["detail"]) for r in document["results"] if r["status"] == "failed"]
    assert document["failed"] == 1
    assert failed == [("hf_layouts", "its 'llama' layout leaves bias of its state dict unmapped")]
    assert main(["plugins", "--check", "half_mapped"]) == 1  # by entry-point name
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "│ norm:half_mapped │ gptzoo-fake-half_mapped 1.0 │ hf_layouts │ failed │ its 'llama' layout leaves bias of "
        "its state dict unmapped │"
    ) in out
    assert out.endswith(f"{len(document['results']) - 1} passed, 1 failed, 0 skipped")


def test_plugins_check_of_an_unknown_name_exits_2(fake_site: FakeSite, capsys: pytest.CaptureFixture[str]) -> None:
    fake_site.add("half_mapped", "gz_kit_half_mapped", HALF_MAPPED)
    assert main(["plugins", "--check", "nosuch"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: --check 'nosuch' names no plugin, distribution or component; plugins and ")
    assert " half_mapped," in captured.err and " gptzoo-fake-half_mapped," in captured.err
    assert captured.err.rstrip().endswith("components: KIND:NAME as `gptzoo list` shows them")
    assert "Traceback" not in captured.err and captured.out == ""


UNEVEN_STATS = (
    NORM_BASE
    + '''

class Uneven(Norm):
    """A norm that reports a share that does not sum to 1."""

    def stats(self):
        return {"spread": torch.tensor([0.5, 0.7])}


@gptzoo.hookimpl
def register_norms(register):
    register("uneven", Uneven)
'''
)


def test_a_share_that_is_no_share_fails_the_stats_check_and_a_stats_of_its_own_is_skipped(
    fake_site: FakeSite,
) -> None:
    results = {r.check: (r.status, r.detail) for r in _results(fake_site, UNEVEN_STATS, "norm", "uneven")}
    assert results["stats"] == (
        "failed",
        "stats()['spread'] is 1-D but not a share: its entries [0.5, 0.7] sum to 1.2 (a share's are non-negative and "
        "sum to 1)",
    )
    own = UNEVEN_STATS.replace("def stats(self):", "def stats(self, x):").replace('"uneven"', '"own_stats"')
    results = {r.check: (r.status, r.detail) for r in _results(fake_site, own, "norm", "own_stats")}
    assert results["stats"] == (
        "skipped",
        "its stats takes arguments: a method of its own, not contract 5's stats(), which training calls",
    )
    assert all(status != "failed" for status, _ in results.values()), results
