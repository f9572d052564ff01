"""Contract 8's ``state_bytes``: the bytes of an attention's cache that do not grow with the length, which
`gptzoo build` shows per sequence apart from the KV cache per token; a plugin written for contract 7 (no such
member, or a method of that name that takes other arguments) is counted as before; a value that is no number of
bytes from 0 to the cache's is refused, naming the class."""

from __future__ import annotations

import pytest
from cli_run import run_error, run_json
from fakedist import FakeSite

HYBRID = [
    "--set",
    "model.layer_pattern=['conv','conv','attn']",
    "--set",
    "model.layer_types={conv={attention='short_conv'}, attn={}}",
]


def plugin(state_bytes: str) -> str:
    """An attention of a plugin: the built-in causal one, with this ``state_bytes`` (source of a method, or '')."""
    return f'''
from gptzoo_plugins._attentions import CausalSelfAttention


class Stateful(CausalSelfAttention):
    """Causal self-attention whose cache a plugin says more of."""
{state_bytes}

@gptzoo.hookimpl
def register_attentions(register):
    register("stateful", Stateful)
'''


def test_build_shows_a_hybrids_state_per_sequence_apart_from_its_kv_cache(capsys: pytest.CaptureFixture[str]) -> None:
    """llama-tiny (width 64, 2 KV heads of 16) with two short-convolution layers (kernel 3) and one of attention:
    a conv layer holds the last 2 inputs of its 64 channels, the attention 2 x 2 x 16 values a token."""
    memory = run_json(capsys, "build", "llama-tiny", "--set", "model.n_layer=3", *HYBRID)["memory"]
    assert memory["state_bytes_per_sequence"] == {"float32": 2 * 64 * 2 * 4, "bfloat16": 2 * 64 * 2 * 2}
    assert memory["kv_cache_bytes_per_token"] == {"float32": 2 * 2 * 16 * 4, "bfloat16": 2 * 2 * 16 * 2}
    kv, state = memory["kv_cache_bytes_per_token_by_layer_type"], memory["state_bytes_per_sequence_by_layer_type"]
    assert (kv["conv"]["float32"], state["conv"]["float32"], state["conv"]["layers"]) == (0, 2 * 64 * 2 * 4, 2)
    assert (kv["attn"]["float32"], state["attn"]["float32"], state["attn"]["layers"]) == (2 * 2 * 16 * 4, 0, 1)


@pytest.mark.parametrize(
    "method",
    [
        "",  # contract 7: no state_bytes
        "    def state_bytes(self):\n        return 'its own meaning'\n",  # a method of another shape, left alone
    ],
)
def test_a_contract_7_attention_is_counted_as_before(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str], method: str
) -> None:
    fake_site.add("stateful", "gptzoo_fake_stateful", "gptzoo_contract = 7\n" + plugin(method))
    ours = run_json(capsys, "build", "llama-tiny", "--set", "model.attention=stateful")["memory"]
    builtin = run_json(capsys, "build", "llama-tiny")["memory"]
    assert ours["kv_cache_bytes_per_token"] == builtin["kv_cache_bytes_per_token"]
    assert ours["state_bytes_per_sequence"] == {"float32": 0, "bfloat16": 0}


@pytest.mark.parametrize(("value", "shown"), [("-1", "-1"), ("10**12", "1000000000000"), ("0.5", "0.5")])
def test_a_state_that_is_no_share_of_the_cache_is_refused_by_name(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str], value: str, shown: str
) -> None:
    method = f"    def state_bytes(self, batch_size, dtype):\n        return {value}\n"
    fake_site.add("stateful", "gptzoo_fake_stateful", plugin(method))
    error = run_error(capsys, "build", "llama-tiny", "--set", "model.attention=stateful")
    assert error.startswith(
        f"error: Stateful.state_bytes(1, torch.float32) gave {shown}, not a number of bytes from 0 "
    )
    assert error.endswith("fix the attention plugin (gptzoo.hookspecs, register_attentions)")
