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
    """A randomly initialized tiny ``GPT2LMHeadModel`` (eval mode, tied head as GPT-2's), without dropout:
    plait reads GPT-2's dropout (0.1) from the config and would train with it, so a first training step
    would not compute transformers' eval-mode loss."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=POSITIONS,
                        n_inner=FFN, bos_token_id=0, eos_token_id=0, initializer_range=INIT_STD,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
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

    from plait.run.checkpoint.hf.load import model_weights
    from plait.run.model import build_model, init_weights

    model = build_model(spec, "cpu")
    model.tie_embeddings()
    init_weights(model, spec, 0, "cpu")
    if checkpoint is not None:
        state = {f"model.{name}": p.detach() for name, p in model_weights(model).items()}
        with warnings.catch_warnings():  # DCP warns that it loads in one process, which is the intent
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=FileSystemReader(str(checkpoint)), no_dist=True)
    return model.eval()


# ------------------------------------------------------------------ every family plait reads and writes
FAMILY_SIZES = {"hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
                "num_hidden_layers": LAYERS, "intermediate_size": FFN, "vocab_size": VOCAB,
                "max_position_embeddings": POSITIONS}
GPT_SIZES = {"n_embd": HIDDEN, "n_head": HEADS, "n_layer": LAYERS, "n_inner": FFN, "vocab_size": VOCAB,
             "n_positions": POSITIONS}
# Each family with its own features switched on (windows shorter than the tests' sequences).
FAMILY_FEATURES = {
    "llama": {"attention_bias": True, "mlp_bias": True, "rope_theta": 500000.0, "tie_word_embeddings": True,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 16}},
    "mistral": {"sliding_window": 5},
    "qwen2": {"rope_theta": 1e6},  # Q, K, V biases
    "qwen3": {"head_dim": 32},  # q 4·32 = 128 wide (hidden 64); per-head q/k norms
    "olmo2": {"rms_norm_eps": 1e-6},  # post norms, q/k norms over the whole projection
    "gemma2": {"head_dim": 32, "sliding_window": 5, "query_pre_attn_scalar": 24, "num_hidden_layers": 3},
    "phi3": {"sliding_window": 6},
    "gpt2": {},
    "gpt_bigcode": {"multi_query": True},
    # mixture-of-experts families: 4 experts, 2 per token (transformers saves one tensor per expert)
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48, "head_dim": 32,
                  "norm_topk_prob": True},
    "olmoe": {"num_experts": 4, "num_experts_per_tok": 2},  # un-normalized top-k weights, full q/k norms
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
                  "shared_expert_intermediate_size": 80},  # a shared expert with its sigmoid gate; Q/K/V biases
    # sinks, Q/K/V/O biases, a window on the even layer, router and expert biases (fused, interleaved
    # gate/up), the clamped SwiGLU
    "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 32, "sliding_window": 5,
                "layer_types": ["sliding_attention", "full_attention"],
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    # multi-head latent attention (low-rank queries; one head per KV head), the sigmoid router with its
    # balancing bias in 2 groups of which 1 is chosen, a shared expert, the first layer dense
    "deepseek_v3": {"num_key_value_heads": HEADS, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 32,
                    "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
                    "moe_intermediate_size": 48, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2,
                    "topk_group": 1, "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6},
}
MOE_FAMILIES = ("mixtral", "qwen3_moe", "olmoe", "qwen2_moe", "gpt_oss", "deepseek_v3")
ROUTER_BIASES = ("score_bias", "e_score_correction_bias")  # the sigmoid router's balancing bias (a buffer)


def family_config(family: str, directory: Path, **overrides) -> Path:
    """A tiny ``family`` config.json (FAMILY_FEATURES, then ``overrides``) written by transformers into
    ``directory``."""
    from transformers import AutoConfig

    sizes = GPT_SIZES if family in ("gpt2", "gpt_bigcode") else FAMILY_SIZES
    values = {**sizes, **FAMILY_FEATURES[family], "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": None,
              "initializer_range": INIT_STD, **overrides}
    AutoConfig.for_model(family, **values).save_pretrained(str(directory))
    return directory


@torch.no_grad()
def perturb_norms_and_biases(model, seed: int) -> None:
    """Norms start at 1 (Gemma: 0) and biases at 0: moved by 0.1·N(0, 1), so that a misplaced one shows
    (also the sigmoid router's balancing bias, a buffer: a misplaced one routes other experts)."""
    generator = torch.Generator().manual_seed(seed)
    biases = [(name, b) for name, b in model.named_buffers() if name.endswith(ROUTER_BIASES)]
    for name, param in [*model.named_parameters(), *biases]:
        if "norm" in name or "ln_" in name or name.endswith("bias"):
            param.add_(0.1 * torch.randn(param.shape, generator=generator))


def family_model(family: str, directory: Path, seed: int = 0, **overrides):
    """A random tiny transformers model of ``family`` (eager attention, eval mode), its config (``overrides``
    on FAMILY_FEATURES) in ``directory``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    family_config(family, directory, **overrides)
    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(str(directory), attn_implementation="eager")
    model = AutoModelForCausalLM.from_config(config).float().eval()
    perturb_norms_and_biases(model, seed)
    return model


def save_checkpoint(model, spec, root: Path, step: int = 1) -> Path:
    """``model``'s weights as a plait checkpoint ``root/step_NNNNNNNN`` of a dp=1 run, written in one process
    (DCP with no process group, then the manifest), as ``plait train`` would save it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    from plait.run.checkpoint import store
    from plait.run.checkpoint.hf.load import model_weights
    from plait.run.config import RunConfig, TrainJob
    from plait.spec.layout import Layout

    path = root / store.final_name(step)
    path.mkdir(parents=True)
    state = {f"model.{name}": p.detach() for name, p in model_weights(model).items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, storage_writer=FileSystemWriter(str(path)), no_dist=True)
    run = RunConfig(TrainJob(model=spec, layout=Layout.parse("dp=1"), global_batch=1, seq_len=8, steps=step))
    store.write_manifest(path, step, store.file_records(path, store.data_files(path)), run.to_dict(), {})
    return path


def assert_export_holds_trained(trained, reloaded, hf_model, inputs: torch.Tensor, rtol: float) -> None:
    """The reloaded export gives the trained plait model's logits (within ``rtol`` of their largest
    magnitude), and they are far from the starting Hugging Face model's: the export holds the trained
    weights, not the ones it started from."""
    with torch.no_grad():
        want = trained(inputs)
        got = reloaded(input_ids=inputs).logits
        start = hf_model(input_ids=inputs).logits
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= rtol * scale
    assert (start - want).abs().max().item() > 1e3 * rtol * scale



def train_from_and_export(source: Path, layout: str, tmp_path: Path, global_batch: int, seq_len: int,
                          steps: int, seed: int) -> tuple[list[dict], Path, Path]:
    """``plait train --init-from source`` on 2 CPU processes under ``layout`` (lr 1e-2), then ``plait
    export`` of its final checkpoint: (the step records of its JSONL log, the checkpoint directory, the
    export directory). The run's first log line must be its ``init_from`` event."""
    import json
    import os
    import subprocess
    import sys

    from plait.cli import main

    log, checkpoints, out = tmp_path / "run.jsonl", tmp_path / "ckpt", tmp_path / "exported"
    proc = subprocess.run([sys.executable, "-m", "plait.cli", "train", "--init-from", str(source), "--layout", layout,
                           "--nproc-per-node", "2", "--global-batch", str(global_batch), "--seq-len", str(seq_len),
                           "--steps", str(steps), "--seed", str(seed), "--lr", "1e-2", "--device", "cpu",
                           "--checkpoint-dir", str(checkpoints), "--log", str(log)],
                          capture_output=True, text=True, timeout=300, check=False, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[1]["event"] == "init_from"
    assert main(["export", "--checkpoint", str(checkpoints), "--to", str(out)]) == 0
    return [line for line in lines if "loss" in line and "summary" not in line], checkpoints, out
