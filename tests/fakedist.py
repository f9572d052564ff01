"""Fake installed distributions for plugin tests: a directory with ``NAME-VERSION.dist-info``.

A directory on sys.path holding ``NAME-VERSION.dist-info/METADATA`` and ``entry_points.txt`` is
an installed distribution as far as importlib.metadata is concerned, so gptzoo finds its entry
points exactly as it finds those of a real ``pip install``. The plugin module sits next to it.

In-process tests use the ``fake_site`` fixture of test_plugins.py, which puts the directory on
sys.path with monkeypatch and removes the plugin modules from sys.modules afterwards; subprocess
tests point PYTHONPATH at the directory (see :func:`FakeSite.env`).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

from gptzoo.plugin_manager import ONLY_PLUGINS_ENV

PLUGIN_HEADER = "import gptzoo\n\n"
"""Every fake plugin module starts with this (its hooks are decorated with @gptzoo.hookimpl)."""


class FakeSite:
    """A site directory of fake distributions, each with one entry point in group ``gptzoo``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.modules: list[str] = []
        self.dists: list[str] = []

    def add(self, entry_name: str, module: str, source: str, *, dist: str | None = None, version: str = "1.0") -> str:
        """Write a distribution whose entry point ``entry_name`` loads ``module`` (given its source).

        The distribution is named ``gptzoo-fake-<entry_name>`` unless ``dist`` says otherwise.
        Returns the distribution name.
        """
        dist = dist or f"gptzoo-fake-{entry_name}"
        info = self.root / f"{re.sub(r'[-_.]+', '_', dist)}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n", encoding="utf-8")
        (info / "entry_points.txt").write_text(f"[gptzoo]\n{entry_name} = {module}\n", encoding="utf-8")
        (self.root / f"{module}.py").write_text(PLUGIN_HEADER + textwrap.dedent(source).lstrip(), encoding="utf-8")
        self.modules.append(module)
        self.allow(dist)
        importlib.invalidate_caches()
        return dist

    def allow(self, dist: str) -> None:
        """Let the plugin manager load ``dist``, in this process and in a subprocess given :meth:`env`."""
        self.dists.append(dist)
        allow(dist)

    def forget_modules(self) -> None:
        """Drop the fake plugin modules from sys.modules (so no later test sees a stale one)."""
        for module in self.modules:
            sys.modules.pop(module, None)
        importlib.invalidate_caches()

    def env(self, base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        """An environment for a subprocess that sees these distributions (plus ``extra`` variables)."""
        env = dict(os.environ if base is None else base)
        for var in ("GPTZOO_NO_PLUGINS", "GPTZOO_STRICT_PLUGINS", "COLUMNS"):  # COLUMNS: rich's width
            env.pop(var, None)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.root), env.get("PYTHONPATH", "")) if p)
        if ONLY_PLUGINS_ENV in env:
            env[ONLY_PLUGINS_ENV] = ",".join((env[ONLY_PLUGINS_ENV], *self.dists))
        env.update(extra)
        return env


def allow(dist: str) -> None:
    """Let the suite's plugin manager load ``dist`` (conftest.py limits it to what the suite installs,
    through $GPTZOO_ONLY_PLUGINS, so that the suite does not depend on what else is installed)."""
    current = os.environ.get(ONLY_PLUGINS_ENV)
    if current is not None and dist not in current.split(","):
        os.environ[ONLY_PLUGINS_ENV] = f"{current},{dist}" if current else dist


# --- plugin sources ------------------------------------------------------------------------------

SCALENORM_CLASS = '''
import torch
from torch import nn


class ScaleNorm(nn.Module):
    """ScaleNorm: g * x / max(||x||, eps), one learned scalar g (Nguyen & Salazar, 2019)."""

    def __init__(self, dim: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.g = nn.Parameter(torch.tensor(float(dim) ** 0.5))

    def forward(self, x):
        return self.g * x / x.norm(dim=-1, keepdim=True).clamp_min(self.eps)
'''
"""A norm's code, as a plugin's module holds it."""
SCALENORM = (
    SCALENORM_CLASS
    + """

@gptzoo.hookimpl
def register_norms(register):
    register("scalenorm", ScaleNorm)
"""
)
"""A good plugin: norm ``scalenorm``."""

BROKEN_MESSAGE = "boom: this plugin needs the frobnicator extension"
BROKEN = f"""
raise RuntimeError({BROKEN_MESSAGE!r})
"""
"""A plugin that raises on import."""

TYPO = """
@gptzoo.hookimpl
def register_norm(register):  # should be register_norms
    register("typonorm", object)
"""
"""A plugin with a misspelled hook name."""

BAD_SIGNATURE = """
@gptzoo.hookimpl
def register_activations(reg):  # the hookspec's argument is called `register`
    reg("badsig", object)
"""
"""A plugin whose hook takes an argument the hookspec does not have."""


def rmsnorm_replacement(*, override: bool) -> str:
    """A plugin registering norm ``rmsnorm`` again (a duplicate of the built-in, or an override)."""
    return f'''
from torch import nn


class MyRMSNorm(nn.Module):
    """A replacement RMSNorm (same signature as the built-in)."""

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x):
        return x


@gptzoo.hookimpl
def register_norms(register):
    register("rmsnorm", MyRMSNorm, override={override!r})
'''


RING_WINDOW = '''
import torch
import torch.nn.functional as F
from torch import nn

from gptzoo.flops import linear_flops


class RingCache:
    """Keys and values of the last ``window`` positions only: slot = sequence index % window."""

    def __init__(self, batch, n_kv_head, window, head_dim, max_len, *, device, dtype):
        self.k = torch.empty(batch, n_kv_head, window, head_dim, device=device, dtype=dtype)
        self.v = torch.empty_like(self.k)
        self.max_len = max_len

    @property
    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


class RingWindowAttention(nn.Module):
    """Causal self-attention over the last ``window`` positions, with a ring-buffer KV cache."""

    examples = [{"window": 3}]

    def __init__(self, d_model, n_head, *, n_kv_head, head_dim, bias, window: int = 16):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim, self.window = n_head, n_kv_head, head_dim, window
        self.c_attn = nn.Linear(d_model, (n_head + 2 * n_kv_head) * head_dim, bias=bias)
        self.c_proj = nn.Linear(n_head * head_dim, d_model, bias=bias)

    @staticmethod
    def check(d_model, n_head, *, n_kv_head, head_dim, bias, window=16):
        return [] if window >= 1 else [f"window must be at least 1, got {window}"]

    def forward(self, x, ctx, cache=None):
        B, T, _ = x.shape
        nh, nkv, hs, W = self.n_head, self.n_kv_head, self.head_dim, self.window
        q, k, v = self.c_attn(x).split((nh * hs, nkv * hs, nkv * hs), dim=-1)
        q = q.view(B, T, nh, hs).transpose(1, 2)
        k = k.view(B, T, nkv, hs).transpose(1, 2)
        v = v.view(B, T, nkv, hs).transpose(1, 2)
        if ctx.rotary is not None:
            q, k = ctx.rotary.apply(q, k)
        pos, start = ctx.positions, ctx.start
        end = start + T
        first = start
        if cache is not None:
            if start:  # the held keys before these: sequence indices max(0, start - W) .. start - 1
                first = max(0, start - W)
                slots = torch.arange(first, start, device=x.device) % W
                k, v = torch.cat([cache.k[:, :, slots], k], dim=2), torch.cat([cache.v[:, :, slots], v], dim=2)
            keep = min(T, W)
            slots = torch.arange(end - keep, end, device=x.device) % W
            cache.k[:, :, slots], cache.v[:, :, slots] = k[:, :, -keep:], v[:, :, -keep:]
        q_index = torch.arange(start, end, device=x.device)[:, None]
        k_index = torch.arange(first, end, device=x.device)[None, :]
        allowed = (k_index <= q_index) & (k_index > q_index - W)
        if pos.key_mask is not None:
            allowed = (allowed & pos.key_mask[:, None, first:end]) | (k_index == q_index)
            allowed = allowed[:, None]
        mask = torch.zeros(allowed.shape, device=x.device).masked_fill(~allowed, float("-inf"))
        bias = ctx.attn_bias(pos.queries, pos.keys[:, first:end])
        if bias is not None:
            mask = mask + bias
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), enable_gqa=nkv != nh)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, nh * hs))

    def init_cache(self, batch_size, max_len, *, device=None, dtype=None):
        window = min(self.window, max_len)
        return RingCache(batch_size, self.n_kv_head, window, self.head_dim, max_len, device=device, dtype=dtype)

    def kv_bytes(self, batch_size, max_len, dtype):
        return 2 * batch_size * self.n_kv_head * min(self.window, max_len) * self.head_dim * dtype.itemsize

    def flops(self, batch, seq_len):
        scores = 2 * 2 * batch * self.n_head * seq_len * seq_len * self.head_dim
        return {"attention projections": linear_flops(batch * seq_len, self.c_attn, self.c_proj), "scores": scores}


@gptzoo.hookimpl
def register_attentions(register):
    register("ring_window", RingWindowAttention)
'''
"""A good plugin: attention ``ring_window``, a ring-buffer cache of its window."""

UNITNORM_CLASS = '''
import torch
from torch import nn


class UnitNorm(nn.Module):
    """RMSNorm of a plugin's own: x / sqrt(mean(x^2) + eps) * weight, normalized in float32."""

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)
'''
"""A norm that the plan's rmsnorm computes exactly, as a plugin's module holds it."""


def unitnorm(lowering: str = "plain", *, by_reference: str | None = None) -> str:
    """A plugin registering norm ``unitnorm`` and its lowering, an rmsnorm applying the weight as
    ``lowering`` says ("plain" is right, "offset" wrong); ``by_reference``: the plugin's module name,
    to register the class and the lowering by reference."""
    component, lower = (
        (f'"{by_reference}:UnitNorm"', f'"{by_reference}:lower"') if by_reference else ("UnitNorm", "lower")
    )
    return (
        UNITNORM_CLASS
        + f'''

def lower(plan, norm, src, dst):
    plan.rmsnorm(src, dst, norm.weight, norm.eps, "{lowering}")


@gptzoo.hookimpl
def register_norms(register):
    register("unitnorm", UnitNorm)


@gptzoo.hookimpl
def register_decode_lowerings(register):
    register({component}, {lower})
'''
    )


UNITNORM_DECODE_OPS = (
    UNITNORM_CLASS
    + """
    def decode_ops(self, plan, src, dst):
        plan.rmsnorm(src, dst, self.weight, self.eps, "plain")


@gptzoo.hookimpl
def register_norms(register):
    register("unitnorm", UnitNorm)
"""
)
"""A plugin of the previous contract: its norm describes its decoding step with a decode_ops method."""
