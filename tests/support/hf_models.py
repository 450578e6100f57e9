"""Tiny random Hugging Face models for the --init-from / plait export tests (tests/run/test_hf_*.py).

Their configs use the numerics plait's runtime runs (RMSNorm eps 1e-5, rotary base 10000, GELU
tanh), and sizes that every layout of the tests divides (4 heads, 2 KV heads for tp=2).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, POSITIONS = 128, 64, 96, 2, 4, 2, 64
INIT_STD = 0.2  # 10× transformers' default: peaked logits, so a loss far from ln(vocab) tells weights apart


def llama(seed: int = 0, tied: bool = False):
    """A randomly initialized tiny ``LlamaForCausalLM`` (eval mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=POSITIONS,
                         rms_norm_eps=1e-5, tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0,
                         initializer_range=INIT_STD)
    return LlamaForCausalLM(config).eval()


def gpt2(seed: int = 0):
    """A randomly initialized tiny ``GPT2LMHeadModel`` (eval mode, tied head as GPT-2's)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=POSITIONS,
                        n_inner=FFN, bos_token_id=0, eos_token_id=0, initializer_range=INIT_STD)
    return GPT2LMHeadModel(config).eval()


def save(model, directory: Path, max_shard_size: str | None = None) -> Path:
    """``save_pretrained`` (safetensors; sharded when ``max_shard_size`` is given); returns ``directory``."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(directory), **kwargs)
    return directory


def load(directory: Path):
    """The model of a Hugging Face directory, loaded by transformers (eval mode, fp32)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()


def synthetic_batch(vocab: int, seed: int, global_batch: int, seq_len: int, step: int = 0) -> torch.Tensor:
    """The token rows (global_batch, seq_len + 1) that plait train reads at ``step`` from --data synthetic."""
    from plait.run.data.tokens import open_tokens

    rows = open_tokens("synthetic", vocab, seed).batch(step, range(global_batch), seq_len, global_batch)
    return torch.as_tensor(rows, dtype=torch.long)


def plait_model(spec, checkpoint: Path | None = None):
    """plait's model of ``spec`` in one process (no process group): random, or the weights of a DCP checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    from plait.run.checkpoint.hf_import import unique_parameters
    from plait.run.model import build_model, init_weights

    model = build_model(spec, "cpu")
    model.tie_embeddings()
    init_weights(model, spec, 0, "cpu")
    if checkpoint is not None:
        state = {f"model.{name}": p.detach() for name, p in unique_parameters(model.named_parameters()).items()}
        with warnings.catch_warnings():  # DCP warns that it loads in one process, which is the intent
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=FileSystemReader(str(checkpoint)), no_dist=True)
    return model.eval()
