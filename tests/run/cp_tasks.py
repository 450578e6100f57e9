"""Task bodies for the context-parallel tests, run on every rank of a DistPool.

``attention_errors`` checks one cp attention kernel against full causal attention computed on
every rank from the same seeded tensors: the output and the gradients of q, k and v, each
compared on the rank's own (head-tail sharded) tokens.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from plait.run.parallel.context.ring import cp_kernel
from plait.run.parallel.context.shard import SequenceShard


def _full_problem(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, seed: int):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator)

    return (draw(batch, heads, seq, head_dim), draw(batch, kv_heads, seq, head_dim),
            draw(batch, kv_heads, seq, head_dim), draw(batch, heads, seq, head_dim))


def attention_errors(impl: str, heads: int = 4, kv_heads: int = 2, seq: int = 32, head_dim: int = 8,
                     batch: int = 2, seed: int = 0) -> dict[str, float]:
    """Max abs difference of output and q/k/v gradients between the cp kernel ``impl`` over the
    whole pool and full causal attention (computed here, in fp32), on this rank's tokens."""
    q, k, v, grad_out = _full_problem(batch, heads, kv_heads, seq, head_dim, seed)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=heads != kv_heads)
    want.backward(grad_out)

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    shard = SequenceShard(mesh.get_local_rank(), mesh.size())
    local = [shard.shard(t, dim=2).clone().requires_grad_() for t in (q, k, v)]
    # the kernel receives q as the model gives it: a transposed, non-contiguous view
    q_local = local[0].transpose(1, 2).contiguous().transpose(1, 2)
    got = cp_kernel(impl, mesh)(q_local, local[1], local[2], 0.0)
    got.backward(shard.shard(grad_out, dim=2).transpose(1, 2).contiguous().transpose(1, 2))

    errors = {"out": (got.detach() - shard.shard(want.detach(), dim=2)).abs().max().item()}
    for name, mine, ref in zip("qkv", local, full):
        errors["d" + name] = (mine.grad - shard.shard(ref.grad, dim=2)).abs().max().item()
    errors["scale"] = max(ref.grad.abs().max().item() for ref in full)  # the gradients are not ~0
    errors["inputs"] = max(t.abs().max().item() for t in (q, k, v, grad_out))  # the magnitude the sums see
    return errors



def exchange_log(impl: str, heads: int = 8, kv_heads: int = 4, seq: int = 32, head_dim: int = 8,
                 batch: int = 2) -> list[tuple[str, str, int]]:
    """(phase, op, bytes) of every collective the cp kernel ``impl`` makes on this rank in one
    forward and backward (``plait.plan.context.exchange.Exchange``'s byte conventions: a message for
    send_recv, the whole gathered buffer for all_gather / reduce_scatter, the rank's buffer for
    all_to_all), counted by wrapping the torch.distributed functions the kernels call."""
    log: list[tuple[str, str, int]] = []
    phase = ["forward"]

    def p2p(ops, *args, **kwargs):
        log.extend((phase[0], "send_recv", op.tensor.nbytes) for op in ops if op.op is dist.isend)
        return originals["batch_isend_irecv"](ops, *args, **kwargs)

    def gather(pieces, tensor, *args, **kwargs):
        log.append((phase[0], "all_gather", tensor.nbytes * len(pieces)))
        return originals["all_gather"](pieces, tensor, *args, **kwargs)

    def scatter(output, pieces, *args, **kwargs):
        log.append((phase[0], "reduce_scatter", sum(piece.nbytes for piece in pieces)))
        return originals["reduce_scatter"](output, pieces, *args, **kwargs)

    def all_to_all(output, tensor, *args, **kwargs):
        log.append((phase[0], "all_to_all", tensor.nbytes))
        return originals["all_to_all_single"](output, tensor, *args, **kwargs)

    wrappers = {"batch_isend_irecv": p2p, "all_gather": gather, "reduce_scatter": scatter,
                "all_to_all_single": all_to_all}
    originals = {name: getattr(dist, name) for name in wrappers}
    q, k, v, grad_out = _full_problem(batch, heads, kv_heads, seq, head_dim, seed=0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    shard = SequenceShard(mesh.get_local_rank(), mesh.size())
    local = [shard.shard(t, dim=2).clone().requires_grad_() for t in (q, k, v)]
    kernel = cp_kernel(impl, mesh)
    for name, wrapper in wrappers.items():
        setattr(dist, name, wrapper)
    try:
        out = kernel(*local, 0.0)
        phase[0] = "backward"
        out.backward(shard.shard(grad_out, dim=2))
    finally:
        for name, function in originals.items():
            setattr(dist, name, function)
    return log


def ring_score_elements(heads: int = 8, kv_heads: int = 4, seq: int = 32, head_dim: int = 8,
                        batch: int = 2) -> dict[str, int]:
    """{"forward", "backward"}: score elements the ring kernel materializes on this rank in one
    forward and backward (every block's scores, counted where ``plait.run.parallel.context.ops``
    makes them)."""
    from plait.run.parallel.context import ops

    counts = {"forward": 0, "backward": 0}
    phase = ["forward"]
    original = ops._scores

    def scores(*args, **kwargs):
        out = original(*args, **kwargs)
        counts[phase[0]] += out[0].numel()  # (scores, tanh of the soft-cap or None)
        return out

    q, k, v, grad_out = _full_problem(batch, heads, kv_heads, seq, head_dim, seed=0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    shard = SequenceShard(mesh.get_local_rank(), mesh.size())
    local = [shard.shard(t, dim=2).clone().requires_grad_() for t in (q, k, v)]
    ops._scores = scores
    try:
        out = cp_kernel("ring", mesh)(*local, 0.0)
        phase[0] = "backward"
        out.backward(shard.shard(grad_out, dim=2))
    finally:
        ops._scores = original
    return counts
