"""A ModelSpec as a Hugging Face ``config.json`` (the inverse of ``plait.spec.hf_config``; no torch).

``plait export`` writes the config of the family the spec was read from (``ModelSpec.family``),
or, for a spec of plait's own (a preset, a model JSON), the first family whose config expresses
it: Llama, Mistral, Qwen2, Qwen3, OLMo-2, Gemma-2 for arch llama; GPT-2, then GPT-BigCode (multi-
query attention) for arch gpt; Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE for a mixture-of-experts
spec, DeepSeek-V3 for one with multi-head latent attention (``plait.spec.moe.hf_write``). Every
config written is read back with plait's reader: the spec it gives must be the exported one (its
name aside), or export refuses, naming the fields the family's config cannot hold. Dropout is not
written for llama-like families (their configs' dropout keys are refused by the reader; an exported
model is for inference).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from plait.errors import PlaitError
from plait.spec.hf.families import LLAMA_FAMILIES
from plait.spec.hf_config import model_from_hf_dict
from plait.spec.model import ModelSpec
from plait.spec.moe import hf_write

ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "olmo2": "Olmo2ForCausalLM", "gemma2": "Gemma2ForCausalLM",
    "phi3": "Phi3ForCausalLM", "gpt2": "GPT2LMHeadModel", "gpt_bigcode": "GPTBigCodeForCausalLM",
}
# Families tried, in order, for a spec that names none (ModelSpec.family "").
CANDIDATES = {"llama": ("llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma2"), "gpt": ("gpt2", "gpt_bigcode")}
# ModelSpec.activation -> the name written in config.json
ACTIVATION_NAMES = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}
GPT_DROPOUT = 0.1  # plait.run.model.DROPOUT: the rate of every dropout layer when ModelSpec.dropout is set
IGNORED = ("name", "family")  # fields that a round trip may change


def _rope(spec: ModelSpec) -> dict:
    """rope_theta and rope_parameters; the original context also at the top level, where Phi-3 reads
    it first (its config class defaults it to 4096, over the dict's: ``hf_rope_scaling``)."""
    scaling = dict(spec.rope_scaling)
    params = {"rope_type": "default", **scaling, "rope_theta": spec.rope_theta}
    out = {"rope_theta": spec.rope_theta, "rope_parameters": params}
    if "original_max_position_embeddings" in scaling:
        out["original_max_position_embeddings"] = scaling["original_max_position_embeddings"]
    return out


def _layer_types(spec: ModelSpec) -> list[str]:
    return ["sliding_attention" if spec.is_local_layer(i) else "full_attention" for i in range(spec.n_layers)]


def _pre_attn_scalar(spec: ModelSpec) -> float | int:
    """Gemma-2's query_pre_attn_scalar q, whose q^-1/2 is the score scale (an integer where it is one)."""
    if not spec.attn_scale:
        return spec.head_dim
    q = spec.attn_scale ** -2
    return round(q) if abs(q - round(q)) <= 1e-9 * q else q


def _llama_like(spec: ModelSpec, family: str) -> dict:
    """The keys every Llama-like family reads, then each family's own."""
    out = {"vocab_size": spec.vocab, "hidden_size": spec.hidden, "intermediate_size": spec.ffn_hidden,
           "num_hidden_layers": spec.n_layers, "num_attention_heads": spec.n_heads,
           "num_key_value_heads": spec.n_kv_heads, "head_dim": spec.head_dim,
           "max_position_embeddings": spec.max_seq_len, "rms_norm_eps": spec.norm_eps,
           "hidden_act": ACTIVATION_NAMES[spec.activation], **_rope(spec), "attention_dropout": 0.0,
           "tie_word_embeddings": spec.tied_embeddings}
    window = spec.sliding_window or None
    if family in ("llama", "qwen3", "olmo2", "gemma2"):
        out["attention_bias"] = spec.qkv_bias
    if family == "llama":
        out["mlp_bias"] = spec.mlp_bias
    if family in ("mistral", "phi3"):
        out["sliding_window"] = window
    if family in ("qwen2", "qwen3"):
        out.update(use_sliding_window=window is not None, sliding_window=window, max_window_layers=0,
                   layer_types=_layer_types(spec))
    if family == "gemma2":
        del out["hidden_act"]
        out.update(hidden_activation=ACTIVATION_NAMES[spec.activation], sliding_window=window or 4096,
                   layer_types=_layer_types(spec), attn_logit_softcapping=spec.attn_softcap or None,
                   final_logit_softcapping=spec.logit_softcap or None,
                   query_pre_attn_scalar=_pre_attn_scalar(spec))
        if not window:
            out["layer_types"] = ["full_attention"] * spec.n_layers
    if family == "phi3":
        out["resid_pdrop"] = out["embd_pdrop"] = 0.0
    return out


def _gpt(spec: ModelSpec, family: str) -> dict:
    dropout = GPT_DROPOUT if spec.dropout else 0.0
    activation = {"gelu_tanh": "gelu_new" if family == "gpt2" else "gelu_pytorch_tanh"}.get(spec.activation,
                                                                                            spec.activation)
    out = {"vocab_size": spec.vocab, "n_embd": spec.hidden, "n_layer": spec.n_layers, "n_head": spec.n_heads,
           "n_inner": spec.ffn_hidden, "n_positions": spec.max_seq_len, "layer_norm_epsilon": spec.norm_eps,
           "activation_function": activation, "resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout,
           "scale_attn_weights": True, "tie_word_embeddings": spec.tied_embeddings}
    if family == "gpt2":
        out["n_ctx"] = spec.max_seq_len
    else:
        out["multi_query"] = spec.n_kv_heads == 1
    return out


def config_for(spec: ModelSpec, family: str, dtype: str = "float32") -> dict:
    """The config.json of ``spec`` as a ``family`` model (``dtype``: the weights' dtype name), unchecked."""
    if family in hf_write.ARCHITECTURES:
        body = hf_write.moe_config_for(spec, family, _rope(spec))
    else:
        body = _llama_like(spec, family) if family in LLAMA_FAMILIES else _gpt(spec, family)
    ids = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    architecture = {**ARCHITECTURES, **hf_write.ARCHITECTURES}[family]
    return {"architectures": [architecture], "model_type": family, **body, **ids,
            "dtype": dtype, "torch_dtype": dtype}


def differences(spec: ModelSpec, config: dict, family: str) -> list[str]:
    """``field=value`` of ``spec`` for each field that ``config``, read back, does not reproduce."""
    try:
        back = model_from_hf_dict(config, Path(f"({family} config.json)"))
    except PlaitError as exc:
        return [str(exc)]
    ignored = IGNORED + (("dropout",) if family in LLAMA_FAMILIES else ())
    return [f"{f.name}={getattr(spec, f.name)!r}" for f in dataclasses.fields(spec)
            if f.name not in ignored and getattr(spec, f.name) != getattr(back, f.name)]


def hf_config_of(spec: ModelSpec, dtype: str = "float32") -> dict:
    """The config.json of ``spec``: its own family's, or the first candidate's that reads back as ``spec``;
    PlaitError naming what no family's config can hold."""
    moe = spec.moe is not None or spec.mla is not None
    families = (spec.family,) if spec.family else (hf_write.candidates(spec) if moe else CANDIDATES[spec.arch])
    missing = hf_write.unwritten(spec)
    if missing:
        raise PlaitError(f"model {spec.name}: plait cannot export {missing} in a Hugging Face format yet (it exports "
                         f"the mixture-of-experts families {', '.join(hf_write.ARCHITECTURES)})")
    if spec.family and (spec.family in hf_write.ARCHITECTURES) != moe and spec.family in {**ARCHITECTURES,
                                                                                          **hf_write.ARCHITECTURES}:
        raise PlaitError(f"model {spec.name}: a {spec.family} config.json cannot express "
                         f"{'its mixture-of-experts layers' if moe else 'a dense model'}")
    if spec.family and spec.family not in ARCHITECTURES and spec.family not in hf_write.ARCHITECTURES:
        raise PlaitError(f"model {spec.name}: plait cannot write a config.json of model_type {spec.family!r} "
                         f"(it writes {', '.join([*ARCHITECTURES, *hf_write.ARCHITECTURES])})")
    first_problem = None
    for family in families:
        config = config_for(spec, family, dtype)
        wrong = differences(spec, config, family)
        if not wrong:
            return config
        first_problem = first_problem or (family, wrong)
    family, wrong = first_problem
    tried = f" (tried {', '.join(families)})" if len(families) > 1 else ""
    raise PlaitError(f"model {spec.name}: a {family} config.json cannot express {', '.join(wrong)}{tried}; "
                     "it cannot be exported in a Hugging Face format")
