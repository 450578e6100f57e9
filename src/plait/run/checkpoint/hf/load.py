"""``plait train --init-from DIR``: a local Hugging Face checkpoint's weights replace the random init.

``load_hf_weights`` runs on every rank after the model parts are built (any layout): it first
checks the whole checkpoint against the model being trained - the ModelSpec that plait reads from
its config.json (``plait.spec.hf_config``) has the model's numerics (rotary base and scaling, norm
epsilon and placement, activation, soft-caps, sliding window, routing:
``plait.run.checkpoint.hf.numerics``, which ``plait train`` also asks before launching), every
plait parameter has its Hugging Face tensor with the shape the model needs, every Hugging Face tensor has a place in the
model - and refuses with the first problem by name. Then each rank reads, from the memory-mapped safetensors files, the full tensors of the parameters it holds (a
pipeline stage only its own layers'), converts them (``plait.run.checkpoint.hf.map``) and keeps
its shard, as ``plait.run.model.init_weights`` does with random values: no communication. An MoE
layer's routed experts are one plait tensor (E, in, out) and E Hugging Face tensors: a rank reads
the E of its layers and keeps its experts (``row_instances`` lists them one by one, ``read_row``
stacks them).
The optimizer starts fresh (AdamW state zero at step 0).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from plait.errors import PlaitError
from plait.run.checkpoint.hf.files import CONFIG, TensorEntry, read_config, tensor_table
from plait.run.checkpoint.hf.codecs import EXPERT, OneExpert, expert_names
from plait.run.checkpoint.hf.map import concrete, family_of_model_type, row_for
from plait.run.checkpoint.hf.numerics import check_config_fits
from plait.run.checkpoint.hf.rows import Family, Row
from plait.run.model import build_model, canonical_name, kept_buffers
from plait.spec.model import ModelSpec

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


def model_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{plain-model name: tensor} of what a Hugging Face checkpoint holds for plait model ``module``: its
    parameters (a tied one once) and the buffers checkpoints keep (``kept_buffers``: DeepSeek-V3's
    ``e_score_correction_bias`` is plait's ``score_bias``)."""
    return unique_parameters([*module.named_parameters(), *kept_buffers(module)])


def row_patterns(family: Family, params: dict[str, torch.Tensor]) -> dict[str, tuple[Row, list[str]]]:
    """{a row's Hugging Face name for its layer (``{e}`` kept for an expert row): (row, the plait names
    of its parts)} for the rows that ``params`` needs."""
    out: dict[str, tuple[Row, list[str]]] = {}
    for name in params:
        row, _, layer = row_for(family, name)
        out.setdefault(concrete(row.hf, layer), (row, [concrete(p, layer) for p in row.plait]))
    return out


def row_instances(family: Family, params: dict[str, torch.Tensor], spec: ModelSpec | None = None
                  ) -> dict[str, tuple[Row, list[str]]]:
    """{Hugging Face name: (row, the plait names of its parts)} for the tensors that ``params`` needs; an
    expert row once per routed expert of ``spec`` (the model the parameters are of), with a ``OneExpert``
    codec."""
    out: dict[str, tuple[Row, list[str]]] = {}
    for hf_name, (row, names) in row_patterns(family, params).items():
        if EXPERT not in hf_name:
            out[hf_name] = (row, names)
            continue
        if spec is None or spec.moe is None:
            raise PlaitError(f"{hf_name}: an expert row needs the model's mixture-of-experts spec")
        for e, name in enumerate(expert_names(hf_name, spec)):
            out[name] = (dataclasses.replace(row, hf=name, codec=OneExpert(e, row.codec)), names)
    return out


def read_row(hf_name: str, row: Row, spec: ModelSpec, read) -> tuple[torch.Tensor, ...]:
    """The plait tensors of row ``row`` (``hf_name``: its name for one layer), their Hugging Face
    tensors read by ``read(name)``: an expert row's E tensors stacked on a new dim 0."""
    names = expert_names(hf_name, spec)
    value = torch.stack([read(name) for name in names]) if EXPERT in hf_name else read(hf_name)
    return row.codec.to_plait(value, spec)


def check_checkpoint(directory: str | Path, spec: ModelSpec) -> tuple[Family, dict[str, TensorEntry], dict[str, str]]:
    """(family, tensor table, {Hugging Face row name: name in the files}) of a checkpoint that fits ``spec``
    exactly; PlaitError naming the first problem (config numerics, a missing, misshapen or unused tensor)."""
    config = read_config(directory)
    family = family_of_model_type(str(config.get("model_type", "")).lower())
    check_config_fits(directory, spec, config)
    table = tensor_table(directory)
    full = model_weights(build_model(spec, "meta"))
    located: dict[str, str] = {}
    for hf_name, (row, plait_names) in row_instances(family, full, spec).items():
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


def plait_state_from_hf(hf_state: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """plait's state dict (a tied matrix once, under its embedding's name) of an in-memory Hugging Face
    state dict of model ``spec`` (``spec.family``: its model_type), converted by the same table as
    ``load_hf_weights``; PlaitError for a missing tensor or one without a place."""
    family = family_of_model_type(spec.family or ("llama" if spec.arch == "llama" else "gpt2"))
    full = model_weights(build_model(spec, "meta"))
    out: dict[str, torch.Tensor] = {}
    used = set()

    def read(hf_name: str) -> torch.Tensor:
        where = resolve_name(hf_name, hf_state, family)
        if where is None:
            raise PlaitError(f"no tensor {hf_name} for a plait parameter of model {spec.name}")
        used.add(where)
        return hf_state[where]

    for hf_name, (row, names) in row_patterns(family, full).items():
        out.update(zip(names, read_row(hf_name, row, spec, read)))
    ignored = [re.compile(pattern) for pattern in family.ignored]
    for name in hf_state:
        tied_head = name == "lm_head.weight" and spec.tied_embeddings
        if name not in used and not tied_head and not any(p.match(name) for p in ignored):
            raise PlaitError(f"tensor {name} has no place in plait's model {spec.name}")
    return out


def _open(file: Path, handles: dict):
    if file not in handles:
        try:
            from safetensors import safe_open
        except ImportError:
            raise PlaitError("--init-from needs the safetensors package: pip install safetensors") from None
        handles[file] = safe_open(str(file), framework="pt")
    return handles[file]


def _read_tensor(directory, file: Path, name: str, handles: dict) -> torch.Tensor:
    """Tensor ``name`` of safetensors ``file``; PlaitError naming the file when it cannot be read or
    holds NaN or infinite values (which would otherwise surface as a non-finite loss, blamed on the
    learning rate and the data)."""
    try:
        value = _open(file, handles).get_tensor(name)
    except PlaitError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors' own errors: one line naming the file
        raise PlaitError(f"--init-from {directory}: cannot read tensor {name} from {file.name} "
                         f"({type(exc).__name__}: {str(exc)[:200]})") from None
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise PlaitError(f"--init-from {directory}: tensor {name} in {file.name} holds NaN or infinite values")
    return value


@torch.no_grad()
def load_hf_weights(directory: str | Path, named: Iterable[tuple[str, torch.Tensor]], spec: ModelSpec,
                    device: torch.device | str) -> int:
    """Copy a Hugging Face checkpoint into this rank's parameters and kept buffers (``named``: e.g.
    ``ModelParts.named_parameters()`` and ``state_buffers()``, plain, DTensor or FSDP-sharded); returns the
    number of Hugging Face tensors this rank read."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    family, table, located = check_checkpoint(directory, spec)
    device = torch.device(device)
    handles: dict = {}
    converted: dict[str, tuple[torch.Tensor, ...]] = {}  # a fused tensor's parts, kept until all are copied
    params = unique_parameters(named)
    waiting = {hf_name: set(names) & set(params) for hf_name, (_, names) in row_patterns(family, params).items()}
    read = 0

    def read_one(hf_name: str) -> torch.Tensor:
        nonlocal read
        where = located[hf_name]
        read += 1
        return _read_tensor(directory, table[where].file, where, handles).to(device=device, dtype=torch.float32)

    for name, param in params.items():
        row, position, layer = row_for(family, name)
        hf_name = concrete(row.hf, layer)
        if hf_name not in converted:
            converted[hf_name] = read_row(hf_name, row, spec, read_one)
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
    read = load_hf_weights(job.init_from, [*parts.named_parameters(), *parts.state_buffers()], job.model, device)
    return {"event": "init_from", "directory": job.init_from, "tensors_read": read,
            "load_s": time.perf_counter() - start, "time": time.time()}
