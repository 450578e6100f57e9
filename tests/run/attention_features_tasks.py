"""Task bodies for the attention-feature parity tests, run on every rank of a DistPool (and, for
the reference, in one process): the tiny model with Gemma-2's and GPT-OSS's attention options on.

``FEATURES``: soft-capped scores (c = 5: the tiny model's scores reach it), a sliding window of
8 tokens on the even layers (0 and 2; the odd ones attend globally), a score scale other than
1/sqrt(head_dim) and one sink logit per head (initialized like the weights, N(0, 0.02²)).
"""

from __future__ import annotations

import dataclasses

import runtime_tasks
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from plait.run.modules.documents import document_ids
from plait.run.modules.layers import eager_attention
from plait.run.parallel.context.ring import cp_kernel
from plait.run.parallel.context.shard import SequenceShard
from plait.spec.models import get_model

FEATURES = dict(attn_softcap=5.0, sliding_window=8, local_layers="even", attn_scale=0.3, sinks=True)


def feature_model():
    return dataclasses.replace(get_model("tiny"), name="tiny-attn-features", **FEATURES)


def train_features(layout: str) -> dict:
    """``runtime_tasks.train_config`` of the feature model under ``layout`` (3 AdamW steps, 8 × 32 tokens)."""
    config = runtime_tasks.make_config(layout)
    config = dataclasses.replace(config, job=dataclasses.replace(config.job, model=feature_model()))
    return runtime_tasks.train_config(config)


def reference() -> dict:
    return runtime_tasks.in_one_process(train_features, "dp=1,attn=eager")


def kernel_errors(impl: str, window: int, softcap: float, sinks: bool, documents: bool = False,
                  scale: float | None = 0.3, heads: int = 4, kv_heads: int = 2, seq: int = 64, head_dim: int = 8,
                  batch: int = 2) -> dict:
    """Max abs difference of output and q/k/v (and sink) gradients between the cp kernel ``impl``
    with the options and the eager kernel on the whole sequence, on this rank's tokens; and the
    forward without gradients (where the CPU runs FlexAttention in the all-gather kernel)."""
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(batch, heads, seq, head_dim, generator=generator)
    k, v = (torch.randn(batch, kv_heads, seq, head_dim, generator=generator) for _ in range(2))
    grad_out = torch.randn(batch, heads, seq, head_dim, generator=generator)
    sink = torch.randn(heads, generator=generator) if sinks else None
    options = dict(window=window, scale=scale, softcap=softcap)
    if documents:  # packed documents of ~10 tokens (id 0 ends one), the rows' ids whole on every rank
        options["documents"] = document_ids(torch.randint(0, 10, (batch, seq), generator=generator), 0)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    full_sink = None if sink is None else sink.clone().requires_grad_()
    want = eager_attention(*full, 0.0, sinks=full_sink, **options)
    want.backward(grad_out)

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    shard = SequenceShard(mesh.get_local_rank(), mesh.size())
    local = [shard.shard(t, dim=2).clone().requires_grad_() for t in (q, k, v)]
    local_sink = None if sink is None else sink.clone().requires_grad_()
    kernel = cp_kernel(impl, mesh)
    got = kernel(*local, 0.0, sinks=local_sink, **options)
    got.backward(shard.shard(grad_out, dim=2))
    with torch.no_grad():
        no_grad = kernel(*(t.detach() for t in local), 0.0, sinks=sink, **options)

    mine = shard.shard(want.detach(), dim=2)
    errors = {"out": (got.detach() - mine).abs().max().item(), "no_grad": (no_grad - mine).abs().max().item()}
    for name, part, ref in zip("qkv", local, full):
        errors["d" + name] = (part.grad - shard.shard(ref.grad, dim=2)).abs().max().item()
    if sink is not None:  # each rank's share of the sink gradient: summed over the ranks, the whole
        total = local_sink.grad.clone()
        dist.all_reduce(total)
        errors["dsinks"] = (total - full_sink.grad).abs().max().item()
    errors["scale"] = max(ref.grad.abs().max().item() for ref in full)
    errors["inputs"] = max(t.abs().max().item() for t in (q, k, v, grad_out))
    return errors
