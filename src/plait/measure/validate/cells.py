"""How a published row's cells in words are read (``plait validate``): ZeRO stage, recompute policy,
architecture family, precision, activation offload in the notes. Each reader returns None for a blank
or a cell it does not understand (the caller searches that knob and says so). No torch."""

from __future__ import annotations

import math
import re


def zero_stage_of(text: str) -> tuple[int, bool] | None:
    """(ZeRO stage, hybrid sharding) from a source's words, or None when blank or not understood."""
    t = text.strip().lower()
    if not t:
        return None
    if not_sharded(t):
        return None  # FSDP off: the stack's optimizer sharding decides (_given_knobs)
    hybrid = "hybrid" in t or "hsdp" in t
    leading = re.match(r"([0-3])\b", t)
    if leading:
        return int(leading.group(1)), hybrid
    named = re.search(r"(?:zero|stage)[\s_-]*(?:stage[\s_-]*)?([0-3])\b", t)
    if named:
        return int(named.group(1)), hybrid
    if "shard_grad_op" in t or "grad_op" in t:
        return 2, hybrid
    if "full shard" in t or "full_shard" in t or "fully shard" in t or "fsdp" in t or hybrid:
        return 3, hybrid
    if "distributed optimizer" in t:
        return 1, False
    if t in ("none", "no", "off", "ddp") or t.startswith("ddp"):
        return 0, False
    return None


def recompute_modules(text: str) -> set[str]:
    """The module names of a Megatron-style recompute cell, ``selective(layernorm, moe)`` -> {layernorm, moe}."""
    return set(re.findall(r"[a-z_]+", text.lower().partition("(")[2]))


def recompute_of(text: str, n_layers_per_stage: int, selective: str = "modules") -> tuple[str, int, bool] | None:
    """(policy, layers per stage, op-level SAC) from the source's words; None when blank or unknown.
    ``selective``: what a bare "selective" means in the software the row ran (``Stack.run_value``):
    "modules" (Megatron's recomputed modules) or "op" (torchtitan's per-op selective checkpointing)."""
    t = text.strip().lower()
    if selective == "op" and t == "selective":
        t = "op-level selective"
    if not t:
        return None
    if t.startswith(("none", "no", "false", "off")):
        return "none", 0, False
    if t.startswith(("full", "uniform", "block", "yes", "true", "every layer")):
        return "full", 0, False
    half = max(1, n_layers_per_stage // 2)
    if "per-layer" in t or "per layer" in t:  # torchtitan: checkpoint every second layer in full
        return "full", half, False
    if "op-level" in t or "op level" in t or "sac" in t.split():
        # torchtitan op-level SAC: keeps every second matmul output and the attention output, so it
        # recomputes about the FLOPs of half of the layers; its memory is ``op_level_memory``
        return "full", half, True
    if t.startswith("selective"):  # Megatron-Core's module list: the MLP/MoE block recomputed is plait's mlp
        return ("mlp" if recompute_modules(t) & {"mlp", "moe"} else "selective"), 0, False
    if "activation checkpoint" in t or "recompute" in t or "gradient checkpoint" in t:
        return "full", 0, False
    return None


# families whose dense blocks are Llama's (RMSNorm, SwiGLU, RoPE) or GPT's (LayerNorm, GELU MLP)
_LLAMA_WORDS = ("llama", "mistral", "qwen", "yi", "internlm", "baichuan", "deepseek")
_GPT_WORDS = ("gpt", "mpt", "bloom", "opt", "falcon", "megatron", "turing-nlg", "mt-nlg", "palm")


def arch_of(word: str) -> str | None:
    """``gpt`` or ``llama`` for an architecture word that names a family of either kind, else None."""
    word = word.strip().lower()
    if any(w in word for w in ("moe", "mixtral")):
        return None  # experts: not a dense family
    if any(word.startswith(w) for w in _LLAMA_WORDS):
        return "llama"
    if any(word.startswith(w) for w in _GPT_WORDS):
        return "gpt"
    return None


def not_sharded(text: str) -> bool:
    """Whether a zero_stage cell says only that FSDP was off ("ddp (FSDP=0)"): the optimizer may still
    be sharded (Megatron's distributed optimizer), so the stack's default decides."""
    return re.search(r"fsdp\s*=\s*0\b", text.lower()) is not None


def fsdp_on(notes: str) -> bool:
    """Whether a row's notes copy a source's FSDP column as on ("FSDP=On") while its zero_stage cell is
    blank: the Megatron-MoE-ModelZoo tables mark Megatron-FSDP runs so, and Megatron-FSDP is run with
    ``--data-parallel-sharding-strategy optim_grads_params`` (parameters, gradients and optimizer
    sharded: ZeRO-3) in the Megatron-LM docs and every script that enables it (its argument's
    default, no_shard, would make the column meaningless)."""
    return re.search(r"\bfsdp\s*=\s*on\b", notes.lower()) is not None


def precision_of(text: str) -> str:
    """The layout precision of a source's precision words: ``nvfp4`` (any fp4), ``mxfp8`` (MX or
    32-element block scaling), ``fp8`` (fp8, float8, FP8-CS, delayed), else ``bf16`` (bf16, fp16, mixed)."""
    t = text.lower()
    if "fp4" in t:
        return "nvfp4"
    if "mxfp8" in t or "fp8-mx" in t or "mx" in t.split():
        return "mxfp8"
    return "fp8" if "fp8" in t or "float8" in t else "bf16"


def offloaded_layers(notes: str) -> int | None:
    """Layers whose activations a run offloaded to host memory, from its notes
    (``cpu_offloading_num_layers=40``, "activation offload of 40 layers"), or None."""
    found = re.search(r"cpu_offloading_num_layers\s*[= ]\s*(\d+)", notes) or \
        re.search(r"offload(?:ing)? of (\d+) layers", notes, re.IGNORECASE)
    return int(found.group(1)) if found else None


def local_batch_of(notes: str) -> int | None:
    """The sequences per data-parallel rank and step a source states in words ("local batch size 8"),
    or None."""
    match = re.search(r"local batch size (\d+)", notes, re.IGNORECASE)
    return int(match.group(1)) if match else None


def schedule_of(notes: str) -> str | None:
    """The pipeline schedule a source names in words: "interleaved-1f1b" ("Interleaved 1F1B"), "1f1b"
    ("1F1B"), or None."""
    t = notes.lower()
    if re.search(r"interleaved[ -]?1f1b", t):
        return "interleaved-1f1b"
    return "1f1b" if re.search(r"\b1f1b\b(?!\s*(?:a2a|all-to-all|ep|overlap))", t) else None


def num(row: dict, key: str) -> float | None:
    """The cell ``key`` as a finite number, or None when blank or not a number."""
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def integer(row: dict, key: str) -> int | None:
    """The cell ``key`` as an integer (truncated), or None (``num``)."""
    value = num(row, key)
    return int(value) if value is not None else None
