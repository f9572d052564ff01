"""DeepSeek-V2 and DeepSeek-V3 checkpoints as Hugging Face stores them (DeepseekV2ForCausalLM,
DeepseekV3ForCausalLM; DeepSeek-AI, 2024).

Llama's keys and Pre-LN block (gptzoo.hf.llama) with multi-head latent attention and a mixture of experts:

- ``self_attn``: gptzoo's ``mla`` attention (plugins/_mla.py): ``q_proj``, or ``q_a_proj``,
  ``q_a_layernorm`` and ``q_b_proj`` when q_lora_rank is set; ``kv_a_proj_with_mqa``, ``kv_a_layernorm``,
  ``kv_b_proj``, ``o_proj``. The recipe's head_dim is qk_rope_head_dim (as the configs' head_dim). The
  rotary features are interleaved pairs (V2 always, V3 when rope_interleave). With a rope scaling that has
  mscale_all_dim (YaRN), the softmax scale is qk_head_dim^-1/2 x mscale(factor, mscale_all_dim)^2. The two
  latent norms are RMSNorms of epsilon 1e-6 whatever rms_norm_eps says; gptzoo builds them with the
  model's norm, so a config.json whose rms_norm_eps is not 1e-6 is refused.
- ``mlp``: the first first_k_dense_replace layers have a gated MLP of intermediate_size (a recipe's
  layer type "dense"), the others gptzoo's ``moe``: the router ``gate`` and expert e's
  ``experts.e.{gate,up,down}_proj`` (n_routed_experts of moe_intermediate_size, num_experts_per_tok
  each), n_shared_experts shared experts as one of their summed width (``shared_experts``), the weights
  times routed_scaling_factor. V2: the softmax of the router's logits, top-k over all experts (topk_method
  "greedy") or over the best topk_group of n_group groups by their best expert ("group_limited_greedy"),
  never renormalized (V2's router reads no norm_topk_prob). V3: the sigmoid of the logits, chosen with the
  score-correction bias ``gate.e_score_correction_bias`` among the best topk_group of n_group groups by
  the sum of their best two, renormalized when norm_topk_prob.

attention_bias and mlp_bias are refused (gptzoo's bias covers the attention and the experts alike, and
DeepSeek's checkpoints have none); V3's multi-token-prediction layers (num_nextn_predict_layers) are not
part of the causal LM transformers builds and are not read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gptzoo.hf.family import Fields, refuse, show
from gptzoo.hf.layouts import builtin
from gptzoo.hf.llama import ACTIVATIONS, Llama, kinds, plain_embeddings_and_logits, rope_position
from gptzoo.hf.mistral import layers_text, schedule
from gptzoo.hf.moe import MOE_LAYER, expert_maps, features, moe_component, moe_config, moe_layout
from gptzoo.hf.tensor_map import TensorMap
from gptzoo.recipe import Recipe

MLA = "gptzoo_plugins._mla:LatentAttention"
LATENT_EPS = 1e-6
"""The epsilon of DeepSeek's latent norms (q_a_layernorm, kv_a_layernorm), whatever rms_norm_eps says."""
SCALE = "mla_scale_factor"
"""The per-layer field the attention's layout gives: its softmax scale over qk_head_dim^-1/2 (never written;
the family checks it against the rope scaling's mscale_all_dim)."""
SCALING = "rope_scaling"


def mla_maps(attn: Any) -> list[TensorMap]:
    """The latent attention's linears under DeepSeek's names (its norms are children)."""
    names = {"kv_a": "kv_a_proj_with_mqa", "kv_b": "kv_b_proj", "c_proj": "o_proj"}
    names.update({"q_a": "q_a_proj", "q_b": "q_b_proj"} if attn.q_rank else {"q": "q_proj"})
    return [
        TensorMap(f"{ours}.{k}", (f"{theirs}.{k}",))
        for ours, theirs in names.items()
        for k in kinds(getattr(attn, ours))
    ]


def mla_fields(attn: Any) -> dict[str, Any]:
    return {
        "kv_lora_rank": attn.kv_rank,
        "q_lora_rank": attn.q_rank or None,
        "qk_nope_head_dim": attn.nope_dim,
        "qk_rope_head_dim": attn.rope_dim,
        "v_head_dim": attn.v_dim,
        "rope_interleave": attn.rope_interleave,
        SCALE: attn.scale * math.sqrt(attn.nope_dim + attn.rope_dim),
    }


V2_NAMES = {
    "experts": "n_routed_experts",
    "top_k": "num_experts_per_tok",
    "expert_ff": "moe_intermediate_size",
    "routed_scale": "routed_scaling_factor",
}
"""The routing features DeepseekV2Config has a field for (the others are fixed: :func:`v2_groups`)."""
V3_NAMES = {**V2_NAMES, "normalize": "norm_topk_prob"}


def v2_groups(given: Mapping[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """V2's group fields of an expert layer (written into ``fields``) and the features it fixes: the
    softmax, never renormalized, groups scored by their best expert."""
    if given["groups"] > 1:
        fields.update({"topk_method": "group_limited_greedy", "n_group": given["groups"]})
        fields["topk_group"] = given["group_top_k"]
    else:
        fields["topk_method"] = "greedy"
    return {"scoring": "softmax", "normalize": False, "score_bias": False, "group_score": "max"}


def v3_groups(given: Mapping[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """V3's: sigmoid scores chosen with the correction bias, groups scored by the sum of their best two."""
    fields.update({"n_group": given["groups"], "topk_group": given["group_top_k"]})
    return {"scoring": "sigmoid", "score_bias": True, **({"group_score": "top2"} if given["groups"] > 1 else {})}


def moe_fields(moe: Any, names: Mapping[str, str], groups: Any) -> dict[str, Any]:
    """config.json fields of an expert layer (export): gptzoo.hf.moe.moe_config's under the family's rules
    (``groups`` writes its group fields and gives the routing it fixes), and the shared expert as
    n_shared_experts when it is a whole number of experts wide (else its width under its own name, refused)."""
    given = features(moe)
    fields: dict[str, Any] = {}
    rules = {**groups(given, fields), "groups": given["groups"], "group_top_k": given["group_top_k"]}
    rules["own_width"] = given["own_width"]  # moe_intermediate_size says the experts' width, whatever d_ff is
    shared, width = given["shared_ff"], given["expert_ff"]
    if shared % width == 0:
        fields["n_shared_experts"] = shared // width
        rules["shared_ff"] = shared
    return {**moe_config(moe, names, rules), **fields}


def layouts(layout: str, names: Mapping[str, str], groups: Any) -> tuple[Any, ...]:
    """A DeepSeek layout of the built-in components: the latent attention, the mixture of experts (the
    others are Llama's), and a refusal of gptzoo's other attentions (Llama's layout, which the family
    extends, would write q/k/v projections that DeepSeek's model has no place for)."""
    return (
        builtin(
            MLA, layout, mla_maps, mla_fields, children=(("q_norm", "q_a_layernorm"), ("kv_norm", "kv_a_layernorm"))
        ),
        builtin("gptzoo_plugins._attentions:CausalSelfAttention", layout, lambda attn: None),
        moe_layout(layout, lambda m: expert_maps(m, shared="shared_experts"), lambda m: moe_fields(m, names, groups)),
    )


def yarn_mscale(scaling: Mapping[str, Any] | None) -> float:
    """transformers' yarn_apply_mscale factor: mscale(factor, mscale_all_dim)^2 for a scaled rope with
    mscale_all_dim, else 1."""
    if not scaling or scaling.get("rope_type", scaling.get("type", "default")) == "default":
        return 1.0
    factor, all_dim = scaling.get("factor") or 1.0, scaling.get("mscale_all_dim") or 0.0
    if not all_dim or factor <= 1:
        return 1.0
    return (0.1 * all_dim * math.log(factor) + 1.0) ** 2


class DeepseekV2(Llama):
    name = "deepseek_v2"
    model_type = "deepseek_v2"
    architecture = "DeepseekV2ForCausalLM"
    title = "DeepSeek-V2"
    layout = "deepseek_v2"  # set here: a subclass of Llama would inherit "llama"
    extends = Llama()
    per_layer = frozenset({MOE_LAYER, SCALE, SCALING})
    required = {**Llama.required, "kv_lora_rank": "attention"}
    component_layouts = layouts("deepseek_v2", V2_NAMES, v2_groups)
    mla_known = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    moe_known = ("n_shared_experts", "n_group", "topk_group")
    known = frozenset({*Llama.known, *mla_known, *V2_NAMES.values(), *moe_known, "topk_method"})
    implied: Mapping[str, Any] = {"rope_interleave": True}
    defaults = {"experts": 64, "expert_ff": 1407, "shared": 2, "dense": 0, "context": 2048, "scale": 1.0}
    """DeepseekV2Config's defaults of the fields a config.json may omit."""

    @property
    def size_defaults(self) -> Mapping[str, Any]:  # type: ignore[override]
        """DeepseekV2Config's and V3's defaults of the sizes a config.json may omit."""
        return {
            "vocab_size": 102400,
            "n_embd": 4096,
            "n_head": 32,
            "n_layer": 32,
            "d_ff": 11008,
            "context_length": self.defaults["context"],
        }

    def recipe_data(self, config: Mapping[str, Any]) -> dict[str, Any]:
        f = Fields(config)
        sizes = self.read_sizes(f)
        n_head, n_layer, context_length = sizes["n_head"], sizes["n_layer"], sizes["context_length"]
        rope_dim = f.integer("qk_rope_head_dim", 64)
        position = rope_position(f, context_length)
        attention: dict[str, Any] = {
            "name": "mla",
            "kv_rank": f.integer("kv_lora_rank", 512),
            "nope_dim": f.integer("qk_nope_head_dim", 128),
            "v_dim": f.integer("v_head_dim", 128),
            "rope_interleave": self.rope_interleave(f),
        }
        if config.get("q_lora_rank", 1536) is not None:
            attention["q_rank"] = f.integer("q_lora_rank", 1536)
        mscale = yarn_mscale(f.mapping("rope_scaling") or f.mapping("rope_parameters"))
        if mscale != 1.0:
            attention["scale"] = (attention["nope_dim"] + rope_dim) ** -0.5 * mscale
        n_kv_head = sizes["n_kv_head"]
        if n_kv_head != n_head:
            f.problems.append(
                f"config.json num_key_value_heads={n_kv_head} is not supported: {self.title}'s latent attention "
                f"expands its latent into keys and values for every one of the num_attention_heads={n_head} heads"
            )
        eps = f.number("rms_norm_eps", LATENT_EPS)
        if eps != LATENT_EPS:
            f.problems.append(
                f"config.json rms_norm_eps={show(eps)} is not supported: {self.title}'s latent norms use "
                f"{LATENT_EPS} whatever rms_norm_eps says, and gptzoo builds them with the model's norm"
            )
        model = {
            **sizes,
            "n_kv_head": n_head,
            "head_dim": rope_dim,
            "bias": False,
            "norm": {"name": "rmsnorm", "eps": eps},
            "norm_placement": "pre",
            "activation": f.choice("hidden_act", "silu", ACTIVATIONS),
            "mlp": self.moe(f),
            "position": position,
            "attention": attention,
        }
        first_dense = f.config.get("first_k_dense_replace")
        first_dense = self.defaults["dense"] if first_dense is None else first_dense
        if type(first_dense) is not int or first_dense < 0:
            f.problems.append(f"config.json first_k_dense_replace={show(first_dense)} is not an integer >= 0")
            first_dense = 0
        model.update(schedule(model, [None] * n_layer, [i < first_dense for i in range(n_layer)]))
        for field in ("attention_bias", "mlp_bias"):
            if f.flag(field, False):
                f.problems.append(
                    f"config.json {field}=true is not supported ({self.title}'s checkpoints have no biases, and "
                    "gptzoo's bias covers the attention and the experts alike)"
                )
        f.problems += refuse(config, {})
        f.check()
        return {"model": model, "tokenizer": {"name": "hf"}}

    def rope_interleave(self, f: Fields) -> bool:
        return True

    def moe(self, f: Fields) -> dict[str, Any]:
        """The ``moe`` mlp of the layers with experts."""
        component = self.moe_common(f)
        method = f.config.get("topk_method", "greedy")
        if method == "group_limited_greedy":
            component.update(self.groups(f))
        elif method != "greedy":
            f.problems.append(
                f"config.json topk_method={show(method)} is not supported (DeepseekV2ForCausalLM routes by "
                "'greedy' or 'group_limited_greedy')"
            )
        return component

    def moe_common(self, f: Fields) -> dict[str, Any]:
        expert_ff = f.integer("moe_intermediate_size", self.defaults["expert_ff"])
        shared = f.config.get("n_shared_experts", self.defaults["shared"]) or 0
        if type(shared) is not int or shared < 0:
            f.problems.append(f"config.json n_shared_experts={show(shared)} is not an integer >= 0")
            shared = 0
        if f.config.get("num_experts_per_tok") is None:
            f.problems.append("config.json has no num_experts_per_tok (how many experts each token uses)")
        component = moe_component(
            f,
            experts="n_routed_experts",
            aliases=("num_local_experts",),
            experts_default=self.defaults["experts"],
            top_k_default=1,
            expert_ff=expert_ff,
            **self.moe_rules(f),
        )
        scale = f.number("routed_scaling_factor", self.defaults["scale"])
        if scale != 1.0:
            component["routed_scale"] = scale
        if shared:
            component["shared_ff"] = shared * expert_ff
        return component

    def moe_rules(self, f: Fields) -> dict[str, Any]:
        """The routing parameters the family fixes (V2: softmax, never renormalized)."""
        return {"normalize": False}

    def groups(self, f: Fields) -> dict[str, Any]:
        """Group-limited selection: n_group groups, the best topk_group of them."""
        n_group, top_group = f.integer("n_group", 1), f.integer("topk_group", 1)
        experts = f.config.get("n_routed_experts", self.defaults["experts"])
        if type(experts) is int and experts % n_group:
            f.problems.append(
                f"config.json n_group={n_group} does not divide the n_routed_experts={experts} experts into "
                "equal groups"
            )
        if top_group > n_group:
            f.problems.append(f"config.json topk_group={top_group} is more than the n_group={n_group} groups")
        return {"groups": n_group, "group_top_k": min(top_group, n_group)} if n_group > 1 else {}

    def structural_reasons(self, recipe: Recipe) -> list[str]:
        m, reasons = recipe.model, []
        if m.norm_placement != "pre":
            reasons.append(f"norm_placement {m.norm_placement!r} ({self.title} is Pre-LN)")
        if m.bias:
            reasons.append(f"bias=true ({self.title} has no biases)")
        return reasons + plain_embeddings_and_logits(recipe, self.title)

    def structure(self, recipe: Recipe) -> dict[str, Any]:
        return {
            **self.write_sizes(recipe),
            "head_dim": recipe.model.head_dim,
            "attention_bias": False,
            "mlp_bias": False,
        }

    def layer_config(self, recipe: Recipe, values: dict[str, list[Any]], reasons: list[str]) -> dict[str, Any]:
        sparse = [bool(s) for s in values[MOE_LAYER]]
        first = sparse.index(True) if True in sparse else len(sparse)
        late_dense = [i for i in range(first, len(sparse)) if not sparse[i]]
        if late_dense:
            reasons.append(
                f"no experts on {layers_text(late_dense)} ({self.title}'s layers without experts are the first "
                "first_k_dense_replace ones)"
            )
        scalings = [s for s in values[SCALING] if s is not None]
        scaling = scalings[0] if scalings else None
        if any(s != scaling for s in values[SCALING]):
            reasons.append(f"the rope scaling differs between layers ({self.title} has one)")
        expected = yarn_mscale(scaling)
        for factor in dict.fromkeys(v for v in values[SCALE] if v is not None):
            if not math.isclose(factor, expected, rel_tol=1e-6):
                reasons.append(
                    f"attention 'mla' scales its scores by {factor:g} x qk_head_dim^-1/2; {self.title} derives "
                    f"{expected:g} x from the rope scaling's mscale_all_dim"
                )
        fields: dict[str, Any] = {"first_k_dense_replace": first}
        if scaling is not None:
            fields[SCALING] = scaling
        return fields


class DeepseekV3(DeepseekV2):
    name = "deepseek_v3"
    model_type = "deepseek_v3"
    architecture = "DeepseekV3ForCausalLM"
    title = "DeepSeek-V3"
    layout = "deepseek_v3"
    component_layouts = layouts("deepseek_v3", V3_NAMES, v3_groups)
    known = frozenset(
        {*Llama.known, *DeepseekV2.mla_known, *V3_NAMES.values(), *DeepseekV2.moe_known, "rope_interleave"}
    )
    implied: Mapping[str, Any] = {}
    defaults = {"experts": 256, "expert_ff": 2048, "shared": 1, "dense": 3, "context": 4096, "scale": 2.5}

    def rope_interleave(self, f: Fields) -> bool:
        return f.flag("rope_interleave", True)

    def moe(self, f: Fields) -> dict[str, Any]:
        return {**self.moe_common(f), **self.groups(f)}

    def moe_rules(self, f: Fields) -> dict[str, Any]:
        """V3: sigmoid scores, the correction bias, groups scored by their best two."""
        rules = {"scoring": "sigmoid", "score_bias": True, "normalize": f.flag("norm_topk_prob", True)}
        return {**rules, "group_score": "top2"} if f.integer("n_group", 8) > 1 else rules
