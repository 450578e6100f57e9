"""Task bodies of the document-mask tests (tests/run/test_doc_mask.py), run on every rank of a DistPool.

``packed_file`` writes a token file of short documents (each closed by ``EOS``, the id recorded in
its header) so that every training row of 32 tokens cuts through several of them.
``train_packed`` trains the tiny model on it with ``--doc-mask`` under a layout, as
``runtime_tasks.train_layout`` does. ``kernel_errors`` checks one cp attention kernel with
document ids against SDPA with the whole rows' boolean mask, on the rank's own tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

import runtime_tasks
from plait.run.data.token_format import TokenWriter
from plait.run.modules.documents import row_mask
from plait.run.parallel.context.ring import cp_kernel
from plait.run.parallel.context.shard import SequenceShard

EOS = 3  # the end-of-text id of the packed files
VOCAB = 512  # the tiny model's


def document_lengths(n_docs: int, seed: int, longest: int = 12) -> np.ndarray:
    """Tokens of each document (its end-of-text included), 1..longest."""
    return np.random.default_rng(seed).integers(1, longest + 1, n_docs)


def packed_tokens(lengths, seed: int) -> np.ndarray:
    """Documents of ``lengths`` back to back: random ids other than EOS, each closed by EOS."""
    rng = np.random.default_rng([seed, 1])
    parts = [np.append(rng.integers(EOS + 1, VOCAB, n - 1), EOS) for n in lengths]
    return np.concatenate(parts)


def packed_file(path: str, n_docs: int = 400, seed: int = 0) -> int:
    """Write the packed token file; returns its mean document length (tokens)."""
    lengths = document_lengths(n_docs, seed)
    with TokenWriter(path, VOCAB, "test-docs", eos_id=EOS) as writer:
        writer.append(packed_tokens(lengths, seed))
    return int(round(lengths.mean()))


def train_packed(layout: str, path: str, **kwargs) -> dict:
    """``runtime_tasks.train_layout`` on the packed file with --doc-mask (2 steps)."""
    config = runtime_tasks.make_config(layout, data=path, **{"steps": 2, **kwargs})
    config = dataclasses.replace(config, job=dataclasses.replace(config.job, doc_mask=True, eos_id=EOS, doc_len=7))
    return runtime_tasks.train_config(config)


def reference_packed(path: str, **kwargs) -> dict:
    """The single-process doc-masked run."""
    return runtime_tasks.in_one_process(train_packed, "dp=1", path, **kwargs)


def kernel_errors(impl: str, heads: int = 4, kv_heads: int = 2, seq: int = 32, head_dim: int = 8,
                  batch: int = 2, seed: int = 0) -> dict[str, float]:
    """Max abs difference of output and q/k/v gradients between the cp kernel ``impl`` given the
    rows' document ids and SDPA over the whole rows with their boolean mask, on this rank's tokens."""
    generator = torch.Generator().manual_seed(seed)
    q, grad_out = (torch.randn(batch, heads, seq, head_dim, generator=generator) for _ in range(2))
    k, v = (torch.randn(batch, kv_heads, seq, head_dim, generator=generator) for _ in range(2))
    rows = torch.from_numpy(packed_tokens(document_lengths(64, seed), seed)[: batch * seq]).view(batch, seq)
    from plait.run.modules.documents import document_ids

    documents = document_ids(rows, EOS)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*full, attn_mask=row_mask(documents), enable_gqa=heads != kv_heads)
    want.backward(grad_out)

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    shard = SequenceShard(mesh.get_local_rank(), mesh.size())
    local = [shard.shard(t, dim=2).clone().requires_grad_() for t in (q, k, v)]
    got = cp_kernel(impl, mesh)(*local, 0.0, documents=documents)
    got.backward(shard.shard(grad_out, dim=2))
    errors = {"out": (got.detach() - shard.shard(want.detach(), dim=2)).abs().max().item()}
    for name, mine, ref in zip("qkv", local, full):
        errors["d" + name] = (mine.grad - shard.shard(ref.grad, dim=2)).abs().max().item()
    errors["scale"] = max(ref.grad.abs().max().item() for ref in full)
    errors["inputs"] = max(t.abs().max().item() for t in (q, k, v, grad_out))
    errors["documents"] = int(documents.max()) + 1  # documents in the first row... at least several
    return errors


def reference_unmasked(path: str) -> dict:
    """The single-process run on the packed file without --doc-mask (attention across documents)."""
    from plait.run.trainer import run_training

    def train():
        result = run_training(runtime_tasks.make_config("dp=1", data=path, steps=2), device=torch.device("cpu"))
        return {"losses": [r.loss for r in result.records]}

    return runtime_tasks.in_one_process(train)
