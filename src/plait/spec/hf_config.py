"""Read a Hugging Face ``config.json`` from local disk into a ModelSpec (no download, no torch).

Two readers give the same ModelSpec (tests/spec/test_hf_configs.py checks it on 16 real configs):
  * ``reader="plain"`` (the default, and the only one the planner uses): the JSON with each family's
    defaults (``plait.spec.hf.families``) filled in. Importing transformers imports torch, which the
    planner must never do.
  * ``reader="transformers"``: the same file through transformers' config class for its
    ``model_type`` (``plait.spec.hf.autoconfig``; local file only, no network); ``"auto"`` uses it
    when transformers is installed.
Either way the raw file is checked first: required sizes present, every key known (read, or known
to change nothing plait models), the features plait does not model refused by the key's name, and
the values that change outputs and that plait's runtime runs one way of (``plait.spec.hf.values``:
GPT-2's scale_attn_weights, GPT-OSS's swiglu_limit, the MoE families' hidden_act...) checked.
Mixture-of-experts families (``plait.spec.moe.hf.MOE_TYPES``: Mixtral, Qwen2/3-MoE, OLMoE,
DeepSeek-V2/V3, GPT-OSS) are read by ``plait.spec.moe.hf`` with either reader.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Callable

from plait.errors import PlaitError
from plait.spec.hf.families import (
    DEFAULTS,
    GPT_FAMILIES,
    HARMLESS_KEYS,
    LLAMA_FAMILIES,
    READ_KEYS,
    REFUSED,
    hf_rope_scaling,
    rope_scaling_problems,
)
from plait.spec.hf.values import check_values
from plait.spec.model import ModelSpec, rope_scaling_pairs
from plait.spec.moe.hf import MOE_TYPES, moe_from_hf_config
from plait.spec.serialize import read_json_file

READERS = ("plain", "transformers", "auto")
GPT_DROPOUT = 0.1  # the only dropout probability plait's runtime has (plait.run.model.DROPOUT)
Getter = Callable[[str], object]  # a config value by key, None when unset


def load_hf_config(path: str | Path) -> tuple[dict, Path]:
    """The JSON object of ``config.json`` (a directory holding it, or the file) and its path."""
    source = Path(path)
    if source.is_dir():
        source = source / "config.json"
    config = read_json_file(source, "Hugging Face config.json")
    if not isinstance(config, dict):
        raise PlaitError(f"{source}: config.json must hold a JSON object")
    return config, source


def model_from_hf_config(path: str | Path, reader: str = "plain") -> ModelSpec:
    """A directory holding ``config.json``, or the file itself; ``reader``: see the module doc."""
    config, source = load_hf_config(path)
    return model_from_hf_dict(config, source, reader)


def model_from_hf_dict(config: dict, source: Path, reader: str = "plain") -> ModelSpec:
    """The ModelSpec of a config.json's contents (``source``: its path, for messages)."""
    if reader not in READERS:
        raise ValueError(f"reader must be one of {READERS}, not {reader!r}")
    check_sizes_and_types(config, source)
    check_values(config, str(config.get("model_type", "")).lower(), source)
    if str(config.get("model_type", "")).lower() in MOE_TYPES:  # mixture-of-experts families: plait.spec.moe.hf
        return moe_from_hf_config(config, source, str(config.get("_name_or_path") or source.parent.name or "hf-model"))
    family = check_raw_config(config, source)
    if reader == "auto":
        reader = "transformers" if importlib.util.find_spec("transformers") else "plain"
    if reader == "transformers":
        from plait.spec.hf.autoconfig import autoconfig_getter

        get = autoconfig_getter(config, family, source)
    else:
        get = plain_getter(config, family)
    return spec_from_config(get, family, config, source)


# the size keys of the families plait reads: (smallest, largest) value, checked before anything is built
# (1e8 layers would build for hours; 0 heads divide by zero)
_LAYERS, _WIDTH, _HEADS, _VOCAB, _POSITIONS = (1, 10**4), (1, 2**20), (1, 2**16), (1, 2**31), (1, 2**31)
SIZE_LIMITS = {
    "num_hidden_layers": _LAYERS, "n_layer": _LAYERS, "hidden_size": _WIDTH, "n_embd": _WIDTH,
    "intermediate_size": _WIDTH, "n_inner": _WIDTH, "moe_intermediate_size": _WIDTH, "head_dim": _WIDTH,
    "shared_expert_intermediate_size": (0, 2**20), "num_attention_heads": _HEADS, "n_head": _HEADS,
    "num_key_value_heads": _HEADS, "vocab_size": _VOCAB, "max_position_embeddings": _POSITIONS,
    "n_positions": _POSITIONS, "sliding_window": (0, 2**31), "num_local_experts": _HEADS, "num_experts": _HEADS,
    "n_routed_experts": _HEADS, "num_experts_per_tok": _HEADS, "experts_per_token": _HEADS,
}
KEY_TYPES = {"rope_parameters": (dict,), "rope_scaling": (dict,), "layer_types": (list,), "hidden_act": (str,),
             "activation_function": (str,), "model_type": (str,)}


def check_sizes_and_types(config: dict, source: Path) -> None:
    """One line for a size key that is not an integer within its bounds (``SIZE_LIMITS``) or a key of
    the wrong JSON type (``KEY_TYPES``), before anything is computed or built from them."""
    for key, (low, high) in SIZE_LIMITS.items():
        value = config.get(key)
        if value is None:
            continue
        number = _integer(value, key, source)
        if not low <= number <= high:
            raise PlaitError(f"{source}: {key}={value!r} must be between {low:,} and {high:,}")
    for key, types in KEY_TYPES.items():
        value = config.get(key)
        if value is not None and not isinstance(value, types):
            raise PlaitError(f"{source}: {key}={str(value)[:60]!r} must be a JSON "
                             f"{ {dict: 'object', list: 'array', str: 'string'}[types[0]] }")


def check_raw_config(config: dict, source: Path) -> str:
    """The config's family; PlaitError for an unsupported family, a missing size or an unknown key."""
    family = str(config.get("model_type", "")).lower()
    if family not in LLAMA_FAMILIES + GPT_FAMILIES:
        raise PlaitError(f"{source}: model_type={family or '(missing)'!r} is not supported; "
                         f"supported: {', '.join(LLAMA_FAMILIES + GPT_FAMILIES + MOE_TYPES)}")
    if family in LLAMA_FAMILIES:
        for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size"):
            _require(config, key, source=source)
    else:
        _require(config, "n_embd", "hidden_size", source=source)
        _require(config, "n_head", "num_attention_heads", source=source)
        _require(config, "n_layer", "num_hidden_layers", source=source)
        _require(config, "vocab_size", source=source)
    for key, feature in REFUSED.items():
        if config.get(key) not in (None, 0, False, {}, []):
            raise PlaitError(f"{source}: {key}={config[key]!r}: {feature} are not modelled by plait")
    known = READ_KEYS | HARMLESS_KEYS | set(DEFAULTS[family])
    unknown = sorted(key for key in config if key not in known)
    if unknown:
        raise PlaitError(f"{source}: config key {unknown[0]!r} of model_type {family!r} is not understood by "
                         f"plait (it could change parameters, FLOPs or memory); remove it if it changes none")
    return family


def plain_getter(config: dict, family: str) -> Getter:
    """Values of ``config`` with the family's defaults (as transformers' config classes set them)."""
    merged = {**DEFAULTS[family], **config}
    if family in ("qwen2", "qwen3") and not merged.get("use_sliding_window"):
        merged["sliding_window"] = None
    if "layer_types" not in config and family in ("qwen2", "qwen3", "gemma2"):
        layers = _integer(merged["num_hidden_layers"], "num_hidden_layers", Path("config.json"))
        if family == "gemma2":
            local = [bool((i + 1) % 2) for i in range(layers)]
        else:
            local = [merged["sliding_window"] is not None and i >= merged["max_window_layers"] for i in range(layers)]
        merged["layer_types"] = ["sliding_attention" if lt else "full_attention" for lt in local]
    rope = dict(merged.get("rope_parameters") or merged.get("rope_scaling") or {})
    rope.setdefault("rope_theta", merged.get("rope_theta", 10000.0))
    merged["rope_parameters"] = rope
    return merged.get


def _require(config: dict, *keys: str, source: Path) -> int:
    for key in keys:
        if key in config and config[key] is not None:
            return _integer(config[key], key, source)
    raise PlaitError(f"{source}: config.json has none of the keys {', '.join(keys)}")


def _integer(value, key: str, source: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value):
        raise PlaitError(f"{source}: {key}={value!r} must be an integer")
    return int(value)


def _number(value, key: str, source: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlaitError(f"{source}: {key}={value!r} must be a number")
    return float(value)


def _first(get: Getter, *keys: str):
    return next((get(k) for k in keys if get(k) is not None), None)


def spec_from_config(get: Getter, family: str, raw: dict, source: Path) -> ModelSpec:
    """The ModelSpec of a config read through ``get`` (either reader)."""
    name = str(raw.get("_name_or_path") or source.parent.name or "hf-model")
    if family in GPT_FAMILIES:
        return _gpt_spec(get, family, name, source)
    hidden = _integer(get("hidden_size"), "hidden_size", source)
    heads = _integer(get("num_attention_heads"), "num_attention_heads", source)
    head_dim = get("head_dim")
    head_dim = _integer(head_dim, "head_dim", source) if head_dim is not None else None
    if head_dim == hidden // heads and hidden % heads == 0:
        head_dim = None  # the default: keep the spec's JSON plain
    dropout = {k: get(k) for k in ("attention_dropout", "resid_pdrop", "embd_pdrop") if get(k)}
    if dropout:
        key, value = next(iter(dropout.items()))
        raise PlaitError(f"{source}: {key}={value}: dropout in a {family} model is not modelled by plait; set it to 0.0")
    max_positions = _integer(get("max_position_embeddings"), "max_position_embeddings", source)
    theta, scaling = _rope(get, source, max_positions, head_dim or hidden // heads)
    activation = _activation(_first(get, "hidden_activation", "hidden_act"), source)
    window, local_layers = _sliding_window(get, family, source)
    gemma = family == "gemma2"
    attn_scale = 0.0
    if gemma:
        attn_scale = _number(get("query_pre_attn_scalar"), "query_pre_attn_scalar", source) ** -0.5
    biased = family == "qwen2" or bool(get("attention_bias"))
    return ModelSpec(
        name=name,
        arch="llama",
        n_layers=_integer(get("num_hidden_layers"), "num_hidden_layers", source),
        hidden=hidden,
        ffn_hidden=_integer(get("intermediate_size"), "intermediate_size", source),
        n_heads=heads,
        n_kv_heads=_integer(get("num_key_value_heads") or heads, "num_key_value_heads", source),
        vocab=_integer(get("vocab_size"), "vocab_size", source),
        max_seq_len=max_positions,
        tied_embeddings=bool(get("tie_word_embeddings")),
        head_dim=head_dim,
        qkv_bias=biased,
        attn_out_bias=family != "qwen2" and bool(get("attention_bias")),  # Qwen2 biases Q, K, V only
        mlp_bias=family == "llama" and bool(get("mlp_bias")),
        qk_norm={"qwen3": "head", "olmo2": "full"}.get(family, "none"),
        norm_position={"olmo2": "post", "gemma2": "sandwich"}.get(family, "pre"),
        sliding_window=window,
        local_layers=local_layers,
        attn_softcap=_number(get("attn_logit_softcapping") or 0.0, "attn_logit_softcapping", source),
        logit_softcap=_number(get("final_logit_softcapping") or 0.0, "final_logit_softcapping", source),
        activation=activation,
        norm_offset=gemma,
        embed_scale=float(hidden) ** 0.5 if gemma else 1.0,
        attn_scale=attn_scale,
        rope_theta=theta,
        rope_scaling=scaling,
        norm_eps=_number(get("rms_norm_eps"), "rms_norm_eps", source),
        family=family,
    )


def _gpt_spec(get: Getter, family: str, name: str, source: Path) -> ModelSpec:
    hidden = _integer(_first(get, "n_embd", "hidden_size"), "n_embd", source)
    heads = _integer(_first(get, "n_head", "num_attention_heads"), "n_head", source)
    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if get(key):
            raise PlaitError(f"{source}: {key}=true is not modelled by plait; only plain GPT-2 blocks are")
    rates = {k: float(get(k) or 0.0) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
    if set(rates.values()) not in ({0.0}, {GPT_DROPOUT}):
        key = next(k for k, v in rates.items() if v not in (0.0, GPT_DROPOUT))
        raise PlaitError(f"{source}: {key}={rates[key]}: plait's runtime has dropout {GPT_DROPOUT} or none, "
                         f"the same in every place ({', '.join(f'{k}={v}' for k, v in rates.items())})")
    return ModelSpec(
        name=name,
        arch="gpt",
        n_layers=_integer(_first(get, "n_layer", "num_hidden_layers"), "n_layer", source),
        hidden=hidden,
        ffn_hidden=_integer(get("n_inner") or 4 * hidden, "n_inner", source),
        n_heads=heads,
        n_kv_heads=1 if family == "gpt_bigcode" and get("multi_query") else heads,
        vocab=_integer(get("vocab_size"), "vocab_size", source),
        max_seq_len=_integer(_first(get, "n_positions", "n_ctx"), "n_positions", source),
        tied_embeddings=bool(get("tie_word_embeddings")),
        dropout=set(rates.values()) == {GPT_DROPOUT},
        activation=_activation(get("activation_function"), source),
        norm_eps=_number(get("layer_norm_epsilon"), "layer_norm_epsilon", source),
        family=family,
    )


_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
                "gelu_fast": "gelu_tanh", "gelu": "gelu"}


def _activation(name, source: Path) -> str:
    if name not in _ACTIVATIONS:
        raise PlaitError(f"{source}: activation {name!r} is not supported; supported: {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def _rope(get: Getter, source: Path, max_positions: int, head_dim: int) -> tuple[float, tuple]:
    """(rope_theta, the recorded rope_scaling pairs; () for plain RoPE): the settings of
    ``plait.spec.hf.families.hf_rope_scaling``, checked by ``rope_scaling_problems`` (one line each)."""
    params = dict(get("rope_parameters") or {})
    theta = _number(params.pop("rope_theta", None) or get("rope_theta") or 10000.0, "rope_theta", source)
    partial = params.pop("partial_rotary_factor", 1.0)
    if partial not in (None, 1, 1.0):
        raise PlaitError(f"{source}: partial_rotary_factor={partial}: rotary embeddings on part of a head are "
                         "not modelled by plait")
    original = get("original_max_position_embeddings")
    if original is not None:
        original = _integer(original, "original_max_position_embeddings", source)
    scaling = hf_rope_scaling(params, max_positions, original)
    problems = rope_scaling_problems(scaling, head_dim)
    if problems:
        raise PlaitError(f"{source}: {problems[0]}")
    return theta, rope_scaling_pairs(scaling)


def _sliding_window(get: Getter, family: str, source: Path) -> tuple[int, str]:
    """(window, which layers are local) from sliding_window and layer_types."""
    window = get("sliding_window")
    types = get("layer_types")
    layers = _integer(get("num_hidden_layers"), "num_hidden_layers", source)
    if types is not None:
        local = [t == "sliding_attention" for t in types]
        if len(local) != layers or not set(types) <= {"sliding_attention", "full_attention"}:
            raise PlaitError(f"{source}: layer_types must hold {layers} entries of sliding_attention / "
                             "full_attention")
    else:
        local = [window is not None] * layers
    if not any(local) or window is None:
        return 0, "all"
    window = _integer(window, "sliding_window", source)
    if all(local):
        return window, "all"
    if local == [i % 2 == 0 for i in range(layers)]:
        return window, "even"
    raise PlaitError(f"{source}: layer_types: this pattern of sliding-window layers is not modelled by plait "
                     "(all layers, or every even layer, are)")
