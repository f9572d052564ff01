"""Mixture of experts (Shazeer et al., 2017; Switch, Fedus et al., 2021): a router sends each token to
top_k of ``experts`` feed-forward experts and sums their outputs weighted by its scores, beside optional
shared experts that every token uses.

The router covers the families' routing rules (transformers 5.24's code is the reference for each):

- ``scoring``: "softmax" over the experts (Mixtral, Qwen-MoE, OLMoE, DeepSeek-V2) or "sigmoid" of each
  logit (DeepSeek-V3); taken in float32. "topk_softmax" (gpt-oss): the top_k experts chosen by their raw
  logits, their weights the softmax over those k logits only (in float32; the weights sum to 1, so
  ``normalize`` only rounds them again; gpt-oss has it off). Group-limited selection and ``score_bias``
  need every expert's score and are refused with it.
- ``groups`` / ``group_top_k``: group-limited selection (DeepSeek): the experts split into ``groups``
  equal groups, each scored by ``group_score`` ("max": its best expert, DeepSeek-V2; "top2": the sum of
  its best two, DeepSeek-V3), and only the experts of the best ``group_top_k`` groups may be picked.
- ``score_bias``: DeepSeek-V3's score-correction bias (a float32 buffer, e_score_correction_bias), added
  to the scores for choosing the experts only; the weights are the unbiased scores.
- ``normalize``: the top_k weights divided by their sum (+1e-20) (Mixtral always; Qwen-MoE, OLMoE and
  DeepSeek-V3 by norm_topk_prob); then multiplied by ``routed_scale`` (DeepSeek's routed_scaling_factor).

Ties between equal scores go as ``torch.topk`` breaks them, as in transformers. Each expert is a gated
(act(x W) * x V) U or dense U act(x W) MLP of width ``expert_ff`` (0: the model's d_ff), with biases when
the model has them or ``expert_bias`` (gpt-oss: biased experts beside an attention without biases);
``glu_limit`` > 0 makes a gated expert gpt-oss's clamped GLU: the gate clamped to at most the limit, the
up projection to [-limit, limit] and shifted by 1, (x V + 1) * act(x W) (gpt-oss's SwiGLU is this with
the activation quick_gelu, x sigmoid(1.702 x): its swiglu_alpha 1.702, limit 7.0); ``shared_ff`` > 0
adds one shared expert of that width (DeepSeek's n_shared_experts experts are one of their summed
width), optionally scaled per token by sigmoid(x g) (``shared_gate``, Qwen2-MoE).

A forward computes, for each expert that some token chose, its tokens only: a token costs the router,
top_k experts and the shared one, which is what ``flops`` and ``active_parameters`` count. Training: the
Switch load-balancing loss ``balance_loss`` (E sum_e f_e P_e, f_e the fraction of the tokens' choices
that went to expert e and P_e its mean routing probability; k when perfectly balanced), reported by
``aux_losses`` and weighted by ``[train] aux_loss_weight`` (transformers' router_aux_loss_coef); and the
expert load, the fraction of the tokens' choices that went to each expert (``stats``, contract 5), which
training logs per layer with its max/mean (1.0: perfectly balanced; E / k when every token picks the
same k experts: routing collapse).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gptzoo.flops import linear_flops

SCORINGS = ("softmax", "sigmoid", "topk_softmax")
GROUP_SCORES = ("max", "top2")
BALANCE_LOSSES = ("switch", "none")


class Expert(nn.Module):
    """One expert: c_proj(act(gate) * up) with c_fc = [gate; up] when gated, else c_proj(act(c_fc(x)));
    with ``limit`` > 0 (gated only), gpt-oss's clamped GLU: c_proj(act(gate.clamp(max=limit)) *
    (up.clamp(-limit, limit) + 1))."""

    def __init__(
        self, d_model: int, d_ff: int, *, activation: nn.Module, bias: bool, gated: bool, limit: float = 0.0
    ) -> None:
        super().__init__()
        self.gated, self.limit = gated, limit
        self.c_fc = nn.Linear(d_model, 2 * d_ff if gated else d_ff, bias=bias)
        self.act = activation
        self.c_proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        h = self.c_fc(x)
        if not self.gated:
            return self.c_proj(self.act(h))
        gate, up = h.chunk(2, dim=-1)  # (N, ff) each
        if self.limit:
            gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit) + 1
        return self.c_proj(self.act(gate) * up)


class Router(nn.Linear):
    """Scores, picks and weighs the experts of each token (the module docstring's rules): a linear layer
    d -> E of logits (initialized as the model's linears are; never quantized by ``--dtype int8``, which
    takes plain nn.Linear modules only, so the choice of experts stays that of the float weights)."""

    def __init__(
        self,
        d_model: int,
        experts: int,
        *,
        top_k: int,
        scoring: str,
        normalize: bool,
        routed_scale: float,
        groups: int,
        group_top_k: int,
        group_score: str,
        score_bias: bool,
        bias: bool,
    ) -> None:
        super().__init__(d_model, experts, bias=bias)
        self.experts, self.top_k, self.scoring, self.normalize = experts, top_k, scoring, normalize
        self.routed_scale, self.groups, self.group_top_k, self.group_score = (
            routed_scale,
            groups,
            group_top_k,
            group_score,
        )
        self.register_buffer("score_bias", torch.zeros(experts, dtype=torch.float32) if score_bias else None)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (N, d) -> the logits (N, E) in x's dtype, the weights (N, k) in float32 and the chosen experts (N, k)."""
        logits = super().forward(x)
        if self.scoring == "topk_softmax":
            top, chosen = logits.float().topk(self.top_k, dim=-1)  # (N, k) each
            weights = top.softmax(dim=-1)
        else:
            weights, chosen = self._choose(logits)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        if self.routed_scale != 1.0:
            weights = weights * self.routed_scale
        return logits, weights, chosen

    def _choose(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """The softmax or sigmoid rules: the chosen experts' scores (N, k) and the experts (N, k)."""
        scores = logits.float().softmax(dim=-1) if self.scoring == "softmax" else logits.float().sigmoid()
        choice = scores if self.score_bias is None else scores + self.score_bias
        if self.groups > 1:
            grouped = choice.view(-1, self.groups, self.experts // self.groups)
            if self.group_score == "max":
                group_scores = grouped.amax(dim=-1)
            else:
                group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
            best = group_scores.topk(self.group_top_k, dim=-1, sorted=False).indices  # (N, group_top_k)
            allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
            allowed = allowed[:, :, None].expand_as(grouped).reshape_as(choice)
            choice = choice.masked_fill(~allowed, float("-inf"))
        chosen = choice.topk(self.top_k, dim=-1, sorted=False).indices  # (N, k)
        return scores.gather(1, chosen), chosen


class MixtureOfExperts(nn.Module):
    """Mixture of experts: a router sends each token to top_k of its experts, beside optional shared ones.

    The routing rules and what a forward computes: the module docstring."""

    examples = [
        {"experts": 3, "top_k": 1, "gated": False},
        {"experts": 6, "top_k": 3, "scoring": "sigmoid", "groups": 3, "group_top_k": 2, "group_score": "top2"},
        {"experts": 4, "top_k": 2, "groups": 2, "group_top_k": 1, "normalize": False, "routed_scale": 2.5},
        {"experts": 5, "top_k": 2, "shared_ff": 12, "shared_gate": True, "expert_ff": 8},
        {"experts": 4, "top_k": 2, "score_bias": True, "scoring": "sigmoid", "router_bias": True},
        {
            "experts": 5,
            "top_k": 3,
            "scoring": "topk_softmax",
            "normalize": False,
            "router_bias": True,
            "expert_bias": True,
            "glu_limit": 0.5,
        },
    ]
    """What the conformance kit runs besides the defaults: top-1, dense experts, each routing rule, shared experts,
    gpt-oss's experts (a limit its random activations reach)."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        activation: nn.Module,
        bias: bool,
        experts: int = 8,
        top_k: int = 2,
        expert_ff: int = 0,
        gated: bool = True,
        scoring: str = "softmax",
        normalize: bool = True,
        routed_scale: float = 1.0,
        groups: int = 1,
        group_top_k: int = 1,
        group_score: str = "max",
        score_bias: bool = False,
        router_bias: bool = False,
        expert_bias: bool = False,
        glu_limit: float = 0.0,
        shared_ff: int = 0,
        shared_gate: bool = False,
        balance_loss: str = "switch",
    ) -> None:
        super().__init__()
        self.d_ff, self.expert_ff = d_ff, expert_ff or d_ff
        self.top_k, self.balance_loss = top_k, balance_loss
        self.router = Router(
            d_model,
            experts,
            top_k=top_k,
            scoring=scoring,
            normalize=normalize,
            routed_scale=routed_scale,
            groups=groups,
            group_top_k=group_top_k,
            group_score=group_score,
            score_bias=score_bias,
            bias=router_bias,
        )
        expert = {"activation": activation, "bias": bias or expert_bias, "gated": gated, "limit": glu_limit}
        self.experts = nn.ModuleList(Expert(d_model, self.expert_ff, **expert) for _ in range(experts))
        self.shared = Expert(d_model, shared_ff, **expert) if shared_ff else None
        self.shared_gate = nn.Linear(d_model, 1, bias=False) if shared_gate else None
        self._routing: tuple[Tensor, Tensor] | None = None  # the latest forward's probabilities and choices
        self._chosen: Tensor | None = None  # the latest forward's chosen experts (N, k)

    @staticmethod
    def check(
        *,
        d_model: int = 1,
        experts: int = 8,
        top_k: int = 2,
        expert_ff: int = 0,
        scoring: str = "softmax",
        routed_scale: float = 1.0,
        groups: int = 1,
        group_top_k: int = 1,
        group_score: str = "max",
        score_bias: bool = False,
        gated: bool = True,
        glu_limit: float = 0.0,
        shared_ff: int = 0,
        shared_gate: bool = False,
        balance_loss: str = "switch",
        **_: object,
    ) -> list[str]:
        problems = []
        if experts < 1:
            problems.append(f"experts must be >= 1, got {experts}")
        if not 1 <= top_k <= max(experts, 1):
            problems.append(f"top_k must be between 1 and experts ({experts}), got {top_k}")
        if expert_ff < 0 or shared_ff < 0:
            problems.append(f"expert_ff and shared_ff must be >= 0 (0: d_ff, none), got {expert_ff} and {shared_ff}")
        if scoring not in SCORINGS:
            problems.append(f"scoring must be one of {', '.join(map(repr, SCORINGS))}, got {scoring!r}")
        if routed_scale <= 0:
            problems.append(f"routed_scale must be positive, got {routed_scale}")
        if groups < 1 or experts % max(groups, 1):
            problems.append(f"groups must divide experts ({experts}) into equal groups, got {groups}")
        elif not 1 <= group_top_k <= groups:
            problems.append(f"group_top_k must be between 1 and groups ({groups}), got {group_top_k}")
        elif groups > 1 and group_top_k * (experts // groups) < top_k:
            problems.append(
                f"group_top_k={group_top_k} groups of {experts // groups} experts hold fewer than top_k={top_k}"
            )
        if group_score not in GROUP_SCORES:
            problems.append(f"group_score must be one of {', '.join(map(repr, GROUP_SCORES))}, got {group_score!r}")
        elif group_score == "top2" and groups > 1 and experts // groups < 2:
            problems.append(f"group_score 'top2' needs groups of at least 2 experts, got {experts // groups}")
        if scoring == "topk_softmax" and (groups > 1 or score_bias):
            problems.append(
                "scoring 'topk_softmax' picks experts by their raw logits; group-limited selection (groups > 1) and "
                "score_bias need every expert's score (scoring 'softmax' or 'sigmoid')"
            )
        if not glu_limit >= 0:
            problems.append(f"glu_limit must be 0 (off) or a positive clamp, got {glu_limit}")
        elif glu_limit and not gated:
            problems.append(
                "glu_limit clamps a gated expert's gate and up projections; set gated = true or glu_limit = 0"
            )
        if shared_gate and not shared_ff:
            problems.append("shared_gate needs a shared expert (shared_ff > 0)")
        if balance_loss not in BALANCE_LOSSES:
            problems.append(f"balance_loss must be one of {', '.join(map(repr, BALANCE_LOSSES))}, got {balance_loss!r}")
        return problems

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # (N, d)
        logits, weights, chosen = self.router(x)
        out = torch.zeros_like(x)
        for e in self._chosen_experts(chosen):
            token, slot = torch.where(chosen == e)
            y = self.experts[e](x[token]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + shared
        self._chosen = chosen
        if self.balance_loss != "none":
            self._routing = (logits.float().softmax(dim=-1), chosen)
        return out.reshape(shape)

    def _chosen_experts(self, chosen: Tensor) -> list[int]:
        """The experts some token chose, in order (none on the meta device, where a forward only gives shapes)."""
        if chosen.is_meta:
            return []
        return torch.bincount(chosen.flatten(), minlength=len(self.experts)).nonzero().flatten().tolist()

    def aux_losses(self) -> dict[str, Tensor]:
        if self._routing is None:
            return {}
        probs, chosen = self._routing
        fraction = torch.bincount(chosen.flatten(), minlength=probs.shape[-1]).to(probs.dtype) / chosen.shape[0]
        return {"balance": probs.shape[-1] * (fraction * probs.mean(dim=0)).sum()}

    def stats(self) -> dict[str, Tensor]:
        if self._chosen is None or self._chosen.is_meta:
            return {}
        chosen = self._chosen.flatten()
        load = torch.bincount(chosen, minlength=len(self.experts)).float() / chosen.numel()
        return {"expert_load": load}

    def flops(self, batch: int, seq_len: int) -> dict[str, int]:
        n = batch * seq_len
        expert = self.experts[0]
        parts = {
            "router": 2 * n * self.router.weight.numel(),
            "experts": self.top_k * linear_flops(n, expert.c_fc, expert.c_proj),
        }
        if self.shared is not None:
            parts["shared expert"] = linear_flops(n, self.shared.c_fc, self.shared.c_proj)
            if self.shared_gate is not None:
                parts["shared expert"] += linear_flops(n, self.shared_gate)
        return parts

    def active_parameters(self) -> int:
        def count(module: nn.Module | None) -> int:
            return 0 if module is None else sum(p.numel() for p in module.parameters())

        routed = sum(count(e) for e in self.experts)
        return count(self) - routed + self.top_k * count(self.experts[0])
