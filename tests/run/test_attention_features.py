"""Soft-capped scores, alternating sliding windows, a score scale and attention sinks under tensor
and context parallelism, against one process (fp32, CPU, gloo).

* Kernels: plait's ring and all-gather (and Ulysses) cp kernels with every option (and packed
  documents on top) against the eager kernel on the whole sequence: output and q, k, v and sink gradients on each rank's
  tokens, cp = 2 and 4 (at cp = 4 a window of 8 tokens hides whole ring blocks, which the ring
  skips), within ``tolerances.attention_atol``.
* Training: the tiny model with all four options (``attention_features_tasks.FEATURES``), 3
  AdamW steps, under tp=2 (the sinks sharded with the heads), cp=2 ring and cp=2 all-gather,
  against the single-process run with ``attn=eager``: losses, gradient norms and parameters
  within tests/run/test_runtime_parity.py's bars.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import attention_features_tasks
import tolerances
from test_runtime_parity import assert_same_training

KERNEL_CASES = [  # (impl, cp, window, soft-cap, sinks, documents)
    ("ring", 2, 8, 5.0, True, False), ("ring", 4, 8, 5.0, True, False), ("ring", 4, 5, 0.0, False, False),
    ("ring", 4, 0, 2.0, True, False), ("ring", 4, 5, 2.0, True, True), ("allgather", 2, 8, 5.0, True, False),
    ("allgather", 4, 5, 0.0, True, False), ("allgather", 2, 5, 2.0, True, True), ("ulysses", 2, 8, 5.0, True, False),
    ("ulysses", 2, 5, 2.0, True, True),
]


@pytest.mark.parametrize("impl,cp,window,softcap,sinks,documents", KERNEL_CASES,
                         ids=[f"{c[0]}-cp{c[1]}-w{c[2]}-c{c[3]}-sink{int(c[4])}-doc{int(c[5])}" for c in KERNEL_CASES])
def test_cp_kernels_take_every_option(dist_pool, impl, cp, window, softcap, sinks, documents):
    out = dist_pool(cp).run(attention_features_tasks.kernel_errors, impl, window, softcap, sinks, documents,
                            timeout=90)
    for rank, errors in enumerate(out):
        assert errors["scale"] > 1e-2
        atol = tolerances.attention_atol(64, 8, max(errors["scale"], errors["inputs"]))  # the task's seq, head_dim
        for name in ("out", "no_grad", "dq", "dk", "dv") + (("dsinks",) if sinks else ()):
            # the sinks' gradient sums one term per query of the batch (2 × 64), each within atol
            assert errors[name] <= atol * (2 * 64 if name == "dsinks" else 1), \
                f"rank {rank}: {name} differs by {errors[name]:.3g}"


@pytest.fixture(scope="module")
def feature_reference():
    return attention_features_tasks.reference()


# tp: 2 micro-batches of 4 sequences (mbs=4), not 8 of 1: the sinks shard with the heads in each, and a tp
# micro-batch is ~50 gloo collectives
@pytest.mark.parametrize("layout", ["tp=2,mbs=4,attn=flex", "cp=2,cp_impl=ring", "cp=2,cp_impl=allgather"])
def test_training_with_every_option_matches_one_process(dist_pool, feature_reference, layout):
    out = dist_pool(2).run(attention_features_tasks.train_features, layout, timeout=240)
    assert_same_training(out[0], feature_reference, layout)
    assert all(rank["losses"] == out[0]["losses"] for rank in out), "ranks disagree on the loss"
