"""Task bodies for the counted-memory tests (run on every rank of a DistPool, or in one process)."""

from __future__ import annotations

import torch

from runtime_tasks import make_config


def train_summary(layout: str, **kwargs) -> dict:
    """Train the tiny model on the CPU with ``layout``; this rank's train summary (as the JSONL writes it)."""
    from plait.run.trainer import run_training

    return run_training(make_config(layout, **kwargs), device=torch.device("cpu")).summary.to_dict()
