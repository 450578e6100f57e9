"""Read the ``config.json`` of a Hugging Face mixture-of-experts model into a ModelSpec (no torch).

Families (``model_type``) and the keys read, beyond the Llama ones (hidden_size,
num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size,
max_position_embeddings, tie_word_embeddings):

  mixtral       num_local_experts, num_experts_per_tok, intermediate_size (= expert ffn),
                sliding_window (every layer, when set), router_aux_loss_coef
  qwen2_moe     num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size
                (one shared expert with a sigmoid gate), decoder_sparse_step, mlp_only_layers,
                norm_topk_prob; Q/K/V biases
  qwen3_moe     as qwen2_moe without the shared expert; head_dim, Q/K RMSNorm per head, attention_bias
  olmoe         num_experts, num_experts_per_tok, intermediate_size, norm_topk_prob; Q/K norms over the
                whole projections
  deepseek_v2/3 n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts,
                first_k_dense_replace, moe_layer_freq, scoring_func, n_group, topk_group,
                routed_scaling_factor, aux_loss_alpha, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
                v_head_dim (multi-token prediction, num_nextn_predict_layers, is left out: off)
  gpt_oss       num_local_experts, num_experts_per_tok, intermediate_size, head_dim, sliding_window,
                layer_types (sliding windows on the even layers), attention_bias; router and expert biases

Attention features go to the ModelSpec's own fields (``head_dim``, ``qkv_bias``, ``attn_out_bias``,
``qk_norm``, ``sliding_window``, ``local_layers``, ``sinks``); ``rope_theta``, ``rope_scaling`` and
``rms_norm_eps`` are recorded (they change no count). Keys outside these lists are not checked here
(the dense families' reader, ``plait.spec.hf_config``, refuses unknown keys).

Dense layers listed in ``mlp_only_layers`` must be expressible as "the first n" or none
(``MoESpec.first_dense``); anything else is refused with the list.
"""

from __future__ import annotations

from pathlib import Path

from plait.errors import PlaitError
from plait.spec.model import ModelSpec
from plait.spec.moe.parts import MLASpec, MoESpec

MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "gpt_oss")


def _int(config: dict, source: Path, *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
                raise PlaitError(f"{source}: {key}={value!r} must be an integer")
            return int(value)
    if default is None:
        raise PlaitError(f"{source}: config.json has none of the keys {', '.join(keys)}")
    return default


def _float(config: dict, key: str, default: float) -> float:
    value = config.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _first_dense(config: dict, source: Path, n_layers: int) -> int:
    """Leading dense layers from ``mlp_only_layers`` (only 0..n-1 is expressible)."""
    dense = sorted(set(config.get("mlp_only_layers") or []))
    if dense != list(range(len(dense))):
        raise PlaitError(f"{source}: mlp_only_layers={dense} is not 'the first n layers'; "
                         "plait's MoESpec takes first_dense and every")
    return len(dense)


# the keys these families' configs hold besides the shared ones (plait.spec.hf.families): read above,
# or changing no count (dropout, router noise and logits output, the MTP head left out, qk clipping,
# gpt-oss's activation clamp); any other key is refused rather than silently ignored
MOE_KEYS = {
    "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "experts_per_token",
    "moe_intermediate_size", "shared_expert_intermediate_size", "n_shared_experts", "decoder_sparse_step",
    "mlp_only_layers", "first_k_dense_replace", "moe_layer_freq", "norm_topk_prob", "scoring_func", "topk_method",
    "n_group", "topk_group", "routed_scaling_factor", "router_aux_loss_coef", "aux_loss_alpha", "seq_aux",
    "output_router_logits", "router_jitter_noise", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "qk_head_dim", "v_head_dim", "rope_interleave", "num_nextn_predict_layers", "ep_size",
    "head_dim", "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings", "rms_norm_eps",
    "rope_theta", "hidden_act", "attention_bias", "qkv_bias", "attention_dropout", "sliding_window",
    "use_sliding_window", "max_window_layers", "clip_qkv", "swiglu_alpha", "swiglu_limit", "layer_types", "mlp_bias",
}


def check_moe_keys(config: dict, source: Path, kind: str) -> None:
    """Refuse a key no mixture-of-experts family plait reads has (it could change counts unseen)."""
    from plait.spec.hf.families import HARMLESS_KEYS, READ_KEYS

    unknown = sorted(key for key in config if key not in MOE_KEYS | HARMLESS_KEYS | READ_KEYS)
    if unknown:
        raise PlaitError(f"{source}: config key {unknown[0]!r} of model_type {kind!r} is not understood by plait "
                         "(it could change parameters, FLOPs or memory); remove it if it changes none")
    if kind == "deepseek_v2" and config.get("mlp_bias"):
        raise PlaitError(f"{source}: mlp_bias=true: biased MLPs are not modelled by plait")


def moe_from_hf_config(config: dict, source: Path, name: str) -> ModelSpec:
    """The ModelSpec of a mixture-of-experts ``config`` (``model_type`` one of ``MOE_TYPES``)."""
    kind = str(config.get("model_type", "")).lower()
    check_moe_keys(config, source, kind)
    n_layers = _int(config, source, "num_hidden_layers")
    hidden = _int(config, source, "hidden_size")
    heads = _int(config, source, "num_attention_heads")
    top_k = _int(config, source, "num_experts_per_tok", "experts_per_token")
    aux = _float(config, "router_aux_loss_coef", 0.0)
    ffn = _int(config, source, "intermediate_size")
    mla = None
    features: dict = {}  # ModelSpec attention fields (plait.spec.model)
    if kind == "mixtral":
        moe = MoESpec(_int(config, source, "num_local_experts"), top_k, ffn, aux_loss_coef=aux)
        features = dict(sliding_window=_int(config, source, "sliding_window", default=0))
        if _int(config, source, "head_dim", default=hidden // heads) * heads != hidden:  # transformers reads it
            features["head_dim"] = _int(config, source, "head_dim")
    elif kind in ("qwen2_moe", "qwen3_moe"):
        shared = _int(config, source, "shared_expert_intermediate_size", default=0) if kind == "qwen2_moe" else 0
        experts = _int(config, source, "num_experts", "num_local_experts")
        moe = MoESpec(experts, top_k, _int(config, source, "moe_intermediate_size"),
                      n_shared=1 if shared else 0, shared_ffn=shared, shared_gate=bool(shared),
                      first_dense=_first_dense(config, source, n_layers),
                      every=_int(config, source, "decoder_sparse_step", default=1),
                      norm_topk=bool(config.get("norm_topk_prob", kind == "qwen3_moe")), aux_loss_coef=aux)
        if kind == "qwen2_moe":
            features = dict(qkv_bias=True)
        else:
            bias = bool(config.get("attention_bias", False))
            features = dict(head_dim=_int(config, source, "head_dim", default=hidden // heads), qk_norm="head",
                            qkv_bias=bias, attn_out_bias=bias)
    elif kind == "olmoe":
        moe = MoESpec(_int(config, source, "num_experts"), top_k, ffn,
                      norm_topk=bool(config.get("norm_topk_prob", False)), aux_loss_coef=aux)
        features = dict(qk_norm="full")
    elif kind in ("deepseek_v2", "deepseek_v3"):
        moe = MoESpec(_int(config, source, "n_routed_experts"), top_k, _int(config, source, "moe_intermediate_size"),
                      n_shared=_int(config, source, "n_shared_experts", default=0),
                      first_dense=_int(config, source, "first_k_dense_replace", default=0),
                      every=_int(config, source, "moe_layer_freq", default=1),
                      router=str(config.get("scoring_func") or ("sigmoid" if kind == "deepseek_v3" else "softmax")),
                      norm_topk=bool(config.get("norm_topk_prob", kind == "deepseek_v3")),
                      n_groups=_int(config, source, "n_group", default=1),
                      topk_groups=_int(config, source, "topk_group", default=1),
                      route_scale=_float(config, "routed_scaling_factor", 1.0),
                      aux_loss_coef=_float(config, "aux_loss_alpha", aux))
        mla = MLASpec(q_lora_rank=_int(config, source, "q_lora_rank", default=0),
                      kv_lora_rank=_int(config, source, "kv_lora_rank"),
                      qk_nope_head_dim=_int(config, source, "qk_nope_head_dim"),
                      qk_rope_head_dim=_int(config, source, "qk_rope_head_dim"),
                      v_head_dim=_int(config, source, "v_head_dim"))
    elif kind == "gpt_oss":
        moe = MoESpec(_int(config, source, "num_local_experts"), top_k, ffn, router_bias=True, expert_bias=True,
                      activation="oai", aux_loss_coef=aux)
        types = list(config.get("layer_types") or [])
        window = _int(config, source, "sliding_window", default=0)
        local = [i for i, t in enumerate(types) if t == "sliding_attention"]
        if types and local not in ([], list(range(0, n_layers, 2)), list(range(n_layers))):
            raise PlaitError(f"{source}: layer_types puts sliding windows on layers {local}; plait models "
                             "all layers or the even ones (0, 2, ...)")
        bias = bool(config.get("attention_bias", True))
        features = dict(head_dim=_int(config, source, "head_dim", default=hidden // heads), qkv_bias=bias,
                        attn_out_bias=bias, sinks=True, sliding_window=window if local or not types else 0,
                        local_layers="all" if len(local) == n_layers else "even")
    else:
        raise PlaitError(f"{source}: model_type={kind!r} is not a mixture-of-experts family ({', '.join(MOE_TYPES)})")
    return ModelSpec(
        name=name, arch="llama", n_layers=n_layers, hidden=hidden, ffn_hidden=ffn, n_heads=heads,
        n_kv_heads=heads if mla is not None else _int(config, source, "num_key_value_heads", default=heads),
        vocab=_int(config, source, "vocab_size"),
        max_seq_len=_int(config, source, "max_position_embeddings", default=2048),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)), moe=moe, mla=mla,
        rope_theta=_rope_theta(config), rope_scaling=_rope_scaling(config, source),
        norm_eps=_float(config, "rms_norm_eps", 1e-6 if kind.startswith(("qwen", "deepseek")) else 1e-5),
        family=kind, **features,
    )


def _rope_theta(config: dict) -> float:
    """The rotary base: transformers 5 writes it inside ``rope_parameters`` only, older configs at the top."""
    params = config.get("rope_parameters")
    inner = params.get("rope_theta") if isinstance(params, dict) else None
    return _float({"rope_theta": inner}, "rope_theta", _float(config, "rope_theta", 10000.0))


def _rope_scaling(config: dict, source: Path) -> dict:
    """The config's rope_scaling (or transformers 5's ``rope_parameters``) as plait records it
    (``plait.spec.hf.families.hf_rope_scaling``)."""
    from plait.spec.hf.families import hf_rope_scaling

    scaling = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(scaling, dict):
        raise PlaitError(f"{source}: rope_scaling must be a JSON object")
    scaling = {k: v for k, v in scaling.items() if k not in ("rope_theta", "partial_rotary_factor")}
    original = config.get("original_max_position_embeddings")
    return hf_rope_scaling(scaling, _int(config, source, "max_position_embeddings", default=2048),
                           None if original is None else _int(config, source, "original_max_position_embeddings"))
