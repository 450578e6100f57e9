"""Read a Hugging Face ``config.json`` from local disk into a ModelSpec (no download, no torch)."""

from __future__ import annotations

from pathlib import Path

from plait.errors import PlaitError
from plait.spec.moe.hf import MOE_TYPES, moe_from_hf_config
from plait.spec.model import ModelSpec
from plait.spec.serialize import read_json_file

LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "granite", "olmo2")
GPT_TYPES = ("gpt2", "gpt_bigcode")


def _require(config: dict, *keys: str, source: Path) -> int:
    for key in keys:
        if key in config and config[key] is not None:
            return _integer(config[key], key, source)
    raise PlaitError(f"{source}: config.json has none of the keys {', '.join(keys)}")


def _integer(value, key: str, source: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise PlaitError(f"{source}: {key}={value!r} must be an integer")
    return int(value)


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """A directory holding ``config.json``, or the file itself."""
    source = Path(path)
    if source.is_dir():
        source = source / "config.json"
    config = read_json_file(source, "Hugging Face config.json")
    if not isinstance(config, dict):
        raise PlaitError(f"{source}: config.json must hold a JSON object")
    model_type = str(config.get("model_type", "")).lower()
    name = config.get("_name_or_path") or source.parent.name or "hf-model"
    if model_type in LLAMA_TYPES:
        hidden = _require(config, "hidden_size", source=source)
        heads = _require(config, "num_attention_heads", source=source)
        return ModelSpec(
            name=str(name),
            arch="llama",
            n_layers=_require(config, "num_hidden_layers", source=source),
            hidden=hidden,
            ffn_hidden=_require(config, "intermediate_size", source=source),
            n_heads=heads,
            n_kv_heads=_integer(config.get("num_key_value_heads") or heads, "num_key_value_heads", source),
            vocab=_require(config, "vocab_size", source=source),
            max_seq_len=_integer(config.get("max_position_embeddings") or 2048, "max_position_embeddings", source),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    if model_type in GPT_TYPES:
        hidden = _require(config, "n_embd", "hidden_size", source=source)
        heads = _require(config, "n_head", "num_attention_heads", source=source)
        return ModelSpec(
            name=str(name),
            arch="gpt",
            n_layers=_require(config, "n_layer", "num_hidden_layers", source=source),
            hidden=hidden,
            ffn_hidden=_integer(config.get("n_inner") or 4 * hidden, "n_inner", source),
            n_heads=heads,
            n_kv_heads=heads,
            vocab=_require(config, "vocab_size", source=source),
            max_seq_len=_integer(config.get("n_positions") or config.get("n_ctx") or 1024, "n_positions", source),
            tied_embeddings=bool(config.get("tie_word_embeddings", True)),
        )
    if model_type in MOE_TYPES:  # mixture-of-experts families: plait.spec.moe.hf
        return moe_from_hf_config(config, source, str(name))
    raise PlaitError(
        f"{source}: model_type={model_type or '(missing)'!r} is not supported; "
        f"supported: {', '.join(LLAMA_TYPES + GPT_TYPES + MOE_TYPES)}"
    )
