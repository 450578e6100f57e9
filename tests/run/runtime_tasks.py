"""Task bodies run on every rank of a DistPool (and, for the reference, in one process).

``train_layout`` trains the tiny model with a layout and returns, on every rank, the per-step
losses and the full (gathered, unsharded) parameters keyed by their plain-model names.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from plait.run.config import FLAT_FIELDS, CheckpointConfig, LogConfig, OptimConfig, RunConfig, RuntimeConfig, TrainJob
from plait.run.model import canonical_name
from plait.spec.layout import Layout
from plait.spec.models import get_model

# Small enough to be fast on 2 cores, large enough for every layout in the tests:
# 4 layers (pp=4 or pp·vpp=4), 4 heads and 2 KV heads (tp=2), batch 8 (dp·mbs up to 8).
OPTIM = OptimConfig(lr=1e-3, warmup_steps=1, weight_decay=0.1, grad_clip=1.0, eps=1e-6)


def make_config(layout: str, steps: int = 3, global_batch: int = 8, seq_len: int = 32, model: str = "tiny",
                data: str = "synthetic", **overrides) -> RunConfig:
    """The tiny run on CPU; ``overrides`` by their flat names (``checkpoint_dir=``, ``compile=``, ``optim=``...)."""
    sections: dict[str, dict] = {"job": {}, "checkpoint": {}, "runtime": {"device": "cpu", "timeout_s": 60},
                                 "observe": {}}
    optim = overrides.pop("optim", OPTIM)
    for key, value in overrides.items():
        section, name = FLAT_FIELDS[key]
        sections[section][name] = value
    job = TrainJob(model=get_model(model), layout=Layout.parse(layout), global_batch=global_batch, seq_len=seq_len,
                   steps=steps, seed=1234, data=data, **sections["job"])
    return RunConfig(job=job, optim=optim, checkpoint=CheckpointConfig(**sections["checkpoint"]),
                     runtime=RuntimeConfig(**sections["runtime"]), observe=LogConfig(**sections["observe"]))


def full_parameters(parts) -> dict[str, torch.Tensor]:
    """Every parameter of the full model, unsharded, from all ranks (a collective)."""
    local: dict[str, torch.Tensor] = {}
    for name, param in parts.named_parameters():
        value = param.full_tensor() if isinstance(param, DTensor) else param
        local[canonical_name(name)] = value.detach().cpu().clone()
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local
    gathered: list[dict] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(gathered, local)
    merged: dict[str, torch.Tensor] = {}
    for piece in gathered:
        merged.update(piece)
    return merged


def train_layout(layout: str, part_fields: tuple[str, ...] = ("checkpointed",), **kwargs) -> dict:
    """Train and return {'losses', 'params', 'grad_norms'} (the same on every rank) and the
    ``ModelParts`` attributes named in ``part_fields``."""
    return train_config(make_config(layout, **kwargs), part_fields)


def train_config(config, part_fields: tuple[str, ...] = ()) -> dict:
    """``train_layout`` for a ready ``RunConfig`` (a model spec that is no preset, a changed job)."""
    from plait.run.trainer import run_training

    result = run_training(config, device=torch.device("cpu"))
    params = full_parameters(result.parts)
    out = {"losses": [r.loss for r in result.records], "grad_norms": [r.grad_norm for r in result.records],
           **{name: getattr(result.parts, name) for name in part_fields}}
    # one rank returns the (large) parameter dict; the others only their losses
    if dist.get_rank() == 0:
        out["params"] = params
    return out


def in_one_process(task, *args, **kwargs):
    """``task(*args, **kwargs)`` in a one-rank process group of its own (gloo, file store), in this process."""
    if dist.is_initialized():
        raise RuntimeError("in_one_process() must run in a process without a process group")
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            return task(*args, **kwargs)
        finally:
            dist.destroy_process_group()


def reference(**kwargs) -> dict:
    """The single-process run of the tiny model (or ``model=``)."""
    return in_one_process(train_layout, "dp=1", **kwargs)


def tied_model_parameters(layout: str) -> dict:
    """Build a tied-embedding tiny model under ``layout`` and report the tie and the parameter count."""
    import dataclasses

    from plait.run.parallel.mesh import build_parallel_dims
    from plait.run.model import count_parameters
    from plait.run.parallel.parallelize import build_model_parts

    spec = dataclasses.replace(get_model("tiny"), tied_embeddings=True, name="tiny-tied")
    lay = Layout.parse(layout)
    parts = build_model_parts(spec, build_parallel_dims(lay, "cpu"), torch.device("cpu"), 0, lay.micro_batches(8))
    model = parts.chunks[0]
    model = getattr(model, "module", model)  # DDP
    return {"tied": model.output.weight is model.tok_embeddings.weight, "count": count_parameters(model),
            "planned": spec.total_params()}
