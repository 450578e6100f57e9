"""Mixture-of-experts and multi-head latent attention, as data.

Two optional parts of a ``ModelSpec`` (fields ``moe``, ``mla``; ``None``: absent). The attention
features of the MoE families (``head_dim``, Q/K/V and output biases, Q/K norms, sliding windows on
all or even layers, GPT-OSS's per-head sinks) are the ModelSpec's own fields (``plait.spec.model``).

``MoESpec`` (the MLP of some layers is a set of routed experts, plus optional shared experts):
  every expert is a SwiGLU MLP (gate and up: hidden -> ffn, down: ffn -> hidden). A token goes
  through ``top_k`` of the ``n_experts`` routed experts, chosen by a router (a hidden x n_experts
  linear layer), and through every shared expert. Which layers: the first ``first_dense`` layers
  are dense (the model's ``ffn_hidden`` MLP); after them every ``every``-th layer is MoE and the
  others dense (Megatron's ``moe_layer_freq``; Qwen2/3-MoE's decoder_sparse_step 2, experts on
  layers 1, 3, ..., is first_dense=1, every=2: ``plait.spec.moe.hf_layers``). Router types:
    * ``softmax``: softmax over the router logits, the top-k experts, their weights renormalized
      to sum to one when ``norm_topk`` (Mixtral, Qwen3-MoE; GPT-OSS's "top-k, then softmax over
      the k" is the same function). OLMoE keeps the un-normalized weights (``norm_topk=False``).
      With ``n_groups`` > 1 a token chooses within its best ``topk_groups`` groups, a group scored
      by its best probability (DeepSeek-V2's group_limited_greedy; weights times ``route_scale``).
    * ``sigmoid``: sigmoid scores; the top-k are chosen on score + a per-expert bias that a
      balancing rule (not the gradient) adjusts, within the best ``topk_groups`` of ``n_groups``
      expert groups; weights are the chosen scores normalized, times ``route_scale``
      (DeepSeek-V3: 8 groups, 4 chosen, scale 2.5; the bias is a buffer, not a parameter).
  ``capacity_factor`` 0 is dropless (every routed token is computed); c > 0 caps each expert at
  c · tokens · top_k / n_experts tokens (the rest are dropped). ``aux_loss_coef``: weight of the
  load-balancing loss (Switch-style f·P sum), 0 for none.

``MLASpec`` (DeepSeek-V2/V3): queries from a rank-``q_lora_rank`` latent (0: straight from the
  hidden state), keys and values from one rank-``kv_lora_rank`` latent plus a shared RoPE key of
  ``qk_rope_head_dim``; per head, query/key width ``qk_nope_head_dim + qk_rope_head_dim`` and value
  width ``v_head_dim``. ``n_kv_heads`` equals ``n_heads`` for an MLA model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache


ROUTERS = ("softmax", "sigmoid")
EXPERT_ACTIVATIONS = ("silu", "oai")  # SwiGLU; GPT-OSS's clamped SwiGLU (alpha OAI_ALPHA, (up + 1))
OAI_ALPHA = 1.702  # GPT-OSS's sigmoid sharpness (transformers' GptOssConfig.swiglu_alpha)
OAI_LIMIT = 7.0  # GPT-OSS's clamp of the gate and up projections (GptOssConfig.swiglu_limit)


def _positive(obj, names: tuple[str, ...], minimum: int = 1) -> list[str]:
    out = []
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            out.append(f"{name}={value!r} must be an integer >= {minimum}")
    return out


@dataclass(frozen=True)
class MoESpec:
    """Routed (and shared) experts; see the module docstring. Sizes are element counts."""

    n_experts: int  # routed experts per MoE layer
    top_k: int  # routed experts per token
    expert_ffn: int  # hidden size of one routed expert's SwiGLU MLP
    n_shared: int = 0  # shared experts every token goes through
    shared_ffn: int = 0  # hidden size of one shared expert (0: expert_ffn)
    shared_gate: bool = False  # shared output scaled by sigmoid(hidden·w), w of hidden elements (Qwen2-MoE)
    first_dense: int = 0  # leading dense layers (DeepSeek-V3: 3)
    every: int = 1  # after them, every ``every``-th layer is MoE (1: all of them)
    router: str = "softmax"  # "softmax" (top-k of softmax) or "sigmoid" (DeepSeek-V3, bias-balanced)
    norm_topk: bool = True  # renormalize the top-k weights to sum to one
    n_groups: int = 1  # expert groups for group-limited routing (DeepSeek-V3: 8)
    topk_groups: int = 1  # groups a token may use (DeepSeek-V3: 4); n_groups=1: no limit
    route_scale: float = 1.0  # routed output multiplier (DeepSeek-V3: 2.5)
    router_bias: bool = False  # the router's linear layer has a bias (GPT-OSS)
    expert_bias: bool = False  # expert projections have biases (GPT-OSS)
    activation: str = "silu"  # "silu" (SwiGLU) or "oai" (GPT-OSS's clamped SwiGLU)
    capacity_factor: float = 0.0  # 0: dropless; c > 0: an expert takes at most c·tokens·top_k/n_experts
    aux_loss_coef: float = 0.0  # load-balancing loss weight (0: none)

    def problems(self) -> list[str]:
        out = _positive(self, ("n_experts", "top_k", "expert_ffn", "every", "n_groups", "topk_groups"))
        out += _positive(self, ("n_shared", "shared_ffn", "first_dense"), minimum=0)
        if out:
            return out
        if self.top_k > self.n_experts:
            out.append(f"top_k={self.top_k} is more than n_experts={self.n_experts}")
        if self.router not in ROUTERS:
            out.append(f"router={self.router!r} must be one of {', '.join(ROUTERS)}")
        if self.activation not in EXPERT_ACTIVATIONS:
            out.append(f"activation={self.activation!r} must be one of {', '.join(EXPERT_ACTIVATIONS)}")
        if self.n_experts % self.n_groups:
            out.append(f"n_groups={self.n_groups} does not divide n_experts={self.n_experts}")
        if self.topk_groups > self.n_groups:
            out.append(f"topk_groups={self.topk_groups} is more than n_groups={self.n_groups}")
        if not 0.0 <= float(self.capacity_factor) <= 1e6 or not 0.0 <= float(self.aux_loss_coef) <= 1e6:
            out.append("capacity_factor and aux_loss_coef must be >= 0")
        if not float(self.route_scale) > 0.0:
            out.append(f"route_scale={self.route_scale!r} must be > 0")
        return out

    @property
    def shared_width(self) -> int:
        """Hidden size of one shared expert."""
        return self.shared_ffn or self.expert_ffn

    @property
    def dropless(self) -> bool:
        return self.capacity_factor == 0.0


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3); see the module docstring."""

    q_lora_rank: int  # 0: queries straight from the hidden state
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def problems(self) -> list[str]:
        return (_positive(self, ("q_lora_rank",), minimum=0)
                + _positive(self, ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")))

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


_PARTS = {"moe": MoESpec, "mla": MLASpec}


def coerce_parts(model) -> list[str]:
    """Turn dict values of ``model``'s optional parts into their dataclasses (model JSON gives
    dicts) and return what is wrong with them (clauses for the ModelSpec's error)."""
    out = []
    for name, cls in _PARTS.items():
        value = getattr(model, name)
        if value is None:
            continue
        if isinstance(value, dict):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                out.append(f"{name}: unknown fields {unknown}; expected some of {sorted(known)}")
                continue
            try:
                value = cls(**value)
            except TypeError as exc:
                out.append(f"{name}: {exc}")
                continue
            object.__setattr__(model, name, value)
        if not isinstance(value, cls):
            out.append(f"{name} must be a {cls.__name__} or a JSON object")
            continue
        out += [f"{name}.{p}" for p in value.problems()]
    if not out and (model.moe is not None or model.mla is not None) and model.arch != "llama":
        out.append("moe and mla need arch='llama' (RMSNorm, SwiGLU, RoPE)")
    if not out and model.mla is not None and model.n_kv_heads != model.n_heads:
        out.append(f"an MLA model has n_kv_heads = n_heads, not {model.n_kv_heads}")
    if not out and model.moe is not None and model.moe.first_dense >= model.n_layers:
        out.append(f"moe.first_dense={model.moe.first_dense} leaves no MoE layer of {model.n_layers}")
    return out


def is_extended(model) -> bool:
    """Whether ``model`` has any part this module describes (then ``plait.spec.moe.counts`` counts it)."""
    return model.moe is not None or model.mla is not None


# ------------------------------------------------------------------ accessors
def is_moe_layer(model, layer: int) -> bool:
    """Whether layer ``layer`` (0-based) has routed experts."""
    moe = model.moe
    if moe is None or layer < moe.first_dense:
        return False
    return (layer - moe.first_dense) % moe.every == 0


@lru_cache(maxsize=1024)  # counted over the layers; the planner asks often
def moe_layer_count(model) -> int:
    return sum(is_moe_layer(model, i) for i in range(model.n_layers))
