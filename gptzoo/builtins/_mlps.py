"""Feed-forward blocks: dense (GPT-2) and gated (GLU variants, Shazeer 2020: SwiGLU, GeGLU).

The gated MLP keeps its gate and up projections in one matrix ``c_fc`` (d -> 2 d_ff, gate rows
first), so it costs one matmul, not two; its Llama weight map splits it into gate_proj and up_proj, and
Phi-3 stores it as it is (gate_up_proj). GPT-NeoX stores the dense MLP as nn.Linear (dense_h_to_4h,
dense_4h_to_h), GPT-2 as Conv1D ([in, out]).
"""

from __future__ import annotations

from torch import Tensor, nn

from gptzoo.flops import linear_flops
from gptzoo.interfaces import TensorMap

_KINDS = ("weight", "bias")


class DenseMLP(nn.Module):
    """Dense MLP: c_proj(act(c_fc(x))), d -> d_ff -> d."""

    def __init__(self, d_model: int, d_ff: int, *, activation: nn.Module, bias: bool) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, d_ff, bias=bias)
        self.act = activation
        self.c_proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(self.act(self.c_fc(x)))

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        return {"mlp": linear_flops(batch * seq_len, self.c_fc, self.c_proj)}

    def hf_weights(self, family: str) -> list[TensorMap] | None:
        if family == "gpt_neox":  # nn.Linear; its MLP always has biases
            if self.c_fc.bias is None:
                return None
            names = {"c_fc": "dense_h_to_4h", "c_proj": "dense_4h_to_h"}
            return [TensorMap(f"{ours}.{k}", (f"{theirs}.{k}",)) for ours, theirs in names.items() for k in _KINDS]
        if family != "gpt2":
            return None
        maps = [
            TensorMap(f"{name}.weight", (f"{name}.weight",), transpose=True) for name in ("c_fc", "c_proj")
        ]  # Conv1D
        if self.c_fc.bias is not None:
            maps += [TensorMap(f"{name}.bias", (f"{name}.bias",)) for name in ("c_fc", "c_proj")]
        return maps


class GatedMLP(nn.Module):
    """Gated MLP: c_proj(act(x W) * (x V)); SwiGLU with silu, GeGLU with gelu."""

    def __init__(self, d_model: int, d_ff: int, *, activation: nn.Module, bias: bool) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, 2 * d_ff, bias=bias)  # [W; V]
        self.act = activation
        self.c_proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.c_fc(x).chunk(2, dim=-1)  # (B, T, d_ff) each
        return self.c_proj(self.act(gate) * up)

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        return {"mlp": linear_flops(batch * seq_len, self.c_fc, self.c_proj)}

    def hf_weights(self, family: str) -> list[TensorMap] | None:
        if family == "phi3":  # gate_up_proj is c_fc as it is ([gate; up]); Phi-3 has no biases
            if self.c_fc.bias is not None:
                return None
            return [
                TensorMap("c_fc.weight", ("gate_up_proj.weight",)),
                TensorMap("c_proj.weight", ("down_proj.weight",)),
            ]
        if family != "llama":
            return None
        d_ff = self.c_proj.in_features
        kinds = ("weight", "bias") if self.c_fc.bias is not None else ("weight",)
        return [
            *(TensorMap(f"c_fc.{k}", (f"gate_proj.{k}", f"up_proj.{k}"), sizes=(d_ff, d_ff)) for k in kinds),
            *(TensorMap(f"c_proj.{k}", (f"down_proj.{k}",)) for k in kinds),
        ]
