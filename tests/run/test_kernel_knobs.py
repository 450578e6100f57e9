"""Kernel knobs in the runtime (``Layout.attn``, ``norm``, ``loss``) train the same model.

Each variant trains the tiny model for 3 AdamW steps on 8 × 32 tokens (fp32, CPU) and is compared
with the single-process run of the default kernels (``runtime_tasks.reference``): losses and
gradient norms within tolerances.LOSS_RTOL, parameters within tolerances.param_atol(3), the bounds
of tests/run/test_runtime_parity.py (derived from fp32 rounding). The chunked cross entropy
(``loss=fused``) runs with chunks of 24 tokens (``kernel_tasks``), so a micro-batch of 256 or 128
tokens is split into 11 or 6 chunks, the last one shorter: only the summation order of the
per-token losses changes. The unfused norm is the same arithmetic as the fused one on the CPU
(torch's CPU ``rms_norm`` is itself composite), and ``sdpa`` is the same call as ``flash``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kernel_tasks
from test_runtime_parity import assert_same_training

# (norm=unfused runs on 2 ranks below; attn=sdpa is the same SDPA call as flash)
ONE_PROCESS = ["dp=1,loss=fused", "dp=1,mbs=2,loss=fused,ckpt=full"]
TWO_RANKS = [
    ("dp=2,loss=fused", "DDP, chunked loss"),
    ("dp=2,zero=3,loss=fused,norm=unfused", "FSDP2 ZeRO-3, chunked loss, unfused norm"),
    # tp: 2 micro-batches of 4 sequences (mbs=4), not 8 of 1: 128 tokens still split into chunks with a
    # shorter last one, and a tp micro-batch is ~50 gloo collectives (4x the run's time with 8)
    ("tp=2,mbs=4,loss=fused,norm=unfused", "TP + SP: vocabulary-sharded chunks under loss_parallel"),
    ("tp=2,sp=0,mbs=4,loss=fused", "TP without SP, chunked loss"),
    ("pp=2,loss=fused", "PP 1F1B: the last stage's loss_fn chunks"),
    ("pp=2,vpp=2,loss=fused", "PP interleaved: the head on the last virtual stage"),
    ("pp=2,schedule=zero-bubble,mbs=2,loss=fused", "PP zero-bubble: input and weight gradients split"),
]


@pytest.mark.parametrize("layout", ONE_PROCESS)
def test_one_process_matches_default_kernels(references, layout):
    assert_same_training(kernel_tasks.reference(layout), references(), layout)


@pytest.mark.parametrize("layout", [c[0] for c in TWO_RANKS], ids=[c[1] for c in TWO_RANKS])
def test_two_ranks_match_default_kernels(dist_pool, references, layout):
    out = dist_pool(2).run(kernel_tasks.train_with_chunks, layout, timeout=180)
    assert_same_training(out[0], references(), layout)


def test_gpt_unfused_layernorm_and_chunked_loss(dist_pool, references):
    layout = "dp=2,zero=2,norm=unfused,loss=fused"
    out = dist_pool(2).run(kernel_tasks.train_with_chunks, layout, model="tiny-gpt", timeout=180)
    assert_same_training(out[0], references("tiny-gpt"), layout)


def test_chunked_loss_equals_full_logits_loss():
    """The loss value and the gradients of hidden state and head weight, against token_loss."""
    from plait.run.loss import chunked_token_loss, token_loss

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(3, 10, 16, requires_grad=True)
    labels = torch.randint(0, 50, (3, 10))
    full = token_loss(head(hidden), labels)
    full_grads = torch.autograd.grad(full, [hidden, head.weight])
    chunked = chunked_token_loss(hidden, labels, head, chunk_tokens=7)  # 30 tokens: 7, 7, 7, 7, 2
    chunked_grads = torch.autograd.grad(chunked, [hidden, head.weight])
    torch.testing.assert_close(chunked, full)
    for got, want in zip(chunked_grads, full_grads):
        torch.testing.assert_close(got, want)


def test_chunked_loss_keeps_one_chunk_of_logits():
    """What autograd keeps after the forward: the chunks' inputs, no logits (saved-tensor hooks)."""
    from torch.autograd.graph import saved_tensors_hooks

    from plait.run.loss import chunked_token_loss

    vocab, hidden_size, tokens = 500, 8, 64
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    hidden = torch.randn(2, tokens // 2, hidden_size, requires_grad=True)
    labels = torch.randint(0, vocab, (2, tokens // 2))
    saved = []
    with saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        chunked_token_loss(hidden, labels, head, chunk_tokens=16)
    big = [t for t in saved if t.numel() >= 16 * vocab]
    assert not big, f"logits kept for the backward: {[tuple(t.shape) for t in big]}"


def saved_beyond_inputs(loss_of, hidden, labels, head) -> int:
    """Bytes of the distinct storages autograd saves for the loss's backward, other than the hidden
    state, the labels and the head's weight (which both variants keep)."""
    known = {t.untyped_storage().data_ptr() for t in (hidden, labels, head.weight)}
    counted: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in known:
            counted[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_of()
    return sum(counted.values())


def test_loss_memory_matches_planner_logits_term():
    """Unfused: the fp32 log-probabilities of every token are kept (4 of the 12 bytes per logit at the
    loss's peak: nll_loss's fp32 gradient and the log-softmax's fp32 input gradient join them in the
    backward, tests/plan/test_loss_peak.py); fused: nothing of that size is kept and the planner counts
    one chunk (``plait.plan.memory.loss_tokens``)."""
    from plait.plan.memory import estimate_memory, loss_tokens
    from plait.run.loss import chunked_token_loss, token_loss
    from plait.spec.hardware import cluster_for_gpu
    from plait.spec.layout import LOSS_CHUNK_TOKENS, JobSpec, Layout
    from plait.spec.models import get_model

    vocab, width, batch, seq = 512, 16, 2, 48
    head = torch.nn.Linear(width, vocab, bias=False)
    hidden = torch.randn(batch, seq, width, requires_grad=True)
    labels = torch.randint(0, vocab, (batch, seq))
    tokens = batch * seq
    unfused = saved_beyond_inputs(lambda: token_loss(head(hidden), labels), hidden, labels, head)
    fused = saved_beyond_inputs(lambda: chunked_token_loss(hidden, labels, head, chunk_tokens=16), hidden, labels,
                                head)
    assert 4 * tokens * vocab <= unfused < 4 * tokens * vocab + 16 * tokens  # + the nll_loss bookkeeping
    assert fused < 16 * vocab  # no chunk's logits survive the forward

    model, cluster, job = get_model("llama2-7b"), cluster_for_gpu("h100", 8), JobSpec(64, 4096)
    plain, chunked = Layout(dp=8, mbs=2), Layout(dp=8, mbs=2, loss="fused")
    assert loss_tokens(plain, job.seq_len) == 2 * 4096 and loss_tokens(chunked, job.seq_len) == LOSS_CHUNK_TOKENS
    saved = estimate_memory(model, cluster, job, plain).logits - estimate_memory(model, cluster, job, chunked).logits
    assert saved == 3 * 4 * (2 * 4096 - LOSS_CHUNK_TOKENS) * model.vocab  # three fp32 tensors per logit
