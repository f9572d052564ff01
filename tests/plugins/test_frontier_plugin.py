"""A plugin distribution with the components the frontier families need, through the public members
of contracts 3 and 4 only: a FIRE-style learned position that declares its FLOPs (a pairwise MLP over
every query-key distance), a routed mixture-of-experts MLP with a load-balancing auxiliary loss and its
active parameters, a multi-head latent attention whose cache holds a latent of width c plus a rotary
part of width r, declaring its decode cost and which of its linears int8 may quantize, three samplers
(a frequency penalty that counts the real tokens only, XTC drawing from the generation's generator
before the final pick, Mirostat with per-generation state and a reset) and a recipe registered by
name. Its FLOPs and decode costs equal FlopCounterMode (the conformance kit), `gptzoo build` shows
total and active parameters and decode cost, training logs the auxiliary loss and trains the router
on it, the history sampler never counts padding, `gptzoo build frontier-tiny` works and the model
generates in int8, cached decoding giving the logits of the cache-less forward. The distribution is
``gptzoo-fake-frontier``, its module ``gptzoo_fake_frontier`` (FRONTIER below)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from cli_run import run_error, run_json
from fakedist import FakeSite

import gptzoo
from gptzoo.cli import main
from gptzoo.inference.generate import generate
from gptzoo.inference.sampling import SamplerChain
from gptzoo.sweep.matching import MEASURES
from gptzoo.testing import run_conformance
from gptzoo.training import run_dir
from gptzoo.training.trainer import train

FRONTIER = """
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import gptzoo
from gptzoo.flops import linear_flops
from gptzoo.interfaces import Position, Sampler

gptzoo_contract = 4


class FIRE(Position):
    '''FIRE-style learned position (Li et al., 2023): an additive bias per head from an MLP of the
    log of each query-key distance.'''

    def __init__(self, *, n_embd: int, n_head: int, head_dim: int, context_length: int, width: int = 8) -> None:
        super().__init__()
        self.width, self.n_head = width, n_head
        self.fc1 = nn.Linear(1, width)
        self.fc2 = nn.Linear(width, n_head)

    def attn_bias(self, q_positions, k_positions):
        distance = (q_positions[:, :, None] - k_positions[:, None, :]).clamp(min=0).float()
        features = torch.log1p(distance)[..., None].to(self.fc1.weight.dtype)
        bias = self.fc2(torch.relu(self.fc1(features)))  # (B, Tq, Tk, nh)
        return bias.permute(0, 3, 1, 2).float()

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        return {"fire": 2 * seq_len * seq_len * self.width * (1 + self.n_head)}  # once per forward

    def decode_cost(self, cache_len: int, dtype: torch.dtype) -> dict[str, int]:
        keys = cache_len + 1  # one query against every key so far, its own included
        params = sum(p.numel() for p in self.parameters())
        return {"flops": 2 * keys * self.width * (1 + self.n_head), "bytes": params * dtype.itemsize}


class RoutedMoE(nn.Module):
    '''A shared expert plus top-k of n_experts routed experts (each computed densely here, the routing
    weights renormalized over the top k), with the Switch load-balancing loss.'''

    def __init__(self, d_model: int, d_ff: int, *, activation: nn.Module, bias: bool, n_experts: int = 4,
                 top_k: int = 2) -> None:
        super().__init__()
        self.n_experts, self.top_k, self.act = n_experts, top_k, activation
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.c_fc = nn.Linear(d_model, d_ff, bias=bias)  # the shared expert
        self.c_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.experts_fc = nn.ModuleList(nn.Linear(d_model, d_ff, bias=bias) for _ in range(n_experts))
        self.experts_proj = nn.ModuleList(nn.Linear(d_ff, d_model, bias=bias) for _ in range(n_experts))
        self.load_balance = None

    def forward(self, x):
        probs = F.softmax(self.router(x).float(), dim=-1)  # (B, T, E)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        gate = torch.zeros_like(probs).scatter(-1, chosen, weights).to(x.dtype)  # (B, T, E)
        out = self.c_proj(self.act(self.c_fc(x)))
        for e, (fc, proj) in enumerate(zip(self.experts_fc, self.experts_proj)):
            out = out + gate[..., e : e + 1] * proj(self.act(fc(x)))
        routed = torch.zeros_like(probs).scatter(-1, chosen, 1.0).mean(dim=(0, 1)) / self.top_k  # f_e
        self.load_balance = self.n_experts * (routed * probs.mean(dim=(0, 1))).sum()
        return out

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        n, d, f = batch * seq_len, self.c_fc.in_features, self.c_fc.out_features
        return {"router": 2 * n * d * self.n_experts, "experts": 2 * n * 2 * d * f * (1 + self.n_experts)}

    def active_parameters(self) -> int:
        def count(*modules):
            return sum(p.numel() for m in modules for p in m.parameters())

        one = count(self.experts_fc[0], self.experts_proj[0])
        return count(self.router, self.c_fc, self.c_proj) + self.top_k * one

    def aux_losses(self):
        return {} if self.load_balance is None else {"load_balance": self.load_balance}


class LatentCache:
    '''A latent attention's cache: per token its latent (width c) and its rotary key part (width r).'''

    def __init__(self, batch_size: int, max_len: int, width: int, *, device=None, dtype=None) -> None:
        self.latent = torch.empty(batch_size, max_len, width, device=device, dtype=dtype)

    @property
    def max_len(self) -> int:
        return self.latent.shape[1]

    @property
    def nbytes(self) -> int:
        return self.latent.nbytes

    def update(self, latent, start: int):
        end = start + latent.shape[1]
        self.latent[:, start:end] = latent
        return self.latent[:, :end]


class LatentAttention(nn.Module):
    '''Multi-head latent attention (DeepSeek-V2): keys and values of every head come from a cached
    latent of width c (kv_b expands it), plus one rotary key part of width r shared by the heads; q/k
    width (n + r) differs from v width. It caches c + r values per token, not nh * (n + v). Under
    --dtype int8 kv_b, which expands every cached latent at each step, stays in float.'''

    int8 = ("q", "kv_a", "c_proj")

    def __init__(self, d_model: int, n_head: int, *, n_kv_head: int, head_dim: int, bias: bool,
                 latent: int = 12, v_dim: int = 6) -> None:
        super().__init__()
        self.n_head, self.latent, self.nope, self.rope, self.v_dim = n_head, latent, head_dim, head_dim, v_dim
        self.q = nn.Linear(d_model, n_head * (self.nope + self.rope), bias=bias)
        self.kv_a = nn.Linear(d_model, latent + self.rope, bias=bias)
        self.kv_b = nn.Linear(latent, n_head * (self.nope + v_dim), bias=False)
        self.c_proj = nn.Linear(n_head * v_dim, d_model, bias=bias)

    def forward(self, x, ctx, cache=None):
        B, T, _ = x.shape
        nh, n, r, v = self.n_head, self.nope, self.rope, self.v_dim
        q_nope, q_rope = self.q(x).view(B, T, nh, n + r).transpose(1, 2).split((n, r), dim=-1)
        latent, k_rope = self.kv_a(x).split((self.latent, r), dim=-1)  # (B, T, c), (B, T, r)
        if ctx.rotary is not None:
            q_rope, k_rope = ctx.rotary.apply(q_rope, k_rope[:, None])
            k_rope = k_rope[:, 0]
        compressed = torch.cat((latent, k_rope), dim=-1)
        if cache is not None:
            compressed = cache.update(compressed, ctx.start)  # (B, S, c + r): every token so far
        S = compressed.shape[1]
        latent, k_rope = compressed.split((self.latent, r), dim=-1)
        k_nope, values = self.kv_b(latent).view(B, S, nh, n + v).transpose(1, 2).split((n, v), dim=-1)
        k = torch.cat((k_nope, k_rope[:, None].expand(B, nh, S, r)), dim=-1)
        q = torch.cat((q_nope, q_rope), dim=-1)
        y = F.scaled_dot_product_attention(q, k, values, attn_mask=ctx.mask, is_causal=ctx.is_causal)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, nh * v))

    def init_cache(self, batch_size, max_len, *, device=None, dtype=None):
        return LatentCache(batch_size, max_len, self.latent + self.rope, device=device, dtype=dtype)

    def kv_bytes(self, batch_size, max_len, dtype):
        return batch_size * max_len * (self.latent + self.rope) * dtype.itemsize

    def _scores(self, n_queries: int, n_keys: int) -> int:
        return 2 * self.n_head * n_queries * n_keys * (self.nope + self.rope + self.v_dim)

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        n_tokens = batch * seq_len
        projections = linear_flops(n_tokens, self.q, self.kv_a, self.kv_b, self.c_proj)
        return {"attention projections": projections, "attention scores": batch * self._scores(seq_len, seq_len)}

    def decode_cost(self, cache_len: int, dtype: torch.dtype) -> dict[str, int]:
        keys = cache_len + 1  # kv_b expands every cached latent again: nothing absorbed
        flops = linear_flops(1, self.q, self.kv_a, self.c_proj) + linear_flops(keys, self.kv_b) + self._scores(1, keys)
        params = sum(p.numel() for p in self.parameters())
        return {"flops": flops, "bytes": params * dtype.itemsize + self.kv_bytes(1, cache_len, dtype)}


class FrequencyPenalty(Sampler):
    '''Subtract penalty times how often each token occurs in the tokens so far (OpenAI's
    frequency_penalty), counting only the real ones, never a batch's left padding.'''

    def __init__(self, penalty: float = 0.5) -> None:
        self.penalty = penalty
        self.counts = None  # what the latest call counted, for the tests

    def __call__(self, logits, input_ids, *, real):
        self.counts = torch.zeros_like(logits).scatter_add(-1, input_ids, real.to(logits.dtype))
        return logits - self.penalty * self.counts


class XTC(Sampler):
    '''Exclude top choices (XTC): with the given probability per row, mask every token at least
    threshold likely but the least likely of them; a stochastic step before the final pick.'''

    sampling_only = True

    def __init__(self, threshold: float = 0.1, probability: float = 0.5) -> None:
        self.threshold, self.probability = threshold, probability

    def __call__(self, logits, input_ids, *, generator=None):
        probs = logits.softmax(dim=-1)
        top = probs >= self.threshold
        least = probs.masked_fill(~top, math.inf).argmin(dim=-1, keepdim=True)
        cut = top.scatter(-1, least, False) & (top.sum(dim=-1, keepdim=True) >= 2)
        drawn = torch.rand(logits.shape[0], 1, generator=generator) < self.probability
        return logits.masked_fill(cut & drawn, -math.inf)


class Mirostat(Sampler):
    '''Mirostat 2.0 (Basu et al., 2021): sample among the tokens whose surprise (bits) is at most mu,
    then move mu towards the target surprise tau; mu is per-generation state, forgotten by reset.'''

    picks = True

    def __init__(self, tau: float = 5.0, eta: float = 0.1) -> None:
        self.tau, self.eta, self.mu = tau, eta, None

    def reset(self) -> None:
        self.mu = None

    def pick(self, logits, generator=None):
        surprise = -logits.log_softmax(dim=-1) / math.log(2)
        if self.mu is None:
            self.mu = torch.full((logits.shape[0], 1), 2 * self.tau)
        keep = (surprise <= self.mu) | (surprise == surprise.min(dim=-1, keepdim=True).values)
        probs = logits.masked_fill(~keep, -math.inf).softmax(dim=-1)
        picked = torch.multinomial(probs, 1, generator=generator)
        self.mu = self.mu - self.eta * (surprise.gather(1, picked) - self.tau)
        return picked.squeeze(1)


RECIPE = Path(__file__).with_name("frontier-tiny.toml")


@gptzoo.hookimpl
def register_recipes(register):
    register("frontier-tiny", RECIPE)


@gptzoo.hookimpl
def register_samplers(register):
    register("frequency_penalty", FrequencyPenalty)
    register("xtc", XTC)
    register("mirostat", Mirostat)


@gptzoo.hookimpl
def register_attentions(register):
    register("latent", LatentAttention)


@gptzoo.hookimpl
def register_positions(register):
    register("fire", FIRE)


@gptzoo.hookimpl
def register_mlps(register):
    register("routed_moe", RoutedMoE)
"""
OVERRIDES = ["model.position=fire", "model.mlp=routed_moe"]


RECIPE = """extends = "gpt2-tiny"
description = "gpt2-tiny with latent attention, FIRE positions and a routed MoE"

[model]
attention = "latent"
position = "fire"
mlp = "routed_moe"

[generate]
samplers = [
  { name = "frequency_penalty", penalty = 0.5 },
  { name = "xtc", threshold = 0.1, probability = 0.5 },
  { name = "mirostat", tau = 5.0 },
]
"""


def add_frontier(site: FakeSite, source: str = FRONTIER, entry: str = "frontier") -> None:
    """The distribution ``gptzoo-fake-ENTRY`` of ``source`` (FRONTIER or a mutant of it), its recipe beside it."""
    (site.root / "frontier-tiny.toml").write_text(RECIPE, encoding="utf-8")
    site.add(entry, f"gptzoo_fake_{entry}", source)


@pytest.fixture
def frontier(fake_site: FakeSite) -> FakeSite:
    add_frontier(fake_site)
    return fake_site


def test_its_components_pass_the_conformance_kit_flops_included(frontier: FakeSite) -> None:
    registry = gptzoo.get_registry()
    entries = [registry.get("position", "fire"), registry.get("mlp", "routed_moe"), registry.get("attention", "latent")]
    results = run_conformance(registry, entries)
    failed = [(r.name, r.check, r.detail) for r in results if r.status == "failed"]
    assert failed == []
    flops = {r.name: r.detail for r in results if r.check == "flops"}
    assert set(flops) == {"fire", "routed_moe", "latent"}  # a position that declares flops gets the check too
    decode = {r.name: r.detail for r in results if r.check == "decode_cost"}
    assert set(decode) == {"fire", "latent"}  # the kit counts each declared decode cost
    # the latent cache decodes as the cache-less forward does, with every position (rotary included)
    cached = {r.check for r in results if r.name == "latent" and r.status == "passed"}
    assert {"cache[rope]", "cache-padded[rope]", "cache[fire]", "cache-padded[fire]"} <= cached
    (accounting,) = [r.detail for r in results if r.check == "accounting"]
    assert accounting.endswith("parameters active; aux losses load_balance")


def test_build_shows_total_and_active_parameters_and_every_components_flops(
    frontier: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    s = run_json(capsys, "build", "gpt2-tiny", *[a for o in OVERRIDES for a in ("--set", o)], "--seq-len", "16")
    model = gptzoo.build_model(gptzoo.load_recipe("gpt2-tiny", OVERRIDES), device="meta")
    d, f, n_layer = model.wte.weight.shape[1], model.recipe.model.d_ff, len(model.blocks)
    expert = 2 * d * f + d + f  # fc and proj, with biases
    assert s["params"]["total"] - s["params"]["active"] == n_layer * 2 * expert  # 2 of 4 experts idle
    fire = model.position
    assert s["flops"]["by_component"]["fire"] == 2 * 16 * 16 * fire.width * (1 + fire.n_head)
    registry = gptzoo.get_registry()
    recipe = gptzoo.load_recipe("gpt2-tiny", OVERRIDES, registry=registry)
    assert MEASURES["active_params"](recipe, registry) == s["params"]["active"]  # what a sweep matches by
    assert main(["build", "gpt2-tiny", *[a for o in OVERRIDES for a in ("--set", o)]]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "active per token" in line]
    assert f"{s['params']['active']:,}" in row


LATENT = ["model.attention=latent", "model.position=fire"]


def test_build_shows_the_latent_caches_kv_bytes_and_decode_cost(
    frontier: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    s = run_json(capsys, "build", "gpt2-tiny", *[a for o in LATENT for a in ("--set", o)])
    model = gptzoo.build_model(gptzoo.load_recipe("gpt2-tiny", LATENT), device="meta")
    attn, fire, n_layer = model.blocks[0].attn, model.position, len(model.blocks)
    c, r, nh, n, v = attn.latent, attn.rope, attn.n_head, attn.nope, attn.v_dim
    length = s["decode"]["cache_len"]
    assert length == model.recipe.model.context_length
    assert s["memory"]["kv_cache_bytes_per_token"]["float32"] == n_layer * (c + r) * 4  # not nh * (n + v)
    d, vocab, keys = model.wte.weight.shape[1], model.wte.weight.shape[0], length + 1
    attention = 2 * d * nh * (n + r) + 2 * d * (c + r) + 2 * nh * v * d + 2 * keys * c * nh * (n + v)
    attention += 2 * nh * keys * (n + r + v)
    mlp = 2 * 2 * d * model.recipe.model.d_ff  # a dense mlp's default: its forward over one token
    by_part = s["decode"]["by_component"]
    assert by_part["attention"]["flops"] == n_layer * attention
    assert by_part["position"]["flops"] == 2 * keys * fire.width * (1 + fire.n_head)
    assert by_part["mlp"]["flops"] == n_layer * mlp
    assert by_part["lm head"]["flops"] == 2 * d * vocab
    assert s["decode"]["flops_per_token"] == sum(part["flops"] for part in by_part.values())
    weights = sum(p.numel() for p in attn.parameters())
    assert by_part["attention"]["bytes"]["bfloat16"] == n_layer * (weights + length * (c + r)) * 2
    assert s["decode"]["bytes_read_per_token"]["float32"] == sum(p["bytes"]["float32"] for p in by_part.values())
    assert main(["build", "gpt2-tiny", *[a for o in LATENT for a in ("--set", o)]]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "bytes read decoding a token" in line]
    assert f"(at {length} cached)" in row


def test_the_latent_cache_decodes_as_the_forward_without_it(frontier: FakeSite) -> None:
    torch.manual_seed(0)
    model = gptzoo.build_model(gptzoo.load_recipe("gpt2-tiny", [*LATENT, "model.mlp=routed_moe"]), device="cpu")
    model.eval()
    idx = torch.randint(0, 256, (2, 12))
    cache = model.init_cache(2, 12)
    with torch.no_grad():
        expected = model(idx)
        got = torch.cat([model(idx[:, :5], cache), *(model(idx[:, t : t + 1], cache) for t in range(5, 12))], dim=1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert cache.nbytes == len(model.blocks) * 2 * 12 * (model.blocks[0].attn.latent + model.blocks[0].attn.rope) * 4


def test_a_latent_attention_generates_on_the_generic_path_which_names_it(
    frontier: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "gpt2-tiny", "--set", "model.attention=latent", "--prompt", "hello", "--max-new-tokens", "3"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["tokens"][0]) == 3
    assert out["decode"]["path"] == "native+eager"  # the native step runs the latent attention's own forward
    assert [(m["component"], m["kind"], m["name"], m["origin"]) for m in out["decode"]["missing"]] == [
        ("gptzoo_fake_frontier.LatentAttention", "attention", "latent", "gptzoo-fake-frontier 1.0")
    ]


def test_the_kit_counts_a_decode_cost_off_by_one_key(fake_site: FakeSite) -> None:
    wrong = "keys = cache_len + 1  # one query against every key so far, its own included"
    assert wrong in FRONTIER
    add_frontier(fake_site, FRONTIER.replace(wrong, "keys = cache_len"))
    registry = gptzoo.get_registry()
    (result,) = [r for r in run_conformance(registry, [registry.get("position", "fire")]) if r.check == "decode_cost"]
    # width 8, the kit's 4 heads: 2 * 8 keys * 8 * 5 declared, 2 * 9 * 8 * 5 run
    assert (result.status, result.detail) == (
        "failed",
        "decode_cost(8, torch.float32) declares 640 FLOPs, FlopCounterMode counts 720 for one token after 8 cached "
        "ones; count executed matmul FLOPs, 1 multiply-add = 2",
    )


def test_training_logs_the_aux_loss_and_trains_the_router_on_it(
    frontier: FakeSite, stdlib_bytes: Path, tmp_path: Path
) -> None:
    base = [
        *OVERRIDES,
        "model.vocab_size=256",
        "tokenizer.name=bytes",
        "train.seq_len=16",
        "train.micro_batch_size=2",
        "train.max_steps=3",
        "train.log_every=1",
        "train.eval_every=0",
        "train.peak_tflops=1.0",
    ]
    routers = {}
    for weight in ("0", "1.0"):
        out = tmp_path / f"w{weight}"
        train(gptzoo.load_recipe("gpt2-tiny", [*base, f"train.aux_loss_weight={weight}"]), out=out, data=stdlib_bytes)
        records = [r for r in run_dir.read_metrics(out) if "loss" in r]
        balance = [r["aux_load_balance"] for r in records]
        assert len(balance) == 3 and all(math.isfinite(b) and 0.9 < b < 4 for b in balance)  # E * sum f P: 1 if even
        weights, _ = run_dir.load(run_dir.latest(out))
        routers[weight] = weights["blocks.0.mlp.router.weight"]
    assert not torch.equal(routers["0"], routers["1.0"])  # the aux loss reaches the router's gradient


def test_it_generates_and_says_which_path_decoded(frontier: FakeSite, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "gpt2-tiny", *[a for o in OVERRIDES for a in ("--set", o)], "--prompt", "hello"]
    assert main([*argv, "--max-new-tokens", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["tokens"][0]) == 3
    # the native plan has no attention bias: every attention runs its eager forward (whose context holds
    # FIRE's bias) within the native step, as does the MoE, which has no lowering
    assert out["decode"]["path"] == "native+eager"
    assert [(m["name"], m["modules"], m["reason"]) for m in out["decode"]["missing"]] == [
        ("causal", 2, "FIRE biases attention (the plan has no attention bias)"),
        ("routed_moe", 2, "gptzoo_fake_frontier.RoutedMoE has no decode lowering"),
    ]


@pytest.mark.parametrize(
    ("mutation", "message"),
    [
        (
            ('"load_balance": self.load_balance}', '"load_balance": self.load_balance.detach()}'),
            "aux_losses()['load_balance'] is not in the autograd graph; return the tensor forward computed",
        ),
        (
            ("return count(self.router, self.c_fc, self.c_proj) + self.top_k * one", "return 10**9"),
            "active_parameters() gave 1000000000, not an int between 0 and its 5424 parameters",
        ),
    ],
    ids=["detached-aux-loss", "too-many-active"],
)
def test_the_kit_catches_an_accounting_mistake(fake_site: FakeSite, mutation: tuple[str, str], message: str) -> None:
    assert mutation[0] in FRONTIER
    add_frontier(fake_site, FRONTIER.replace(*mutation))
    registry = gptzoo.get_registry()
    (result,) = [r for r in run_conformance(registry, [registry.get("mlp", "routed_moe")]) if r.check == "accounting"]
    assert (result.status, result.detail) == ("failed", message)


def test_a_negative_aux_loss_weight_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_error(capsys, "build", "gpt2-tiny", "--set", "train.aux_loss_weight=-1") == (
        "error: --set train.aux_loss_weight=-1: [train] aux_loss_weight=-1.0 must be a finite number >= 0"
    )


SAMPLERS = ("frequency_penalty", "xtc", "mirostat")


def test_its_samplers_pass_the_kit_and_say_what_they_take(frontier: FakeSite) -> None:
    registry = gptzoo.get_registry()
    results = run_conformance(registry, [registry.get("sampler", name) for name in SAMPLERS])
    assert [(r.name, r.check, r.detail) for r in results if r.status == "failed"] == []
    assert {r.name: r.detail for r in results if r.check == "padding"} == {
        "frequency_penalty": "takes real",
        "xtc": "takes generator",
        "mirostat": "takes neither real nor generator",
    }


def test_a_history_sampler_counts_the_real_tokens_of_a_padded_batch_only(frontier: FakeSite) -> None:
    registry = gptzoo.get_registry()
    model = gptzoo.build_model(gptzoo.load_recipe("gpt2-tiny"), device="cpu")
    model.eval()
    chain = SamplerChain.from_registry(registry, [("frequency_penalty", {"penalty": 0.5}), ("greedy", {})])
    prompts = [[5, 6, 5], [9, 8, 9, 8, 9, 8]]
    (short, long) = generate(model, prompts, 4, sampler=chain)
    counts = chain.steps[0].counts  # what the penalty counted before the last token was chosen
    history = [prompts[0] + short[:-1], prompts[1] + long[:-1]]
    for row, tokens in enumerate(history):
        expected = torch.bincount(torch.tensor(tokens), minlength=counts.shape[1]).float()
        assert torch.equal(counts[row], expected)  # the short row's 3 positions of padding are not counted
    assert counts[0, 5] == history[0].count(5)  # the padding repeats token 5, the row's first


@pytest.mark.parametrize(
    ("mutation", "check", "message"),
    [
        (
            (
                "    def __call__(self, logits, input_ids, *, real):\n"
                "        self.counts = torch.zeros_like(logits).scatter_add(-1, input_ids, real.to(logits.dtype))",
                "    def __call__(self, logits, input_ids):\n"
                "        self.counts = torch.zeros_like(logits).scatter_add(\n"
                "            -1, input_ids, torch.ones_like(input_ids, dtype=logits.dtype)\n"
                "        )",
            ),
            ("frequency_penalty", "padding"),
            "a prompt left-padded by 3 positions (holding its first token, as generate pads a batch) changed the "
            "logit of token ",
        ),
        (
            ("    def reset(self) -> None:\n        self.mu = None\n", ""),  # with eta 1.0, below
            ("mirostat", "seeded"),
            "two generations with the same torch.Generator seed picked different tokens: draw random numbers only "
            "from the generator the chain passes (to pick, and to __call__ when it takes generator=), and forget "
            "per-generation state in reset(), which the chain calls before each generation",
        ),
        (
            ("torch.rand(logits.shape[0], 1, generator=generator)", "torch.rand(logits.shape[0], 1)"),
            ("xtc", "seeded"),
            "two generations with the same torch.Generator seed picked different tokens",
        ),
    ],
    ids=["counts-padding", "no-reset", "global-random"],
)
def test_the_kit_catches_a_sampler_mistake(
    fake_site: FakeSite, mutation: tuple[str, str], check: tuple[str, str], message: str
) -> None:
    assert mutation[0] in FRONTIER
    # a faster-moving mu (and a lower XTC threshold), so that the state a missing reset carries over
    # (and XTC's draws) change what the kit's logits keep
    fast = FRONTIER.replace("tau: float = 5.0, eta: float = 0.1", "tau: float = 5.0, eta: float = 1.0")
    fast = fast.replace("threshold: float = 0.1, probability", "threshold: float = 0.01, probability")
    add_frontier(fake_site, fast.replace(*mutation))
    registry = gptzoo.get_registry()
    name, check_name = check
    (result,) = [r for r in run_conformance(registry, [registry.get("sampler", name)]) if r.check == check_name]
    assert result.status == "failed" and result.detail.startswith(message)


def test_its_recipe_builds_by_name_and_generates_in_int8(
    frontier: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    built = run_json(capsys, "build", "frontier-tiny")
    components = {c["kind"]: c["name"] for c in built["components"]}
    assert components == {**components, "attention": "latent", "position": "fire", "mlp": "routed_moe"}
    assert built["params"]["active"] < built["params"]["total"]
    argv = ["generate", "frontier-tiny", "--prompt", "hi", "--prompt", "a longer prompt", "--max-new-tokens", "4"]
    assert main([*argv, "--dtype", "int8", "--seed", "1", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert [len(t) for t in out["tokens"]] == [4, 4]
    assert out["sampler_chain"] == (
        "frequency_penalty(penalty=0.5) -> xtc(threshold=0.1, probability=0.5) -> mirostat(tau=5.0)"
    )
    # kv_b is declared float (int8 = ("q", "kv_a", "c_proj")); every other linear is int8
    assert "int8: 2 linears kept in float as their components declare: blocks.0.attn.kv_b, blocks.1.attn.kv_b" in (
        " ".join(captured.err.split())
    )
    assert main([*argv, "--dtype", "int8", "--seed", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == out["tokens"]  # Mirostat's state is reset


def test_a_component_that_breaks_on_int8_linears_is_refused_in_one_line(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    fused = "        out = self.c_proj(self.act(self.c_fc(x)))\n"
    strict = (
        "        if type(self.c_fc) is not nn.Linear:\n            raise TypeError('the fused path needs nn.Linear')\n"
    )
    add_frontier(fake_site, FRONTIER.replace(fused, strict + fused))
    argv = ["generate", "gpt2-tiny", "--set", "model.mlp=routed_moe", "--prompt", "hi", "--max-new-tokens", "2"]
    assert main(argv) == 0  # in float32 it runs
    capsys.readouterr()
    assert run_error(capsys, *argv, "--dtype", "int8") == (
        "error: mlp 'routed_moe' from gptzoo_fake_frontier (gptzoo-fake-frontier 1.0) failed under --dtype int8 (its "
        "nn.Linear modules quantized): TypeError: the fused path needs nn.Linear; register its quantized linears as "
        "False, or the paths of those it may have quantized (register_quantized_linears, gptzoo.inference.hooks), or "
        "load it in float32 or bfloat16"
    )
