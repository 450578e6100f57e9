"""Task bodies for tests/run/test_fp8.py: train the tiny model with precision=fp8 (one process or a
DistPool), and the rounding bound of an fp8 forward pass (see test_fp8.py's docstring)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from runtime_tasks import OPTIM, in_one_process, train_layout

from plait.run.data.tokens import SyntheticTokens
from plait.run.model import build_model, init_weights
from plait.run.parallel.float8 import converts
from plait.spec.models import get_model

E4M3_UNIT_ROUNDOFF = 2.0 ** -4  # 3 mantissa bits, round to nearest: |fl(x) - x| ≤ 2^-4·|x| (normal range)
LAMBDA = 8.0  # as tests/support/tolerances.py: P(|sum| > λ·u·‖c‖₂) ≤ 2·exp(-λ²/2) ≈ 2.5e-14 (Hoeffding)


def train(layout: str, **kwargs) -> dict:
    """Train on this rank with ``layout``; {'losses', 'grad_norms', 'fp8'} (+ 'params' on rank 0)."""
    return train_layout(layout, part_fields=("fp8",), **kwargs)


def one_process(layout: str, **kwargs) -> dict:
    """``train`` in a one-rank process group of its own, in this process, on one thread (as the
    pool's ranks: the emulated fp8 casts are many small kernels, slow with threads contended)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return in_one_process(train, layout, **kwargs)
    finally:
        torch.set_num_threads(threads)


def step0_batch(model: str = "tiny", global_batch: int = 8, seq_len: int = 32, seed: int = 1234):
    """(inputs, labels) of step 0 of ``runtime_tasks.make_config``'s synthetic data, the whole batch."""
    spec = get_model(model)
    rows = SyntheticTokens(spec.vocab, seed).batch(0, range(global_batch), seq_len)
    tokens = torch.from_numpy(rows)
    return tokens[:, :-1], tokens[:, 1:]


def fp8_loss_bound(model: str = "tiny", seed: int = 1234) -> dict:
    """The fp32 loss of step 0 (initial weights, step-0 batch) and the bound on how far the same
    forward pass in fp8 may move it: λ·u·‖c‖₂, where c holds, for every operand element an fp8
    GEMM rounds, the first-order derivative of the loss with respect to its relative rounding
    error (activations: x_tj·(g_t·W)_j; weights: W_ij·(gᵀx)_ij; g = ∂loss/∂output of the layer)."""
    spec = get_model(model)
    net = build_model(spec, "cpu")
    init_weights(net, spec, seed, "cpu")
    seen: dict[str, list[torch.Tensor]] = {}

    def keep(name):
        def hook(module, args, output):
            seen[name] = [args[0].detach()]
            output.register_hook(lambda grad: seen[name].append(grad.detach()))
        return hook

    layers = {name: module for name, module in net.named_modules() if converts(name, module, tp=1)}
    for name, module in layers.items():
        module.register_forward_hook(keep(name))
    inputs, labels = step0_batch(model, seed=seed)
    loss = F.cross_entropy(net(inputs).flatten(0, 1), labels.flatten())
    loss.backward()
    squares = 0.0
    for name, module in layers.items():
        x, g = (t.flatten(0, 1).double() for t in seen[name])
        w = module.weight.detach().double()
        squares += float(((x * (g @ w)) ** 2).sum()) + float(((w * (g.T @ x)) ** 2).sum())
    return {"loss": float(loss.detach()), "bound": LAMBDA * E4M3_UNIT_ROUNDOFF * math.sqrt(squares),
            "layers": sorted(layers)}


def adamw_drift(steps: int) -> float:
    """How far two AdamW runs of ``runtime_tasks.OPTIM`` may move one parameter apart in ``steps``
    steps whatever their gradients: at most 2·lr per step (tests/support/tolerances.py)."""
    return steps * 2.0 * OPTIM.lr
