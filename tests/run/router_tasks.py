"""Task body of the router-health test (tests/run/test_router_health.py), run on every rank of a DistPool."""

from __future__ import annotations

import dataclasses

import runtime_tasks
from moe_tasks import patched_model

from plait.spec.models import get_model

STEPS, GLOBAL_BATCH, SEQ = 2, 4, 32  # 4 micro-batches of one sequence (mbs=1)


def health_model():
    """``tiny-moe`` (3 MoE layers of 8 experts, top-2) with the sigmoid router and a capacity of 1.0: every
    router-health field has something to show (drops, the bias spread after the first step)."""
    spec = get_model("tiny-moe")
    return dataclasses.replace(spec, moe=dataclasses.replace(spec.moe, router="sigmoid", capacity_factor=1.0))


def router_records(layout: str) -> dict:
    """One run of ``health_model`` under ``layout``: the step records' router fields, and every training
    forward's routing as this rank's routers computed it: (step, layer, expert ids, probabilities)."""
    import torch

    from plait.run import step as step_module
    from plait.run.modules.moe import MoEFeedForward
    from plait.run.trainer import run_training

    routed, steps = [], [0]
    route, balance = MoEFeedForward.route, step_module.balance_routers

    def recording_route(self, x):
        out = route(self, x)
        if self.counting():
            probs, _, ids, _ = out
            routed.append((steps[0], self.layer, ids.detach().clone(), probs.detach().clone()))
        return out

    def counting_balance(*args, **kwargs):
        balance(*args, **kwargs)
        steps[0] += 1

    MoEFeedForward.route, step_module.balance_routers = recording_route, counting_balance
    try:
        with patched_model(health_model()):
            config = runtime_tasks.make_config(layout, steps=STEPS, global_batch=GLOBAL_BATCH, seq_len=SEQ)
            result = run_training(config, device=torch.device("cpu"))
    finally:
        MoEFeedForward.route, step_module.balance_routers = route, balance
    return {"router": [r.router for r in result.records], "routed": routed}
