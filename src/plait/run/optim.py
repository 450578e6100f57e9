"""AdamW, the learning-rate schedule, and gradient clipping by the true global norm.

The global norm is the 2-norm of the gradient of the *whole* model, however it is split:
each rank sums the squares of the gradient elements it owns, the partial sums are added
over every mesh dimension that shards them (FSDP's dp_shard, or dp_shard×cp with context
parallelism, tensor parallel, and pipeline stages, which own disjoint layers), and replicated
copies (dp_replicate, and the cp ranks under DDP) are counted once.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate

from plait.run.config import OptimConfig
from plait.run.parallel.mesh import ParallelDims


def lr_at(step: int, total_steps: int, config: OptimConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    decay_steps = max(1, total_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / decay_steps)
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(params: list[torch.nn.Parameter], config: OptimConfig) -> torch.optim.Optimizer:
    """AdamW; matrices decay, vectors (norms, biases) do not."""
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    meshes = {p.device_mesh for p in params if isinstance(p, DTensor)}
    mixed = bool(meshes) and (len(meshes) > 1 or any(not isinstance(p, DTensor) for p in params))
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps,
                             foreach=False if mixed else None)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _sharded_dims(grad: DTensor) -> tuple[str, ...]:
    """Names of the mesh dimensions along which ``grad``'s local pieces must be summed."""
    names = grad.device_mesh.mesh_dim_names
    if names is None:
        raise ValueError("gradient DTensor on a mesh without dimension names")
    out = []
    for name, placement in zip(names, grad.placements):
        if not placement.is_replicate():  # Shard, FSDP2+TP's strided shard (Partial is reduced before)
            out.append(name)
    return tuple(out)


def global_grad_norm(params: list[torch.nn.Parameter], pdims: ParallelDims) -> torch.Tensor:
    """2-norm of the full model's gradient, the same value on every rank (fp32 scalar)."""
    device = next(iter(params)).device if params else torch.device("cpu")
    by_dims: dict[tuple, torch.Tensor] = {}
    for p in params:
        if p.grad is None:
            continue
        grad = p.grad
        if isinstance(grad, DTensor):
            if any(isinstance(p, Partial) for p in grad.placements):
                # pending sums (e.g. sequence-parallel norm weights): ‖Σg‖² is not Σ‖g‖²; reduce first
                grad = grad.redistribute(grad.device_mesh, [Replicate() if isinstance(p, Partial) else p
                                                            for p in grad.placements])
            key = tuple(grad.device_mesh[name].get_group() for name in _sharded_dims(grad))
            local = grad.to_local()
        else:
            key = ()
            local = grad
        square = local.detach().float().pow(2).sum()
        by_dims[key] = by_dims.get(key, torch.zeros((), device=device)) + square
    total = torch.zeros((), device=device)
    for groups, square in by_dims.items():
        for group in groups:
            dist.all_reduce(square, group=group)
        total += square
    if pdims.layout.pp > 1:
        dist.all_reduce(total, group=pdims.group("pp"))
    return total.sqrt()


@torch.no_grad()
def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float, pdims: ParallelDims) -> float:
    """Scale gradients so their global norm is at most ``max_norm``; returns the norm before."""
    norm = float(global_grad_norm(params, pdims))
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale)
    return norm
