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

