"""Task bodies for tests/run/test_host_syncs.py: count, per training step, the host reads of tensor
values and the collectives the loop issues, and the aten ops of gradient clipping plus AdamW.

``count_step_syncs`` trains with a ``TorchDispatchMode`` active and ``torch.Tensor``'s host-read
methods wrapped. A host read is ``aten._local_scalar_dense`` (what ``item``, ``float``, ``int``
and ``bool`` of a tensor dispatch to) or a call of ``Tensor.item``/``__float__``/``__int__``/
``__bool__``/``tolist``/``numpy``/``cpu``: on a GPU each is a device-to-host copy the host waits
for. A collective is an op of the ``c10d`` or ``_c10d_functional`` namespaces (``dist.all_reduce``
and DTensor's redistributions dispatch them). Collectives issued inside ``forward_backward``
(DDP's gradient all-reduce, tensor-parallel communication) and ``clip_grad_norm`` (the norm's
sums over shards) are the training's math and counted apart; the rest are the loop's own.
Step boundaries come from the fault-injection hook at "before-step". Reads made by DeviceMesh's
own code are not counted: they read its rank map, a host tensor on every device.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

READ_METHODS = ("item", "__float__", "__int__", "__bool__", "tolist", "numpy", "cpu")
WAITS = ("wait_tensor",)
MESH_FILE = os.path.join("torch", "distributed", "device_mesh.py")


def _device_mesh_bookkeeping() -> bool:
    """Whether DeviceMesh's own code is reading (its rank map, a host tensor on every device)."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(MESH_FILE):
            return True
        frame = frame.f_back
    return False


class StepCounter(TorchDispatchMode):
    """Host reads and collectives per step (``None``: before the first step)."""

    def __init__(self):
        super().__init__()
        self.step: int | None = None
        self.math = 0  # > 0 inside forward_backward / clip_grad_norm
        self.reads: Counter = Counter()
        self.loop_collectives: Counter = Counter()
        self.math_collectives: Counter = Counter()
        self.what: dict[int, list[str]] = {}

    def read(self, name: str) -> None:
        if self.step is not None and not _device_mesh_bookkeeping():
            self.reads[self.step] += 1
            self.what.setdefault(self.step, []).append(name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.read("aten._local_scalar_dense")
        namespace = func.namespace
        if self.step is not None and namespace in ("c10d", "_c10d_functional") and func._opname not in WAITS:
            (self.math_collectives if self.math else self.loop_collectives)[self.step] += 1
            if not self.math:
                self.what.setdefault(self.step, []).append(str(func))
        return func(*args, **(kwargs or {}))


class MarkSteps:
    """In place of the run's FaultPlan: no faults; tells the counter where each step begins."""

    def __init__(self, counter: StepCounter):
        self.counter = counter

    def at(self, step, point, loss=None):
        if point == "before-step":
            self.counter.step = step
        return loss


class Never:
    """A SIGTERM event that is never set (the loop still polls and reduces the flag)."""

    def is_set(self) -> bool:
        return False


def _patched(counter: StepCounter, originals: dict):
    def wrap(name):
        original = originals[name]

        def method(self, *args, **kwargs):
            counter.read(f"Tensor.{name}")
            return original(self, *args, **kwargs)

        return method

    for name in READ_METHODS:
        setattr(torch.Tensor, name, wrap(name))


def _mark_math(counter: StepCounter, step_module):
    originals = {name: getattr(step_module, name) for name in ("forward_backward", "clip_grad_norm")}

    def wrap(function):
        def inner(*args, **kwargs):
            counter.math += 1
            try:
                return function(*args, **kwargs)
            finally:
                counter.math -= 1

        return inner

    for name, function in originals.items():
        setattr(step_module, name, wrap(function))
    return originals


def _with_layers(config, n_layers: int):
    """``config`` with the model cut (or grown) to ``n_layers`` blocks."""
    import dataclasses

    model = dataclasses.replace(config.job.model, n_layers=n_layers)
    return dataclasses.replace(config, job=dataclasses.replace(config.job, model=model))


def count_step_syncs(layout: str, log_dir: str, steps: int, log_every: int) -> dict:
    """Train ``steps`` steps with ``--log-every log_every`` while counting; per step: host reads,
    the loop's collectives and the math's collectives; and the JSONL step lines (rank 0)."""
    import torch.distributed as dist

    from plait.run import step as step_module
    from plait.run.trainer import run_training
    from runtime_tasks import make_config

    log = f"{log_dir}/run.jsonl"
    config = _with_layers(make_config(layout, steps=steps, global_batch=4, seq_len=16, log=log, log_every=log_every), 2)
    counter = StepCounter()
    read_originals = {name: getattr(torch.Tensor, name) for name in READ_METHODS}
    math_originals = _mark_math(counter, step_module)
    try:
        _patched(counter, read_originals)
        with counter:
            run_training(config, device=torch.device("cpu"), stop=Never(), faults=MarkSteps(counter))
    finally:
        for name, original in read_originals.items():
            setattr(torch.Tensor, name, original)
        for name, original in math_originals.items():
            setattr(step_module, name, original)
    lines = []
    if dist.get_rank() == 0:
        with open(log, encoding="utf-8") as handle:
            lines = [json.loads(line) for line in handle if '"step"' in line and "summary" not in line]
    return {"reads": dict(counter.reads), "loop_collectives": dict(counter.loop_collectives),
            "math_collectives": dict(counter.math_collectives), "what": counter.what, "lines": lines}


def count_optimizer_ops(layout: str, n_layers: int) -> dict:
    """aten ops (by name) dispatched by one clip + AdamW step of the tiny model with ``n_layers``
    layers under ``layout`` (after a first step, which creates AdamW's state), and the number of
    parameter tensors on this rank."""
    from plait.run.faults import NO_FAULTS
    from plait.run.optim import clip_grad_norm
    from plait.run.step import forward_backward, local_batch
    from plait.run.trainer import build_setup
    from runtime_tasks import make_config

    config = _with_layers(make_config(layout, global_batch=4, seq_len=16), n_layers)
    job = config.job
    setup = build_setup(config, torch.device("cpu"), NO_FAULTS)
    params = setup.parts.parameters()
    ops: Counter = Counter()

    class CountOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    for step in range(2):
        inputs, labels = local_batch(setup.source, job, setup.pdims, step, setup.device)
        forward_backward(setup.parts, setup.pdims, inputs, labels, setup.n_micro)
        if step == 1:
            with CountOps():
                clip_grad_norm(params, config.optim.grad_clip, setup.pdims)
                setup.optimizer.step()
        else:
            clip_grad_norm(params, config.optim.grad_clip, setup.pdims)
            setup.optimizer.step()
        setup.optimizer.zero_grad(set_to_none=True)
    return {"ops": dict(ops), "tensors": len(params), "groups": len(setup.optimizer.param_groups)}
