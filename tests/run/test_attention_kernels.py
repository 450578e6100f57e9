"""The attention kernels with every model option (single process, fp32, CPU).

* FlexAttention (``attn=flex``, ``plait.run.modules.flex``) against the eager kernel for every
  combination of sliding window, score scale, soft-cap, sinks and packed documents, with GQA:
  the outputs agree within ``tolerances.attention_atol``. The CPU FlexAttention has a forward
  only, so this compares forwards (no gradient wanted); the CUDA path is the same call.
* The sinks' formula (out · sigmoid(lse - sink), what the fused path applies to FlexAttention's
  log-sum-exp) against the eager kernel's extra softmax column, gradients of q, k, v and the
  sinks included (the log-sum-exp here from autograd's logsumexp).
* ``attn=flex`` where FlexAttention cannot run (a gradient wanted on the CPU): the eager kernel
  with a soft-cap or sinks, SDPA with its mask without; ``attn=flash``/``sdpa`` refuse
  soft-caps and sinks in one line.
"""

from __future__ import annotations

import itertools
import warnings

import pytest

torch = pytest.importorskip("torch")

import tolerances

from plait.errors import PlaitError
from plait.run.modules.documents import document_ids, row_mask
from plait.run.modules.flex import add_sinks, flex_attend, flex_attention_kernel, flex_available
from plait.run.modules.layers import attention_mask, core_attention, eager_attention

BATCH, HEADS, KV_HEADS, SEQ, HEAD_DIM = 2, 4, 2, 48, 16
COMBOS = list(itertools.product((0, 7), (None, 0.3), (0.0, 2.0), (False, True), (False, True)))


def _problem(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, generator=generator)
    k, v = (torch.randn(BATCH, KV_HEADS, SEQ, HEAD_DIM, generator=generator) for _ in range(2))
    sinks = torch.randn(HEADS, generator=generator)
    tokens = torch.randint(0, 6, (BATCH, SEQ), generator=generator)  # id 0 ends a document: ~8 per row
    return q, k, v, sinks, document_ids(tokens, 0)


@pytest.mark.skipif(not flex_available(), reason="this torch has no FlexAttention")
@pytest.mark.parametrize("window,scale,softcap,sinks,documents", COMBOS,
                         ids=[f"w{w}-s{s}-c{c}-sink{int(k)}-doc{int(d)}" for w, s, c, k, d in COMBOS])
def test_flex_matches_eager(window, scale, softcap, sinks, documents):
    q, k, v, sink_logits, ids = _problem()
    options = dict(window=window, scale=scale, softcap=softcap, sinks=sink_logits if sinks else None,
                   documents=ids if documents else None)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*without torch.compile")  # eager FlexAttention on the CPU
        got = flex_attend(q, k, v, **options)
        routed = flex_attention_kernel(q, k, v, 0.0, **options)  # no gradient wanted: FlexAttention runs
    want = eager_attention(q, k, v, 0.0, **options)
    magnitude = max(t.abs().max().item() for t in (q, k, v))
    atol = tolerances.attention_atol(SEQ, HEAD_DIM, magnitude * magnitude)
    assert (got - want).abs().max().item() <= atol
    assert torch.equal(routed, got)


def test_sinks_formula_matches_the_extra_softmax_column_with_gradients():
    q, k, v, sink_logits, _ = _problem(1)
    grad_out = torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, generator=torch.Generator().manual_seed(2))
    window, softcap = 9, 3.0

    def run(via_lse: bool):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, sink_logits)]
        qq, kk, vv, ss = leaves
        if via_lse:  # attention without sinks and its log-sum-exp, then the sink weight
            kk_, vv_ = kk.repeat_interleave(2, dim=1), vv.repeat_interleave(2, dim=1)
            scores = torch.tanh(qq @ kk_.transpose(-2, -1) / HEAD_DIM ** 0.5 / softcap) * softcap
            scores = scores.masked_fill(~attention_mask(SEQ, window, "cpu"), float("-inf"))
            out = add_sinks(scores.softmax(-1) @ vv_, scores.logsumexp(-1), ss)
        else:
            out = eager_attention(qq, kk, vv, 0.0, window=window, softcap=softcap, sinks=ss)
        out.backward(grad_out)
        return [out.detach()] + [leaf.grad for leaf in leaves]

    want, got = run(False), run(True)
    atol = tolerances.attention_atol(SEQ, HEAD_DIM, 4.0 * max(t.abs().max().item() for t in want))
    for name, a, b in zip(("out", "dq", "dk", "dv", "dsinks"), got, want):
        assert (a - b).abs().max().item() <= atol, name
    assert want[4].abs().max() > 1e-3  # the sinks do get a gradient


@pytest.mark.parametrize("softcap,sinks", [(2.0, False), (0.0, True), (0.0, False)])
def test_flex_falls_back_where_it_cannot_run(softcap, sinks):
    """A gradient on the CPU: FlexAttention has no CPU backward, so the eager kernel (soft-cap or
    sinks) or SDPA with its mask runs instead, and trains."""
    q, k, v, sink_logits, ids = _problem(3)
    q = q.requires_grad_()
    options = dict(window=5, scale=0.25, softcap=softcap, sinks=sink_logits if sinks else None, documents=ids)
    got = flex_attention_kernel(q, k, v, 0.0, **options)
    got.sum().backward()
    assert q.grad is not None
    if softcap or sinks:
        assert torch.equal(got, eager_attention(q, k, v, 0.0, **options))
    else:
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=row_mask(ids, 5), scale=0.25,
                                                                enable_gqa=True)
        assert torch.equal(got, want)


@pytest.mark.parametrize("options", [{"softcap": 2.0}, {"sinks": torch.zeros(HEADS)}])
def test_sdpa_refuses_softcaps_and_sinks(options):
    q, k, v, _, _ = _problem()
    with pytest.raises(PlaitError, match="use attn=flex or attn=eager"):
        core_attention(q, k, v, 0.0, **options)
