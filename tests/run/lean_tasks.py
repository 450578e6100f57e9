"""Task bodies for the lean-runtime tests (FSDP units, fused QKV): run on every rank of a DistPool."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

import runtime_tasks
from plait.spec.layout import Layout
from plait.spec.models import get_model


def tied_spec(model: str = "tiny-gpt"):
    """``model`` with the LM head tied to the token embedding (GPT-2 style)."""
    return dataclasses.replace(get_model(model), tied_embeddings=True, name=f"{model}-tied")


def train_spec(layout: str, spec, **kwargs) -> dict:
    """``runtime_tasks.train_layout`` for a model spec that is not a preset (e.g. ``tied_spec()``)."""
    config = runtime_tasks.make_config(layout, **kwargs)
    return runtime_tasks.train_config(dataclasses.replace(config, job=dataclasses.replace(config.job, model=spec)))


def reference_spec(spec, **kwargs) -> dict:
    return runtime_tasks.in_one_process(train_spec, "dp=1", spec, **kwargs)


def fsdp_units(layout: str, tied: bool = False) -> list[dict]:
    """This rank's FSDP units after building the parts: the module's name in the stage, the plain
    names of the parameters the unit manages, and whether it reshards after forward."""
    from torch.distributed.fsdp import FSDPModule

    from plait.run.model import canonical_name
    from plait.run.parallel.mesh import build_parallel_dims
    from plait.run.parallel.parallelize import build_model_parts

    spec = tied_spec("tiny") if tied else get_model("tiny")
    lay = Layout.parse(layout)
    parts = build_model_parts(spec, build_parallel_dims(lay, "cpu"), torch.device("cpu"), 0, lay.micro_batches(8))
    units: dict[int, dict] = {}
    for chunk in parts.chunks:
        names = {id(p): canonical_name(n) for n, p in chunk.named_parameters()}
        for name, module in chunk.named_modules():
            if not isinstance(module, FSDPModule):
                continue
            state = module._get_fsdp_state()
            group = state._fsdp_param_group
            unit = units.setdefault(id(state), {"modules": [], "params": [], "reshard": None})
            unit["modules"].append(canonical_name(name) or "<root>")
            if group is not None:
                unit["params"] = sorted(names[id(fp.sharded_param)] for fp in group.fsdp_params)
                unit["reshard"] = group.post_forward_mesh_info is not None
    return list(units.values())



def count_fused_projections(layout: str, model: str = "tiny") -> int:
    """Calls of ``qkv_projection`` in one training step with ``qkv="fused"`` on this rank."""
    import plait.run.model as model_module

    calls = []
    original = model_module.qkv_projection

    def counting(*args):
        calls.append(1)
        return original(*args)

    model_module.qkv_projection = counting
    try:
        runtime_tasks.train_layout(layout, qkv="fused", steps=1, model=model)
    finally:
        model_module.qkv_projection = original
    return len(calls)


# the c10d calls FSDP2 makes for its units, by torch version (2.13: *_single; earlier: *_tensor)
FSDP_COLLECTIVES = {"all_gather": ("all_gather_single", "all_gather_into_tensor"),
                    "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor")}


def fsdp_collective_counts(layout: str, steps: int = 2) -> dict[str, int]:
    """{"all_gather", "reduce_scatter"}: how many of each FSDP2 made on this rank while training
    the tiny model ``steps`` steps under ``layout`` (counted by wrapping the c10d functions FSDP2
    calls through ``torch.distributed``)."""
    counts = dict.fromkeys(FSDP_COLLECTIVES, 0)
    originals = {}

    def counting(kind, function):
        def call(*args, **kwargs):
            counts[kind] += 1
            return function(*args, **kwargs)
        return call

    for kind, names in FSDP_COLLECTIVES.items():
        for name in names:
            if hasattr(dist, name):
                originals[name] = getattr(dist, name)
                setattr(dist, name, counting(kind, originals[name]))
    try:
        runtime_tasks.train_layout(layout, steps=steps)
    finally:
        for name, function in originals.items():
            setattr(dist, name, function)
    return counts
