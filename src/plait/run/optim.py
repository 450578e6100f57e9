"""AdamW, the learning-rate schedule, and gradient clipping by the true global norm.

The global norm is the 2-norm of the gradient of the *whole* model, however it is split:
each rank sums the squares of the gradient elements it owns, the partial sums are added
over every mesh dimension that shards them (FSDP's dp_shard, or dp_shard×cp with context
parallelism, tensor parallel, and pipeline stages, which own disjoint layers), and replicated
copies (dp_replicate, and the cp ranks under DDP) are counted once. Pending sums (Partial
placements) are reduced before they are squared.

Everything runs as a fixed number of ops per group of gradients with the same (mesh, pending
dims, sharded dims), whatever the number of tensors: ``_foreach_norm`` over the group's local
pieces, one all-reduce per sharded dimension, and ``_foreach_mul_`` by the clip factor, which
is computed on the device (the norm is never read on the host here). AdamW is fused (one
kernel per parameter group), with one group per (mesh, decay).

**Learning-rate schedules** (``--lr-schedule``; ``lr_at`` is a pure function of the step, so a run
resumed at any step gets the same rates). Steps are 0-based optimizer steps of a run of
``T = total_steps``; ``W`` is ``warmup_steps``, ``lr`` the peak and ``floor``
``OptimConfig.floor_lr`` (``--min-lr``, default 10% of lr).

* warm-up (every schedule): step ``s < W`` has ``lr·(s+1)/W``.
* ``cosine`` (the default): ``floor + (lr − floor)·½·(1 + cos(π·p))`` with ``p = (s − W)/(T − W)``.
* ``linear``: ``floor + (lr − floor)·(1 − p)``, the same ``p``.
* ``wsd`` (warm-up, stable, decay): ``lr`` until the decay starts at ``D = max(W, T − n)``, where
  ``n = round(decay_fraction·T)`` steps (at least 1), then linear to the floor with
  ``p = (s − D + 1)/(T − D)``.
* ``constant``: ``lr`` after the warm-up.

Cosine and linear (plait's original convention): ``p`` is 0 at the first step after the warm-up and
would reach 1 at step ``T``, one past the last, so the last step's rate is one decay increment
above the floor. WSD's stable phase already runs at ``lr``, so its decay steps each step down: the
first decay step is one increment below ``lr`` and the last step (``s = T − 1``) is at the floor.
``p`` is clamped to 1: a step past ``T`` (a resumed run given fewer steps) stays at the floor.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial

from plait.run.config import OptimConfig
from plait.run.parallel.mesh import ParallelDims


def decay_start(total_steps: int, config: OptimConfig) -> int:
    """First step of the decay (0-based): after the warm-up, or for ``wsd`` the last
    ``decay_fraction`` of the steps (rounded to the nearest step, at least one)."""
    if config.schedule != "wsd":
        return config.warmup_steps
    decay_steps = max(1, round(config.decay_fraction * total_steps))
    return max(config.warmup_steps, total_steps - decay_steps)


def lr_at(step: int, total_steps: int, config: OptimConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based) of a run of ``total_steps`` steps."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return config.lr
    start = decay_start(total_steps, config)
    if step < start:  # wsd: the stable phase
        return config.lr
    done = step - start + (1 if config.schedule == "wsd" else 0)  # decay steps taken, this one included for wsd
    progress = min(1.0, done / max(1, total_steps - start))
    floor = config.floor_lr
    if config.schedule == "cosine":
        return floor + (config.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (config.lr - floor) * (1.0 - progress)  # linear, and wsd's decay


def decays(name: str, param: torch.Tensor) -> bool:
    """Whether AdamW's weight decay applies to parameter ``name``: matrices (and the experts' stacked
    weight matrices) decay; vectors - norm weights, biases, attention sinks - do not, and neither do the
    experts' biases, which are 2-D only because they are stacked over the experts (``w1_bias`` (E, f)),
    as in GPT-OSS's own training code and transformers' trainer (no decay for any ``bias``)."""
    return param.ndim >= 2 and not name.rpartition(".")[2].endswith("bias")


def build_optimizer(named_params: list[tuple[str, torch.nn.Parameter]], config: OptimConfig) -> torch.optim.Optimizer:
    """AdamW, fused (one kernel per parameter group; foreach where fused is not supported) over
    ``named_params`` (module-path name, parameter); what decays is ``decays``'s rule.

    One parameter group per (mesh, decay): a fused or foreach kernel takes a list of tensors that
    must all be plain tensors or all DTensors on one mesh, so parameters on several meshes (or
    some on none) get a group each, and every group still runs as one kernel.
    """
    groups: dict[tuple, list[torch.nn.Parameter]] = {}
    for name, p in named_params:
        groups.setdefault((_mesh_of(p), decays(name, p)), []).append(p)
    param_groups = [{"params": members, "weight_decay": config.weight_decay if decay else 0.0}
                    for (_, decay), members in groups.items()]
    kwargs = {"lr": config.lr, "betas": (config.beta1, config.beta2), "eps": config.eps}
    try:
        return torch.optim.AdamW(param_groups, fused=True, **kwargs)
    except RuntimeError:  # no fused kernel for this device type or dtype
        return torch.optim.AdamW(param_groups, foreach=True, **kwargs)


def _mesh_of(tensor: torch.Tensor):
    """The DeviceMesh of a DTensor (meshes compare by value: equal meshes share a group), else None."""
    return tensor.device_mesh if isinstance(tensor, DTensor) else None


def place_step_counters(optimizer: torch.optim.Optimizer) -> None:
    """Fused AdamW keeps each parameter's step counter on the parameter's device (fp32); move the
    counters of a loaded checkpoint there (they were created or saved on the host)."""
    for group in optimizer.param_groups:
        if not group.get("fused"):
            continue
        for param in group["params"]:
            state = optimizer.state.get(param)
            if state and "step" in state:
                state["step"] = state["step"].to(device=param.device, dtype=torch.float32)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _grad_groups(params: list[torch.nn.Parameter]) -> dict[tuple, list[torch.Tensor]]:
    """Local gradient pieces keyed by (mesh, names of the mesh dims with pending sums, names of
    the mesh dims that shard them); plain tensors under (None, (), ())."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        grad = p.grad
        if grad is None:
            continue
        if isinstance(grad, DTensor):
            names = grad.device_mesh.mesh_dim_names
            if names is None:
                raise ValueError("gradient DTensor on a mesh without dimension names")
            partial = tuple(n for n, pl in zip(names, grad.placements) if isinstance(pl, Partial))
            # Shard, FSDP2+TP's strided shard; Partial is summed before the squares are
            sharded = tuple(n for n, pl in zip(names, grad.placements)
                            if not pl.is_replicate() and not isinstance(pl, Partial))
            key = (grad.device_mesh, partial, sharded)
            local = grad.to_local()
        else:
            key, local = (None, (), ()), grad
        groups.setdefault(key, []).append(local)
    return groups


def _process_group(mesh, name: str) -> dist.ProcessGroup:
    """The process group of ``mesh``'s dimension ``name`` (looked up by name: no mesh slicing)."""
    return mesh.get_group(name)


def _sum_of_squares(key: tuple, pieces: list[torch.Tensor]) -> torch.Tensor:
    """Σ of the squared elements this rank's ``pieces`` (one group of ``_grad_groups``) stand for,
    after their pending sums (a constant number of ops and collectives per group)."""
    mesh, partial, _ = key
    if partial:
        # pending sums (e.g. sequence-parallel norm weights): ‖Σg‖² is not Σ‖g‖²; reduce first
        flat = torch.cat(pieces if all(piece.ndim == 1 for piece in pieces)  # norm weights: no views
                         else [piece.reshape(-1) for piece in pieces]).float()
        for name in partial:
            dist.all_reduce(flat, group=_process_group(mesh, name))
        return flat.square().sum()
    norms = torch._foreach_norm(pieces, 2, dtype=torch.float32)
    return torch.stack(norms).square().sum()


@torch.no_grad()
def global_grad_norm(params: list[torch.nn.Parameter], pdims: ParallelDims,
                     groups: dict[tuple, list[torch.Tensor]] | None = None) -> torch.Tensor:
    """2-norm of the full model's gradient, the same value on every rank (0-d fp32 tensor on the
    parameters' device; no host read). ``groups``: ``_grad_groups(params)`` when already built."""
    groups = _grad_groups(params) if groups is None else groups
    device = next(iter(params)).device if params else torch.device("cpu")
    by_process_groups: dict[tuple, torch.Tensor] = {}
    for key, pieces in groups.items():
        mesh, _, sharded = key
        process_groups = tuple(_process_group(mesh, name) for name in sharded)
        square = _sum_of_squares(key, pieces)
        total = by_process_groups.get(process_groups)
        by_process_groups[process_groups] = square if total is None else total + square
    total = torch.zeros((), device=device)
    for process_groups, square in by_process_groups.items():
        for group in process_groups:
            dist.all_reduce(square, group=group)
        total += square
    if pdims.layout.pp > 1:
        dist.all_reduce(total, group=pdims.group("pp"))
    return total.sqrt()


@torch.no_grad()
def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float, pdims: ParallelDims) -> torch.Tensor:
    """Scale gradients so their global norm is at most ``max_norm`` (≤ 0: no clipping); returns
    the norm before (a 0-d device tensor, never read on the host here).

    The scale ``min(1, max_norm / (norm + 1e-6))`` is computed on the device and applied with
    one ``_foreach_mul_`` per gradient group, as ``torch.nn.utils.clip_grads_with_norm_`` does; a
    non-finite norm makes every gradient non-finite (--on-nan then stops or skips the step).
    """
    groups = _grad_groups(params)
    norm = global_grad_norm(params, pdims, groups)
    if max_norm > 0 and groups:
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for pieces in groups.values():
            torch._foreach_mul_(pieces, scale)
    return norm
