"""Model presets, each with its source. ``plait models`` lists them.

Sources:
  * ``megatron-*``: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
    Clusters Using Megatron-LM" (SC21), Table 1: GPT models with ffn = 4h, vocabulary 51,200
    (GPT-2 BPE padded), sequence 2048, learned positions, tied embeddings, dropout 0.1.
  * ``gpt3-*``: Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1
    (vocabulary 50,257, context 2048, tied embeddings).
  * ``llama-*``: Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models",
    Table 2 and the released params.json (ffn from the 2/3·4h rule rounded to 256; vocab 32,000).
  * ``llama2-*``: Touvron et al. 2023, "Llama 2", Table 1 and the released config.json files
    (70B uses grouped-query attention with 8 KV heads; context 4096).
  * ``llama3-*`` / ``llama3.2-1b``: Llama Team 2024, "The Llama 3 Herd of Models", Table 3 and the
    released config.json files (vocabulary 128,256, 8 KV heads; 3.2-1B ties its embeddings).
  * ``tiny``, ``tiny-gpt``, ``llama-125m``, ``gpt-125m``: small models for the runtime tests and examples
    (``gpt-125m`` is GPT-3 Small from Brown et al. 2020).
  * mixture-of-experts presets (Mixtral, Qwen3-MoE, OLMoE, DeepSeek-V3, GPT-OSS, ``tiny-moe``):
    ``plait.spec.moe.presets``, each with its source.
"""

from __future__ import annotations

from plait.errors import PlaitError
from plait.spec.hf_config import model_from_hf_config
from plait.spec.model import ModelSpec
from plait.spec.moe.presets import MOE_PRESETS


def _megatron(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name=name, arch="gpt", n_layers=layers, hidden=hidden, ffn_hidden=4 * hidden,
        n_heads=heads, n_kv_heads=heads, vocab=51200, max_seq_len=2048,
        tied_embeddings=True, dropout=True,
    )


def _llama(name, layers, hidden, ffn, heads, kv, vocab, seq, tied=False) -> ModelSpec:
    return ModelSpec(
        name=name, arch="llama", n_layers=layers, hidden=hidden, ffn_hidden=ffn,
        n_heads=heads, n_kv_heads=kv, vocab=vocab, max_seq_len=seq, tied_embeddings=tied,
    )


_PRESETS = [
    _megatron("megatron-1.7b", 24, 2304, 24),
    _megatron("megatron-3.6b", 30, 3072, 32),
    _megatron("megatron-7.5b", 36, 4096, 32),
    _megatron("megatron-18b", 40, 6144, 48),
    _megatron("megatron-39b", 48, 8192, 64),
    _megatron("megatron-76b", 60, 10240, 80),
    _megatron("megatron-146b", 80, 12288, 96),
    _megatron("megatron-310b", 96, 16384, 128),
    _megatron("megatron-530b", 105, 20480, 128),
    _megatron("megatron-1t", 128, 25600, 160),
    ModelSpec(name="gpt3-175b", arch="gpt", n_layers=96, hidden=12288, ffn_hidden=49152,
              n_heads=96, n_kv_heads=96, vocab=50257, max_seq_len=2048,
              tied_embeddings=True, dropout=True),
    _llama("llama-7b", 32, 4096, 11008, 32, 32, 32000, 2048),
    _llama("llama-13b", 40, 5120, 13824, 40, 40, 32000, 2048),
    _llama("llama-30b", 60, 6656, 17920, 52, 52, 32000, 2048),
    _llama("llama-65b", 80, 8192, 22016, 64, 64, 32000, 2048),
    _llama("llama2-7b", 32, 4096, 11008, 32, 32, 32000, 4096),
    _llama("llama2-13b", 40, 5120, 13824, 40, 40, 32000, 4096),
    _llama("llama2-70b", 80, 8192, 28672, 64, 8, 32000, 4096),
    _llama("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192),
    _llama("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 8192),
    _llama("llama3-405b", 126, 16384, 53248, 128, 8, 128256, 8192),
    _llama("llama3.2-1b", 16, 2048, 8192, 32, 8, 128256, 8192, tied=True),
    _llama("llama-125m", 12, 768, 2048, 12, 12, 32000, 2048),
    ModelSpec(name="gpt-125m", arch="gpt", n_layers=12, hidden=768, ffn_hidden=3072,
              n_heads=12, n_kv_heads=12, vocab=50257, max_seq_len=2048, tied_embeddings=True),
    _llama("tiny", 4, 128, 384, 4, 2, 512, 256),
    ModelSpec(name="tiny-gpt", arch="gpt", n_layers=4, hidden=128, ffn_hidden=512, n_heads=4,
              n_kv_heads=4, vocab=512, max_seq_len=256),
]

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _PRESETS + MOE_PRESETS}


def _is_hf_config(path) -> bool:
    """Whether the JSON file ``path`` is a Hugging Face config under another name (it has a
    ``model_type``; a plait model JSON has none)."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and "model_type" in data


def get_model(name: str) -> ModelSpec:
    """A preset by name, or a local Hugging Face config.json / plait model JSON by path."""
    if name in MODELS:
        return MODELS[name]
    from pathlib import Path

    path = Path(name)
    if path.exists():
        if path.is_dir() or path.name == "config.json" or _is_hf_config(path):
            return model_from_hf_config(path)
        try:
            return ModelSpec.from_json(path.read_text())
        except ValueError as exc:
            raise PlaitError(f"{path}: not a model JSON file ({exc})") from None
    raise PlaitError(f"unknown model {name!r}; known models: {', '.join(MODELS)} (or a path to config.json)")
