"""The files ``gptzoo new-plugin`` writes (gptzoo.scaffold), as string.Template texts.

One :class:`Template` per component kind (``TEMPLATES``, keyed like gptzoo.hookspecs.KINDS): a
small, real component that satisfies its kind's contract and passes the conformance kit, for the
author to turn into theirs. The placeholders are ``$name`` (the component's registered name),
``$cls`` (its class), ``$kind``, ``$hook`` (the kind's hook), ``$module`` (the import name),
``$dist`` (the distribution), ``$flag`` (a sampler's command-line flag), ``$usage`` (a
command that uses the component) and ``$contract`` (gptzoo.hookspecs.CONTRACT_VERSION, which
``CONTRACT`` declares at the end of the module).
The generated code is formatted as ``ruff format`` would with its defaults (88 columns).
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template as Text


@dataclass(frozen=True)
class Template:
    """One kind's component skeleton."""

    summary: str
    """What the skeleton is, in one line (its module docstring's first line)."""
    code: str
    """The module after its docstring: imports, the component and its hook."""


MODULE_DOC = Text('''\
"""The $kind ``$name``: $summary

This distribution registers it through the entry point group ``gptzoo``
(pyproject.toml); once it is installed, a model uses it with

    $usage

The contract it follows is gptzoo.hookspecs.CONTRACTS["$kind"], spelled out in the
docstring of gptzoo.hookspecs.$hook; tests/ holds the component to it with gptzoo's
conformance kit (gptzoo.testing). gptzoo's docs/plugins.md is the guide for plugin
authors.
"""

''')

TEMPLATES: dict[str, Template] = {
    "norm": Template(
        "RMS normalization with a learned scale.",
        '''\
from __future__ import annotations

import gptzoo
import torch
from torch import nn


class $cls(nn.Module):
    """RMS normalization: x / sqrt(mean(x^2) + eps) * weight."""

    examples = [{"eps": 0.1}]
    """Parameter sets the conformance kit builds and runs besides the defaults."""

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    @staticmethod
    def check(*, eps: float = 1e-6, **_: object) -> list[str]:
        """Problems with the parameters, reported before anything is built."""
        return [] if eps > 0 else [f"eps must be > 0, got {eps}"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


@gptzoo.hookimpl
def register_norms(register):
    register("$name", $cls)
''',
    ),
    "activation": Template(
        "Swish, x * sigmoid(beta * x).",
        '''\
from __future__ import annotations

import gptzoo
import torch
from torch import nn


class $cls(nn.Module):
    """Swish: x * sigmoid(beta * x) (Ramachandran et al., 2017); beta = 1 is SiLU."""

    examples = [{"beta": 1.702}]
    """Parameter sets the conformance kit builds and runs besides the defaults."""

    def __init__(self, *, beta: float = 1.0) -> None:
        super().__init__()
        self.beta = beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.beta * x)


@gptzoo.hookimpl
def register_activations(register):
    register("$name", $cls)
''',
    ),
    "mlp": Template(
        "a dense MLP, d_model -> d_ff -> d_model.",
        '''\
from __future__ import annotations

import gptzoo
import torch
from gptzoo.flops import linear_flops
from torch import nn


class $cls(nn.Module):
    """A dense MLP: c_proj(activation(c_fc(x)))."""

    def __init__(
        self, d_model: int, d_ff: int, *, activation: nn.Module, bias: bool
    ) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, d_ff, bias=bias)
        self.activation = activation
        self.c_proj = nn.Linear(d_ff, d_model, bias=bias)  # into the residual stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.activation(self.c_fc(x)))

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        """Matmul FLOPs of a forward over (batch, seq_len) tokens (multiply-add = 2)."""
        return {"mlp": linear_flops(batch * seq_len, self.c_fc, self.c_proj)}


@gptzoo.hookimpl
def register_mlps(register):
    register("$name", $cls)
''',
    ),
    "position": Template(
        "learned absolute position embeddings.",
        '''\
from __future__ import annotations

import gptzoo
import torch
from gptzoo import interfaces
from torch import nn


class $cls(interfaces.Position):
    """Learned absolute position embeddings, for up to context_length positions."""

    def __init__(
        self, *, n_embd: int, n_head: int, head_dim: int, context_length: int
    ) -> None:
        super().__init__()
        self.max_positions = context_length
        self.table = nn.Embedding(context_length, n_embd)

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        """Positions (B, T) -> (B, T, n_embd), added to the token embeddings."""
        return self.table(positions)


@gptzoo.hookimpl
def register_positions(register):
    register("$name", $cls)
''',
    ),
    "attention": Template(
        "causal self-attention with a KV cache.",
        '''\
from __future__ import annotations

import gptzoo
import torch
from gptzoo import interfaces
from gptzoo.flops import linear_flops
from torch import nn
from torch.nn import functional


class $cls(nn.Module):
    """Causal self-attention, n_kv_head key/value heads, q, k and v from one matmul."""

    def __init__(
        self, d_model: int, n_head: int, *, n_kv_head: int, head_dim: int, bias: bool
    ) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim
        self.c_attn = nn.Linear(d_model, (n_head + 2 * n_kv_head) * head_dim, bias=bias)
        self.c_proj = nn.Linear(n_head * head_dim, d_model, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        ctx: interfaces.AttentionContext,
        cache: interfaces.LayerKVCache | None = None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        nh, nkv, hs = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.c_attn(x).split((nh * hs, nkv * hs, nkv * hs), dim=-1)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, nkv, hs).transpose(1, 2)
        if ctx.rotary is not None:
            q, k = ctx.rotary.apply(q, k)
        if cache is not None:
            k, v = cache.update(k, v, ctx.start)  # (B, nkv, start + T, hs)
        y = functional.scaled_dot_product_attention(
            q, k, v, attn_mask=ctx.mask, is_causal=ctx.is_causal, enable_gqa=nkv != nh
        )  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, nh * hs))

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> interfaces.LayerKVCache:
        """Keys and values of up to max_len positions, (B, nkv, max_len, hs) each."""
        shape = (batch_size, self.n_kv_head, max_len, self.head_dim)
        return interfaces.LayerKVCache(*shape, device=device, dtype=dtype)

    def kv_bytes(self, batch_size: int, max_len: int, dtype: torch.dtype) -> int:
        """The bytes init_cache(batch_size, max_len, dtype=dtype) allocates."""
        per_position = 2 * self.n_kv_head * self.head_dim * dtype.itemsize  # k and v
        return batch_size * max_len * per_position

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        """Matmul FLOPs of a forward over (batch, seq_len) tokens (multiply-add = 2):
        the projections, and Q K^T and the weighted sum over the full T x T square."""
        scores = 2 * 2 * batch * self.n_head * seq_len * seq_len * self.head_dim
        projections = linear_flops(batch * seq_len, self.c_attn, self.c_proj)
        return {"attention projections": projections, "attention scores": scores}


@gptzoo.hookimpl
def register_attentions(register):
    register("$name", $cls)
''',
    ),
    "sampler": Template(
        "epsilon sampling, a step of the sampler chain.",
        '''\
from __future__ import annotations

import gptzoo
import torch
from gptzoo import interfaces


class $cls(interfaces.Sampler):
    """Epsilon sampling (Hewitt et al., 2022): forbid the tokens whose probability is
    below epsilon, except the most likely one."""

    flag = interfaces.SamplerFlag(
        param="epsilon", order=60, help="forbid tokens less likely than this"
    )
    """gptzoo generate's --$flag, placed after min_p as in Hugging Face's order."""
    sampling_only = True
    """--temperature 0 (greedy) drops this step."""
    examples = [{"epsilon": 0.1}]
    """Parameter sets the conformance kit builds and runs besides the defaults."""

    def __init__(self, *, epsilon: float = 3e-4) -> None:
        if not 0 < epsilon < 1:
            raise ValueError(f"$name epsilon must be in (0, 1), got {epsilon}")
        self.epsilon = epsilon

    def __call__(self, logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        probs = logits.float().softmax(dim=-1)  # (B, V)
        top = probs.amax(dim=-1, keepdim=True)
        return logits.masked_fill((probs < self.epsilon) & (probs < top), float("-inf"))


@gptzoo.hookimpl
def register_samplers(register):
    register("$name", $cls)
''',
    ),
}
"""kind -> its skeleton."""

CONTRACT = Text('''

gptzoo_contract = $contract
"""The gptzoo plugin contract this module is written for (gptzoo.CONTRACT_VERSION)."""
''')

PYPROJECT = Text("""\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "A gptzoo plugin: the $kind $name"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["gptzoo"]

[project.optional-dependencies]
test = ["pytest"]

[project.entry-points.gptzoo]
$name = "$module"

[tool.setuptools]
py-modules = ["$module"]

[tool.pytest.ini_options]
testpaths = ["tests"]
""")

TEST = Text('''\
"""The conformance kit (gptzoo.testing) on ``$name``: each check is one test."""

from gptzoo.testing import conformance

test_$name = conformance("$kind", "$name")
''')

README = Text("""\
# $dist

A gptzoo plugin: the $kind `$name`, $summary

    pip install -e .                 # `gptzoo plugins` now lists $module ($dist)
    python -m pytest                 # tests/: the conformance kit's checks on `$name`
    gptzoo plugins --check $dist     # the same checks, as a table

Once it is installed, a model uses it with

    $usage

The component is in `$module.py`; the contract of a $kind and the checks it must pass
are in gptzoo's guide for plugin authors, docs/plugins.md.
""")
