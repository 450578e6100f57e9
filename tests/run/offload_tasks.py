"""Task bodies for tests/run/test_offload.py: train the tiny model with a layout (one process or a
DistPool) and return losses, gradient norms, parameters and the activation-offload counters."""

from __future__ import annotations

import torch
import torch.distributed as dist
from runtime_tasks import full_parameters, in_one_process, make_config


def train(layout: str, **kwargs) -> dict:
    """Train on this rank; {'losses', 'grad_norms', 'offloaded', 'offload', 'summary'} (+ 'params' on rank 0)."""
    from plait.run.trainer import run_training

    result = run_training(make_config(layout, **kwargs), device=torch.device("cpu"))
    params = full_parameters(result.parts)
    out = {"losses": [r.loss for r in result.records], "grad_norms": [r.grad_norm for r in result.records],
           "offloaded": result.parts.offloaded, "offload": [r.offload for r in result.records],
           "summary": result.summary.to_dict()}
    if dist.get_rank() == 0:
        out["params"] = params
    return out


def one_process(layout: str, **kwargs) -> dict:
    """``train`` in a one-rank process group of its own, in this process."""
    return in_one_process(train, layout, **kwargs)
