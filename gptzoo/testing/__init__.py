"""gptzoo's conformance kit: the checks every component of a kind must pass, for plugin authors and
for gptzoo's own tests.

In a plugin's test suite (pytest collects it because the name starts with ``test_``)::

    from gptzoo.testing import conformance

    test_ring_window = conformance("attention", "ring_window")

Without pytest (``gptzoo plugins --check`` does this)::

    from gptzoo.testing import run_conformance
    results = run_conformance(registry, registry.entries("attention"))  # list[CheckResult]

API:

- ``conformance(kind, name, *, registry=None)``: a pytest test function parametrized over the
  component's checks (ids ``attention:ring_window-causality[rope]``); a failed check fails with
  its one-line detail, a skipped one skips.
- ``conformance_all(registry=None, entries=None)``: the same over every registered component (or
  these entries): gptzoo's tests/testing/test_contract.py.
- ``run_conformance(registry, entries) -> list[CheckResult]``: run the checks, no pytest needed.
- :class:`CheckResult`: kind, name, distribution, version, check, status ("passed", "failed",
  "skipped"), detail (one line).

Checks (a component is built exactly as a model builds it: recipe data validated against the
registry, then gptzoo.build_model, in a tiny model from the shipped gpt2-tiny recipe; activations and
samplers standalone), each with default parameters and with each parameter set of the factory's
optional ``examples`` (a list of dicts), whose variant is named in brackets:

- ``examples``: ``examples`` is absent or a list of dicts of parameters.
- ``build[SIZE]``: it builds and holds to its contract at sizes plain (4 heads), odd-heads (3),
  head_dim (head_dim != n_embd / n_head), gqa (n_kv_head < n_head) and mqa (n_kv_head = 1); a size
  its own ``check`` refuses is skipped with the check's reason.
- ``forward[SIZE]``: float32 and bfloat16 forwards keep the shape and dtype, without NaN.
- ``gradients``: one backward pass of a training forward over 8 sequences, the parameters moved off
  their initialization first, gives every parameter a nonzero gradient (one forward never uses, or
  uses only through an index such as topk's, fails).
- ``int8``: with the test model's linears int8 (gptzoo.inference.quantize; those the component's
  ``int8`` keeps stay float, contract 4) its forward runs and stays within 5% (by norm) of float32's.
- ``normalizes`` (norms): changing one position's input leaves every other position's output as it
  was, and an input 1000 times larger gives an output at most 10 times larger.
- ``safetensors``: its state dict, through a safetensors file into a freshly built copy (another seed,
  every parameter shifted), gives the same outputs.
- ``hf_layouts``: for every Hugging Face layout that maps it (gptzoo.hf.layouts: the built-ins' and
  those plugins register), the maps cover its state dict exactly and export then import gives every
  tensor back; its config gives None or a dict of JSON values.
- ``flops`` (mlps, attentions, and any other component that declares it, contract 3):
  ``flops(batch, seq_len)`` sums to exactly what torch.utils.flop_counter.FlopCounterMode counts
  over a cache-less forward. The semantics:
  executed matmul FLOPs, one multiply-add = 2 FLOPs, attention scores over the full T x T square
  (no causal halving). FlopCounterMode counts nothing for the CPU kernel of
  scaled_dot_product_attention (aten._scaled_dot_product_flash_attention_for_cpu); the kit counts it
  as torch counts the CUDA kernels: 2 b h Tq Tk d for Q K^T plus 2 b h Tq Tk d_v for att @ V.
- ``accounting`` (a component that declares ``active_parameters`` or ``aux_losses``, contract 3): the
  first is an int between 0 and its parameters; the second, after a training forward, a dict of finite
  scalar tensors in the autograd graph.
- ``stats`` (a component that declares it, contract 5): ``stats()`` takes no arguments and, after a
  training forward, gives a dict of finite float tensors by identifier, each a scalar or a 1-D share
  (non-negative, summing to 1), under names the training record leaves free.
- ``decode_cost`` (a component that declares one, contract 3): ``decode_cost(cache_len, dtype)`` is
  ``{"flops": int, "bytes": int}``, its FLOPs are what FlopCounterMode counts of decoding one token
  after cache_len cached ones (an attention's step on its filled cache, a position's embedding and
  attention context, another kind's forward over one token), and an attention's bytes hold at least
  its cache (``kv_bytes(1, cache_len, dtype)``).
- ``kv_bytes`` (attentions): ``kv_bytes(batch, max_len, dtype)`` equals the nbytes of the cache
  ``init_cache`` allocates, whose ``max_len`` is the one asked for (at the causality checks' size).
- ``causality[PARTNER]``, ``cache[PARTNER]``, ``cache-padded[PARTNER]`` (an attention with every
  registered position, a position with every registered attention): changing token t+1 never
  changes the logits at positions <= t; a prefill and one-token decode steps with the KV cache give
  the logits of one forward without it, also for a left-padded batch (attention_mask), over a
  sequence longer than twice the largest small int parameter (a window), within the context; at size
  gqa, or at the first size both accept when one refuses grouped key/value heads (a latent attention).
- ``decode_plan``: decoding steps through the native plan (its lowering, or the split plan that runs
  its eager forward inside the native step) give the logits of the eager steps.
- samplers: ``build``; ``sampler``: (B, V) in, (B, V) out, -inf stays -inf, at least one finite
  logit per row, a picking step's ``pick`` gives one possible token id per row; ``seeded``: two
  generations of a chain of the step (gptzoo.inference.sampling.SamplerChain), reset before each, pick
  the same tokens from the same torch.Generator seed whatever the global seed; ``padding``: a prompt
  left-padded as generate pads a batch (its first token repeated, ``real`` False there) gets the
  logits and the pick it gets without the padding.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gptzoo.testing.results import CheckResult
from gptzoo.testing.runner import run_conformance

if TYPE_CHECKING:
    from gptzoo.testing.collect import conformance as conformance
    from gptzoo.testing.collect import conformance_all as conformance_all

__all__ = ["CheckResult", "conformance", "conformance_all", "run_conformance"]


def __getattr__(name: str) -> Any:
    """``conformance`` and ``conformance_all`` import pytest, so only when asked for."""
    if name in ("conformance", "conformance_all"):
        return getattr(importlib.import_module("gptzoo.testing.collect"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
