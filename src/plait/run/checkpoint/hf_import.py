"""``plait train --init-from DIR``: a local Hugging Face checkpoint's weights replace the random init.

``load_hf_weights`` runs on every rank after the model parts are built (any layout): it first
checks the whole checkpoint against the model being trained - every plait parameter has its
Hugging Face tensor with the shape the model needs, every Hugging Face tensor has a place in the
model, and the config's numerics that plait's runtime hard-codes (rotary base, norm epsilon,
activation) are the ones it uses - and refuses with the first problem by name. Then each rank
reads, from the memory-mapped safetensors files, the full tensors of the parameters it holds (a
pipeline stage only its own layers'), converts them (``plait.run.checkpoint.hf_map``) and keeps
its shard, as ``plait.run.model.init_weights`` does with random values: no communication.
The optimizer starts fresh (AdamW state zero at step 0).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from plait.errors import PlaitError
from plait.run.checkpoint.hf_files import TensorEntry, read_config, tensor_table
from plait.run.checkpoint.hf_map import Family, Row, concrete, family_of_model_type, row_for
from plait.run.model import NORM_EPS, ROPE_THETA, build_model, canonical_name
from plait.spec.model import ModelSpec

# Hugging Face config keys that change a model's outputs (not its shapes) and that plait's runtime
# does not read: (family, key, Hugging Face default when absent, the value plait's runtime uses).
# A config with another value is refused. Where run/model.py learns to follow a key (e.g. a
# ModelSpec field for the rotary base), drop its line here.
RUNTIME_VALUES = [
    ("llama", "rope_theta", 10000.0, ROPE_THETA),
    ("llama", "rope_type", "default", "default"),
    ("llama", "rms_norm_eps", 1e-6, NORM_EPS),
    ("llama", "hidden_act", "silu", "silu"),
    ("phi3", "rope_theta", 10000.0, ROPE_THETA),
    ("phi3", "rope_type", "default", "default"),
    ("phi3", "rms_norm_eps", 1e-5, NORM_EPS),
    ("phi3", "hidden_act", "silu", "silu"),
    ("phi3", "partial_rotary_factor", 1.0, 1.0),
    ("gpt2", "layer_norm_epsilon", 1e-5, NORM_EPS),
    ("gpt2", "activation_function", "gelu_new", "gelu_new"),
    ("gpt2", "scale_attn_weights", True, True),
    ("gpt2", "scale_attn_by_inverse_layer_idx", False, False),
]
SAME_ACTIVATIONS = {"gelu_new": ("gelu_new", "gelu_pytorch_tanh")}  # names of plait's tanh-approximate GELU


def config_value(config: dict, key: str, default):
    """A config value, also where transformers 5 nests the rotary settings (``rope_parameters``) or
    transformers 4 put the scaling (``rope_scaling``)."""
    if key in ("rope_theta", "rope_type", "partial_rotary_factor"):
        for nested in ("rope_parameters", "rope_scaling"):
            block = config.get(nested)
            if isinstance(block, dict):
                value = block.get(key, block.get("type") if key == "rope_type" else None)
                if value is not None:
                    return value
    value = config.get(key)
    return default if value is None else value


def runtime_mismatches(config: dict, family: Family, spec: ModelSpec) -> list[str]:
    """``key=value (plait runs V)`` for each output-changing config value plait's runtime does not use.

    A sliding attention window must be the model's own (``ModelSpec.sliding_window`` where the spec
    has one; plait's attention is otherwise full causal); Qwen2's ``use_sliding_window: false``
    switches the config's window off."""
    out = []
    window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
    if window != getattr(spec, "sliding_window", None):
        out.append(f"sliding_window={window!r} (model {spec.name} attends over "
                   f"{getattr(spec, 'sliding_window', None) or 'the whole causal context'})")
    for name, key, default, used in RUNTIME_VALUES:
        if name != family.name:
            continue
        value = config_value(config, key, default)
        if value == used or value in SAME_ACTIVATIONS.get(used, ()):
            continue
        out.append(f"{key}={value!r} (plait's runtime uses {used!r})")
    return out


def resolve_name(name: str, table: dict[str, TensorEntry], family: Family) -> str | None:
    """The name under which ``table`` holds Hugging Face tensor ``name`` (also without the base model's
    prefix, as GPT-2's own checkpoint stores it), or None."""
    if name in table:
        return name
    if name.startswith(family.strip_prefix) and name[len(family.strip_prefix):] in table:
        return name[len(family.strip_prefix):]
    return None


def unique_parameters(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """{plain-model name: parameter}, a tied parameter once (under its first name)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, param in named:
        if id(param) not in seen:
            seen.add(id(param))
            out[canonical_name(name)] = param
    return out


def row_instances(family: Family, params: dict[str, torch.Tensor]) -> dict[str, tuple[Row, list[str]]]:
    """{Hugging Face name: (row, the plait names of its parts)} for the rows that ``params`` needs."""
    out: dict[str, tuple[Row, list[str]]] = {}
    for name in params:
        row, _, layer = row_for(family, name)
        out.setdefault(concrete(row.hf, layer), (row, [concrete(p, layer) for p in row.plait]))
    return out


def check_checkpoint(directory: str | Path, spec: ModelSpec) -> tuple[Family, dict[str, TensorEntry], dict[str, str]]:
    """(family, tensor table, {Hugging Face row name: name in the files}) of a checkpoint that fits ``spec``
    exactly; PlaitError naming the first problem (config numerics, a missing, misshapen or unused tensor)."""
    config = read_config(directory)
    family = family_of_model_type(str(config.get("model_type", "")).lower())
    wrong = runtime_mismatches(config, family, spec)
    if wrong:
        raise PlaitError(f"--init-from {directory}: config.json sets {'; '.join(wrong)}, which plait would "
                         "silently ignore; train from a checkpoint whose config uses plait's values")
    table = tensor_table(directory)
    full = unique_parameters(build_model(spec, "meta").named_parameters())
    located: dict[str, str] = {}
    for hf_name, (row, plait_names) in row_instances(family, full).items():
        where = resolve_name(hf_name, table, family)
        if where is None:
            tied = " (the checkpoint ties its LM head to the embedding: tie_word_embeddings)" \
                if hf_name == "lm_head.weight" else ""
            raise PlaitError(f"--init-from {directory}: no tensor {hf_name} for plait parameter "
                             f"{plait_names[0]} of model {spec.name}{tied}")
        parts = tuple(full[name] for name in plait_names if name in full)
        if len(parts) != len(plait_names):
            absent = [name for name in plait_names if name not in full]
            raise PlaitError(f"--init-from {directory}: {hf_name} also holds {absent[0]}, which model "
                             f"{spec.name} does not have")
        expected = tuple(row.codec.to_hf(parts, spec).shape)
        if table[where].shape != expected:
            raise PlaitError(f"--init-from {directory}: {where} has shape {list(table[where].shape)}, model "
                             f"{spec.name} needs {list(expected)} (for {', '.join(plait_names)}); "
                             "pass the checkpoint's own config as --model")
        located[hf_name] = where
    used = set(located.values())
    ignored = [re.compile(pattern) for pattern in family.ignored]
    for name in sorted(table):
        if name in used or any(p.match(name) for p in ignored):
            continue
        if name == "lm_head.weight" and spec.tied_embeddings:
            continue  # a tied head saved anyway: the same matrix as the embedding
        raise PlaitError(f"--init-from {directory}: tensor {name} has no place in plait's model {spec.name} "
                         "(a weight the runtime does not build would be dropped)")
    return family, table, located


def _open(file: Path, handles: dict):
    if file not in handles:
        try:
            from safetensors import safe_open
        except ImportError:
            raise PlaitError("--init-from needs the safetensors package: pip install safetensors") from None
        handles[file] = safe_open(str(file), framework="pt")
    return handles[file]


@torch.no_grad()
def load_hf_weights(directory: str | Path, named: Iterable[tuple[str, torch.Tensor]], spec: ModelSpec,
                    device: torch.device | str) -> int:
    """Copy a Hugging Face checkpoint into this rank's parameters (``named``: e.g. ``ModelParts.named_parameters()``,
    plain, DTensor or FSDP-sharded); returns the number of Hugging Face tensors this rank read."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    family, table, located = check_checkpoint(directory, spec)
    device = torch.device(device)
    handles: dict = {}
    converted: dict[str, tuple[torch.Tensor, ...]] = {}  # a fused tensor's parts, kept until all are copied
    params = unique_parameters(named)
    waiting = {hf_name: set(names) & set(params) for hf_name, (_, names) in row_instances(family, params).items()}
    read = 0
    for name, param in params.items():
        row, position, layer = row_for(family, name)
        hf_name = concrete(row.hf, layer)
        if hf_name not in converted:
            where = located[hf_name]
            value = _open(table[where].file, handles).get_tensor(where).to(device=device, dtype=torch.float32)
            converted[hf_name] = row.codec.to_plait(value, spec)
            read += 1
        full = converted[hf_name][position].to(param.dtype)
        if isinstance(param, DTensor):
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(full)
        waiting[hf_name].discard(name)
        if not waiting[hf_name]:
            del converted[hf_name]  # held only until its last part is copied
    return read


def init_from_hf(job, parts, device: torch.device) -> dict:
    """Load ``job.init_from`` (a ``TrainJob``'s Hugging Face directory) into this rank's model ``parts``;
    the JSONL event that records it."""
    start = time.perf_counter()
    read = load_hf_weights(job.init_from, parts.named_parameters(), job.model, device)
    return {"event": "init_from", "directory": job.init_from, "tensors_read": read,
            "load_s": time.perf_counter() - start, "time": time.time()}
