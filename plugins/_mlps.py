"""Feed-forward blocks: dense (GPT-2) and gated (GLU variants, Shazeer 2020: SwiGLU, GeGLU).

The gated MLP keeps its gate and up projections in one matrix ``c_fc`` (d -> 2 d_ff, gate rows
first), so it costs one matmul, not two.
"""

from __future__ import annotations

from torch import Tensor, nn

from gptzoo.flops import linear_flops


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
