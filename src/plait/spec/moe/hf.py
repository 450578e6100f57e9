"""Read the ``config.json`` of a Hugging Face mixture-of-experts model into a ModelSpec (no torch).

Families (``model_type``) and the keys read, beyond the Llama ones (hidden_size,
num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size,
max_position_embeddings, tie_word_embeddings, head_dim):

  mixtral       num_local_experts, num_experts_per_tok, intermediate_size (= expert ffn),
                sliding_window (every layer, when set), router_aux_loss_coef
  qwen2_moe     num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size
                (one shared expert with a sigmoid gate), decoder_sparse_step, mlp_only_layers,
                norm_topk_prob, qkv_bias (Q/K/V biases), use_sliding_window, max_window_layers, layer_types
  qwen3_moe     as qwen2_moe without the shared expert; Q/K RMSNorm per head, attention_bias,
                use_sliding_window (a window on every layer)
  olmoe         num_experts, num_experts_per_tok, intermediate_size, norm_topk_prob, attention_bias; Q/K
                norms over the whole projections
  deepseek_v2/3 n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts,
                first_k_dense_replace, n_group, topk_group, routed_scaling_factor, aux_loss_alpha,
                q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim; V3: the sigmoid
                router, norm_topk_prob; V2: the softmax router, group-limited with topk_method
                group_limited_greedy (multi-token prediction, num_nextn_predict_layers, is left out: off)
  gpt_oss       num_local_experts, num_experts_per_tok, intermediate_size, sliding_window, layer_types,
                attention_bias; router and expert biases, sinks

Keys left out read as transformers' defaults (``plait.spec.moe.hf_defaults``); which layers have
experts and which slide, as transformers builds each family: ``plait.spec.moe.hf_layers``; values
that change outputs and that plait runs one way of (hidden_act, scoring_func, clip_qkv, swiglu_limit,
...): ``plait.spec.hf.values``, checked for every family by ``plait.spec.hf_config``. Attention
features go to the ModelSpec's own fields (``head_dim``, ``qkv_bias``, ``attn_out_bias``,
``qk_norm``, ``sliding_window``, ``local_layers``, ``sinks``); ``rope_theta``, ``rope_scaling`` and
``rms_norm_eps`` are recorded (they change no count). A key in none of these lists is refused.
"""

from __future__ import annotations

from pathlib import Path

from plait.errors import PlaitError
from plait.spec.model import ModelSpec
from plait.spec.moe.hf_defaults import with_defaults
from plait.spec.moe.hf_layers import attention_windows, moe_placement
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


def _bool(config: dict, source: Path, key: str) -> bool:
    """``config[key]`` as a JSON true/false (missing or null: false); PlaitError for another type
    (the string "false" would read as true)."""
    value = config.get(key)
    if value is not None and not isinstance(value, bool):
        raise PlaitError(f"{source}: {key}={value!r} must be true or false")
    return bool(value)


def _float(config: dict, key: str, default: float) -> float:
    value = config.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


# the keys these families' configs hold besides the shared ones (plait.spec.hf.families): read above,
# checked by plait.spec.hf.values (dropout, router noise, qk clipping, gpt-oss's activation clamp,
# DeepSeek's scoring and layer frequency), or changing neither the outputs nor a count (the router logits
# output, the MTP head left out); any other key is refused rather than silently ignored
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
    "initial_context_length",  # GPT-OSS's pre-yarn context, which its rope_scaling states again
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
    """The ModelSpec of a mixture-of-experts ``config`` (``model_type`` one of ``MOE_TYPES``); the keys it
    leaves out read as transformers' defaults (``plait.spec.moe.hf_defaults``)."""
    kind = str(config.get("model_type", "")).lower()
    if kind not in MOE_TYPES:
        raise PlaitError(f"{source}: model_type={kind!r} is not a mixture-of-experts family ({', '.join(MOE_TYPES)})")
    check_moe_keys(config, source, kind)
    given = set(config)
    config = with_defaults(config, kind, source)
    n_layers = _int(config, source, "num_hidden_layers")
    hidden = _int(config, source, "hidden_size")
    heads = _int(config, source, "num_attention_heads")
    head_dim = _int(config, source, "head_dim", default=hidden // heads)
    features = dict(attention_windows(config, kind, n_layers, source))  # ModelSpec attention fields
    if kind in ("deepseek_v2", "deepseek_v3"):
        moe, mla = _deepseek(config, source, kind, n_layers), _mla(config, source, heads, given)
    else:
        moe, mla = _moe(config, source, kind, n_layers), None
        features.update(head_dim=head_dim, **_attention(config, source, kind, hidden, heads, head_dim))
    return ModelSpec(
        name=name, arch="llama", n_layers=n_layers, hidden=hidden, ffn_hidden=_int(config, source, "intermediate_size"),
        n_heads=heads, n_kv_heads=heads if mla is not None else _int(config, source, "num_key_value_heads",
                                                                      default=heads),
        vocab=_int(config, source, "vocab_size"),
        max_seq_len=_int(config, source, "max_position_embeddings", default=2048),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)), moe=moe, mla=mla,
        rope_theta=_rope_theta(config), rope_scaling=_rope_scaling(config, source),
        norm_eps=_float(config, "rms_norm_eps", 1e-6 if kind.startswith(("qwen", "deepseek")) else 1e-5),
        family=kind, **features,
    )


def _moe(config: dict, source: Path, kind: str, n_layers: int) -> MoESpec:
    """The experts of a Mixtral, Qwen2/3-MoE, OLMoE or GPT-OSS config."""
    top_k = _int(config, source, "num_experts_per_tok")
    stray = config.get("experts_per_token")  # GPT-OSS's configs repeat it; transformers reads num_experts_per_tok
    if stray is not None and stray != top_k:
        raise PlaitError(f"{source}: experts_per_token={stray!r} but num_experts_per_tok={top_k} (transformers "
                         "routes to num_experts_per_tok experts); give the two the same value")
    aux = _float(config, "router_aux_loss_coef", 0.0)
    first, every = moe_placement(config, kind, n_layers, source)
    if kind in ("mixtral", "gpt_oss"):
        oai = kind == "gpt_oss"
        return MoESpec(_int(config, source, "num_local_experts"), top_k, _int(config, source, "intermediate_size"),
                       router_bias=oai, expert_bias=oai, activation="oai" if oai else "silu", aux_loss_coef=aux)
    norm = _bool(config, source, "norm_topk_prob")
    if kind == "olmoe":
        return MoESpec(_int(config, source, "num_experts"), top_k, _int(config, source, "intermediate_size"),
                       norm_topk=norm, aux_loss_coef=aux)
    shared = _int(config, source, "shared_expert_intermediate_size", default=0) if kind == "qwen2_moe" else 0
    return MoESpec(_int(config, source, "num_experts"), top_k,
                   _int(config, source, "moe_intermediate_size"), n_shared=1 if shared else 0, shared_ffn=shared,
                   shared_gate=bool(shared), first_dense=first, every=every, norm_topk=norm, aux_loss_coef=aux)


def _attention(config: dict, source: Path, kind: str, hidden: int, heads: int, head_dim: int) -> dict:
    """The ModelSpec's bias, q/k-norm and sink fields of a GQA family's config."""
    if kind == "qwen2_moe":  # Q, K, V biases (no output bias)
        return dict(qkv_bias=bool(config.get("qkv_bias")))
    bias = bool(config.get("attention_bias"))
    if kind == "qwen3_moe":
        return dict(qk_norm="head", qkv_bias=bias, attn_out_bias=bias)
    if kind == "olmoe":
        if head_dim * heads != hidden:  # its q/k norms are hidden_size wide: transformers cannot build it
            raise PlaitError(f"{source}: head_dim={head_dim} with {heads} heads is not hidden_size={hidden}; "
                             "OLMoE's q/k norms are as wide as the hidden state")
        return dict(qk_norm="full", qkv_bias=bias, attn_out_bias=bias)
    if kind == "gpt_oss":
        return dict(qkv_bias=bias, attn_out_bias=bias, sinks=True)
    return {}


def _deepseek(config: dict, source: Path, kind: str, n_layers: int) -> MoESpec:
    """DeepSeek-V2/V3's experts: V3's bias-balanced sigmoid router in groups (the sum of a group's two
    best scores), V2's softmax router, group-limited (a group's best expert) with topk_method
    group_limited_greedy, else not; V2 never renormalizes the top-k weights."""
    v3 = kind == "deepseek_v3"
    grouped = v3 or config.get("topk_method") == "group_limited_greedy"
    if grouped and (config.get("n_group") is None or config.get("topk_group") is None):
        raise PlaitError(f"{source}: {'DeepSeek-V3' if v3 else 'topk_method=group_limited_greedy'} needs n_group "
                         "and topk_group")
    first, every = moe_placement(config, kind, n_layers, source)
    return MoESpec(_int(config, source, "n_routed_experts"), _int(config, source, "num_experts_per_tok"),
                   _int(config, source, "moe_intermediate_size"),
                   n_shared=_int(config, source, "n_shared_experts", default=0), first_dense=first, every=every,
                   router="sigmoid" if v3 else "softmax", norm_topk=v3 and _bool(config, source, "norm_topk_prob"),
                   n_groups=_int(config, source, "n_group") if grouped else 1,
                   topk_groups=_int(config, source, "topk_group") if grouped else 1,
                   route_scale=_float(config, "routed_scaling_factor", 1.0),
                   aux_loss_coef=_float(config, "aux_loss_alpha", _float(config, "router_aux_loss_coef", 0.0)))


def _mla(config: dict, source: Path, heads: int, given: set) -> MLASpec:
    """DeepSeek's multi-head latent attention (``q_lora_rank: null``: queries straight from the hidden
    state); ``given``: the keys the config itself holds (the others are transformers' defaults)."""
    kv_heads = config.get("num_key_value_heads")
    if kv_heads is not None and kv_heads != heads:  # transformers repeats MLA's per-head keys: shapes break
        where = "" if "num_key_value_heads" in given else " (left out: transformers' default)"
        raise PlaitError(f"{source}: num_key_value_heads={kv_heads}{where}: multi-head latent attention has one "
                         f"key per head (num_attention_heads={heads}); set num_key_value_heads={heads}")
    return MLASpec(q_lora_rank=_int(config, source, "q_lora_rank", default=0),
                   kv_lora_rank=_int(config, source, "kv_lora_rank"),
                   qk_nope_head_dim=_int(config, source, "qk_nope_head_dim"),
                   qk_rope_head_dim=_int(config, source, "qk_rope_head_dim"),
                   v_head_dim=_int(config, source, "v_head_dim"))


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
    partial = scaling.get("partial_rotary_factor")
    if partial not in (None, 1, 1.0):  # these families' default RoPE ignores it, the scaled ones break on it
        raise PlaitError(f"{source}: partial_rotary_factor={partial}: rotary embeddings on part of a head are "
                         "not modelled by plait")
    scaling = {k: v for k, v in scaling.items() if k not in ("rope_theta", "partial_rotary_factor")}
    original = config.get("original_max_position_embeddings")
    return hf_rope_scaling(scaling, _int(config, source, "max_position_embeddings", default=2048),
                           None if original is None else _int(config, source, "original_max_position_embeddings"))
