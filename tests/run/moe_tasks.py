"""Task bodies of the mixture-of-experts runtime tests (tests/run/test_moe_parity.py), run on every
rank of a DistPool and, for the reference, in one process.

``train_layouts`` trains ``tiny-moe`` under several layouts in one pool round trip (each layout is
a run of its own on the same ranks), so that a test pays for one task, not one per layout.
"""

from __future__ import annotations

import contextlib
import os

import checkpoint_tasks
import runtime_tasks
from runtime_tasks import in_one_process, train_layout

from plait.spec.models import get_model

MODEL = "tiny-moe"  # 4 layers (the first dense), hidden 128, 8 experts top-2, one shared expert
STEPS = 3
GLOBAL_BATCH = 4  # 4 micro-batches of one sequence: dp=4 leaves one per rank
RUN = {"model": MODEL, "steps": STEPS, "global_batch": GLOBAL_BATCH}


def train_layouts(layouts: list[str]) -> list[dict]:
    """``runtime_tasks.train_layout`` of ``tiny-moe`` for each layout, in order (parameters on rank 0)."""
    return [train_layout(layout, part_fields=(), **RUN) for layout in layouts]


def train_model_layouts(model: str, layouts: list[str]) -> list[dict]:
    """``train_layouts`` of another preset (``tiny-dsv3``: tests/run/test_mla_parity.py)."""
    return [train_layout(layout, part_fields=(), **{**RUN, "model": model}) for layout in layouts]


def assert_same_training(result: dict, reference: dict, layout: str, loss_rtol: float, param_atol: float) -> None:
    """A layout's run (``train_model_layouts``) against the single-process ``reference``: losses and
    gradient norms within ``loss_rtol``, every parameter within ``param_atol`` (test_mla_parity.py,
    test_gpt_oss_parity.py)."""
    for key in ("losses", "grad_norms"):
        for step, (got, want) in enumerate(zip(result[key], reference[key], strict=True)):
            assert abs(got - want) <= loss_rtol * abs(want), f"{layout}: step {step} {key} {got} vs {want}"
    params = result["params"]
    assert set(params) == set(reference["params"]), f"{layout}: parameter names differ"
    worst = max(((params[name] - value).abs().max().item(), name) for name, value in reference["params"].items())
    assert worst[0] <= param_atol, f"{layout}: parameter {worst[1]} differs by {worst[0]:.3g}"


# MoESpec changes of the variants the tests train (tiny-moe's sizes)
VARIANTS = {
    "capped": {"capacity_factor": 1.0},  # token dropping
    "deepseek": {"router": "sigmoid", "n_groups": 4, "topk_groups": 2, "route_scale": 2.5},  # bias-balanced
}


def train_variant(variant: str, layouts: list[str], **kwargs) -> list[dict]:
    """Steps, losses and gradient norms of ``tiny-moe`` with ``VARIANTS[variant]``, per layout;
    ``kwargs``: ``checkpoint_tasks.train``'s (stop_after, checkpoint_dir=, resume_from=, ...)."""
    import dataclasses

    spec = get_model(MODEL)
    model = dataclasses.replace(spec, moe=dataclasses.replace(spec.moe, **VARIANTS[variant]))
    with patched_model(model):
        return [checkpoint_tasks.train(layout, with_params=False, **RUN, **kwargs) for layout in layouts]


@contextlib.contextmanager
def patched_model(model):
    """``runtime_tasks.make_config`` builds its job with ``model`` whatever name it is given."""
    original = runtime_tasks.get_model
    runtime_tasks.get_model = lambda name: model
    try:
        yield
    finally:
        runtime_tasks.get_model = original


def reference() -> dict:
    """The single-process run of ``tiny-moe``."""
    return in_one_process(train_layout, "dp=1", part_fields=(), **RUN)


def expert_weight_placement(layout: str) -> dict:
    """The placement and local shape of layer 1's ``experts.w1`` on this rank under ``layout``."""
    import torch

    from plait.run.parallel.mesh import build_parallel_dims
    from plait.run.parallel.parallelize import build_model_parts
    from plait.spec.layout import Layout
    from plait.spec.models import get_model

    lay = Layout.parse(layout)
    parts = build_model_parts(get_model(MODEL), build_parallel_dims(lay, "cpu"), torch.device("cpu"), 0,
                              lay.micro_batches(GLOBAL_BATCH))
    weight = dict(parts.named_parameters())["layers.1.feed_forward.experts.w1"]
    return {"mesh": list(weight.device_mesh.mesh_dim_names), "placements": [str(p) for p in weight.placements],
            "local": tuple(weight.to_local().shape)}


def resume_across_ep(root: str, layouts: tuple[str, str, str]) -> list[dict]:
    """Step 0 under ``layouts[0]`` (checkpoint at step 1), step 1 under ``layouts[1]`` resumed from it
    (checkpoint at step 2), step 2 under ``layouts[2]`` resumed from that: the three runs' reports."""
    from plait.run.checkpoint import store

    out, resume = [], None
    for index, layout in enumerate(layouts):
        folder = os.path.join(root, f"run{index}")
        extra = {"resume_from": resume} if resume else {}
        last = index == len(layouts) - 1
        out.append(checkpoint_tasks.train(layout, stop_after=None if last else 1, with_params=last,
                                          checkpoint_dir=folder, **RUN, **extra))
        resume = os.path.join(folder, store.final_name(index + 1))
    return out


def expert_axes(layouts: list[str]) -> list[dict]:
    """Per layout: this rank's ep and edp groups (global ranks) and its sizes and index on the
    ParallelDims axes, read from the one mesh (``plait.run.parallel.mesh``)."""
    import torch.distributed as dist

    from plait.run.parallel.mesh import build_parallel_dims
    from plait.spec.layout import Layout

    out = []
    for text in layouts:
        pdims = build_parallel_dims(Layout.parse(text), "cpu")
        axes = {name: {"size": pdims.size(name), "index": pdims.rank_in(name)} for name in ("ep", "edp")}
        for name in ("ep", "edp"):
            axes[name]["ranks"] = dist.get_process_group_ranks(pdims.group(name))
            axes[name]["axis"] = pdims.axis(name).mesh.tolist()
        out.append(axes)
    return out


def dense_expert_axes(layout: str) -> dict:
    """With ep = 1: the sizes ``ParallelDims`` gives the expert axes, and what asking for a group says."""
    from plait.run.parallel.mesh import build_parallel_dims
    from plait.spec.layout import Layout

    pdims = build_parallel_dims(Layout.parse(layout), "cpu")
    try:
        pdims.group("ep")
        refusal = None
    except ValueError as exc:
        refusal = str(exc)
    return {"ep": pdims.size("ep"), "edp": pdims.size("edp"), "refusal": refusal, "expert_mesh": pdims.expert_mesh}


def train_model_layout_pairs(pairs: list[tuple[str, str]]) -> list[dict]:
    """``train_layout`` of each (preset, layout) in order: several models in one pool round trip
    (tests/run/test_moe_split_parity.py)."""
    return [train_layout(layout, part_fields=("notes",), **{**RUN, "model": model}) for model, layout in pairs]
