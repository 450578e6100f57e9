"""Numeric tolerances of the suite, derived from fp32 arithmetic instead of seen on one CPU.

Two runs that execute the same kernels on the same inputs in the same order are compared for
equality (a resume on the same layout, recomputation, offload). Runs that sum in another order
(another layout or world size, another attention kernel, another BLAS or CPU generation: AVX2 and
AVX-512 kernels block their dot products differently) are compared within these bounds:

* ``U``: fp32 unit roundoff, 2^-24 ≈ 6.0e-8.
* ``reduction_rtol(n)``: a sum of n terms in any order is off by at most ``γ_n ≈ n·U`` of the sum of
  magnitudes (Higham 2002, Thm 4.4); rounding errors behave like independent zero-mean variables, so
  with ``λ`` = 8 the error exceeds ``λ·√n·U`` with probability below 2·exp(-λ²/2) ≈ 3e-14 per sum
  (Higham & Mary 2019, Thm 3.1) - a bound that holds on any CPU, unlike a value seen on one.
* ``DEPTH``: every block (and the embedding and the head) adds its own rounding to what flows
  through it; RMSNorm/LayerNorm keep each block's condition number O(1), so the relative
  differences add up: losses and gradient norms are within ``reduction_rtol(K)·(layers + 2)``.
* AdamW: the update is ``lr·m̂/(√v̂ + eps)``. A gradient element off by ``e`` moves its update by at
  most ``lr·e/eps`` (the worst case is a gradient near 0, where ``√v̂`` no longer damps it), and never
  by more than 2·lr. ``e`` is the rounding of the sums behind the element, at the scale ``G`` of a
  gradient element: the clip norm spread over the P parameters, ``G = clip/√P`` (a sum's rounding
  scales with its terms; the near-zero elements Adam amplifies are sums of small terms). After
  ``steps`` steps a parameter is within ``steps·lr·min(2, run_rtol·G/eps)``.
"""

from __future__ import annotations

import math

U = 2.0 ** -24  # fp32 unit roundoff
LAMBDA = 8.0  # probabilistic-rounding confidence: P(error > λ√n·u) < 2·exp(-λ²/2)


def reduction_rtol(n: int) -> float:
    """Relative error bound of an fp32 sum (or dot product) of ``n`` terms in any order: λ·√n·u."""
    return LAMBDA * math.sqrt(n) * U


def run_rtol(longest_sum: int, layers: int) -> float:
    """Losses and global gradient norms of two runs that sum in different orders: each of the
    ``layers`` blocks plus the embedding and the head adds one reduction's rounding."""
    return reduction_rtol(longest_sum) * (layers + 2)


def adamw_atol(lr: float, steps: int, eps: float, grad_scale: float, longest_sum: int, layers: int) -> float:
    """Parameters after ``steps`` AdamW steps of two runs that sum in different orders: per step at
    most ``lr·e/eps`` with ``e = run_rtol·grad_scale``, and never more than 2·lr."""
    return steps * lr * min(2.0, run_rtol(longest_sum, layers) * grad_scale / eps)


# The tiny model of the runtime tests (plait.spec.models: 4 layers, hidden 128, vocab 512) trained with
# tests/run/runtime_tasks.py's OPTIM (lr 1e-3, eps 1e-6, gradients clipped to norm 1):
TINY_LONGEST_SUM = 512  # the widest reduction: the vocabulary's softmax and the head's dot products (≥ hidden, ffn)
TINY_LAYERS = 4
TINY_PARAMS = 918_656  # ModelSpec tiny: total_params()
TINY_GRAD_SCALE = 1.0 / math.sqrt(TINY_PARAMS)  # clip norm 1 over √P ≈ 1.04e-3 (seen: the rms element, 1.04e-3)
TINY_LR, TINY_EPS = 1e-3, 1e-6

LOSS_RTOL = run_rtol(TINY_LONGEST_SUM, TINY_LAYERS)  # ≈ 6.5e-5


def param_atol(steps: int) -> float:
    """Parameter tolerance of the tiny model after ``steps`` steps in another summation order
    (≈ 6.8e-5 per step; seen ≤ 1.8e-6 per step across layouts)."""
    return adamw_atol(TINY_LR, steps, TINY_EPS, TINY_GRAD_SCALE, TINY_LONGEST_SUM, TINY_LAYERS)


# Attention kernels compared on one layer's output and input gradients (tests/run/test_context_parallel.py):
# a softmax-weighted sum over at most ``seq`` keys of head_dim-long dot products, values O(1).
def attention_atol(seq: int, head_dim: int, scale: float = 1.0) -> float:
    """Absolute bound for an attention output or gradient of magnitude ``scale``: the score dot
    products (head_dim terms), the softmax sum and the weighted sum of values (seq terms each)."""
    return (reduction_rtol(head_dim) + 2 * reduction_rtol(seq)) * scale
