"""``attn=flex``: every attention option of a model in one fused FlexAttention kernel.

``flex_attention_kernel(q, k, v, dropout_p, *, window, scale, softcap, sinks, documents)`` on
(batch, heads, seq, head_dim) tensors (K/V may have fewer heads, GQA):

  * the causal mask, a sliding window (W > 0: a query at position i sees keys i-W+1..i; the
    local layers of an alternating model get it, the global ones not: ``Attention``) and
    packed documents are FlexAttention's **block mask**: 128×128 blocks wholly outside them are
    skipped, so a windowed layer costs about s·W score elements instead of s²/2;
  * soft-capping (c > 0: scores become c·tanh(scores/c), Gemma-2) is its ``score_mod``, applied
    after the score scale (``scale``, default 1/sqrt(head_dim)), as the eager kernel does;
  * attention sinks (``sinks``: one logit per head, (heads,), GPT-OSS) are a softmax column no
    value goes with. FlexAttention returns each query's log-sum-exp L over its keys; with the
    sink s the softmax denominator becomes e^L + e^s, so the output is the sinkless output
    times e^L / (e^L + e^s) = sigmoid(L - s) (``add_sinks``). The gradient reaches the sink and,
    through L (FlexAttention differentiates its log-sum-exp), q and k.

Where it runs (``flex_runs``): a torch with ``torch.nn.attention.flex_attention``, no attention
dropout, and a CUDA device, or any device when no gradient is needed (torch 2.13's CPU
FlexAttention has a forward only). Elsewhere the kernel falls back, as the planner prices it
(``plait.plan.kernels``): to SDPA with an explicit boolean mask (``core_attention``) when the
model has neither soft-cap nor sinks, else to the eager kernel (``eager_attention``).
On CUDA the kernel is ``torch.compile``d once (``compiled_flex``); inside a compiled block it is
traced with the block.
"""

from __future__ import annotations

import functools

import torch


def flex_available() -> bool:
    """Whether this torch has FlexAttention (torch >= 2.5)."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def flex_runs(q: torch.Tensor, dropout_p: float, *tensors: torch.Tensor | None) -> bool:
    """Whether FlexAttention serves this call: no dropout, a torch with it, and CUDA tensors or
    no gradient wanted of ``q`` and ``tensors`` (the CPU kernel has no backward)."""
    if dropout_p or not flex_available():
        return False
    if q.device.type == "cuda":
        return True
    wanted = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, *tensors))
    return not wanted


@functools.lru_cache(maxsize=1)
def compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


# [(documents or None, documents version, window, seq, device, block mask)] of the latest calls:
# the layers of one forward share them (one per window: local and global layers). An entry holds
# the documents tensor itself, so that no other tensor can take its id while it is cached.
_MASKS: list = []


def causal_mask_mod(window: int = 0, documents: torch.Tensor | None = None):
    """FlexAttention ``mask_mod``: causal, within ``window`` (0: none), within one document."""
    def mask_mod(b, h, q_idx, kv_idx):
        allowed = q_idx >= kv_idx
        if window:
            allowed = allowed & (q_idx - kv_idx < window)
        if documents is not None:
            allowed = allowed & (documents[b, q_idx] == documents[b, kv_idx])
        return allowed

    return mask_mod


def block_mask(seq: int, device, window: int = 0, documents: torch.Tensor | None = None, cache: bool = True):
    """The block mask of ``causal_mask_mod`` for ``seq`` queries and keys, built once per
    (documents tensor, window, seq) and reused by the layers that follow (``cache``)."""
    from torch.nn.attention.flex_attention import create_block_mask

    version = None if documents is None else documents._version
    key = (version, window, seq, str(device))
    if cache:
        for entry in _MASKS:
            if entry[0] is documents and entry[1:5] == key:
                return entry[5]
    batch = None if documents is None else documents.shape[0]
    mask = create_block_mask(causal_mask_mod(window, documents), batch, None, seq, seq, device=device)
    if cache:
        _MASKS[:] = [entry for entry in _MASKS if entry[0] is documents and entry[1] == version][-3:]
        _MASKS.append((documents, *key, mask))
    return mask


def softcap_score_mod(softcap: float):
    """FlexAttention ``score_mod`` of soft-capping: c·tanh(score/c) (the score already scaled)."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / softcap) * softcap

    return score_mod


def add_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """The output with a sink column in each softmax: ``out`` (b, heads, s, d) attention without
    it, ``lse`` (b, heads, s) its log-sum-exp (natural log), ``sinks`` (heads,) the sink logits;
    out · sigmoid(lse - sink), in fp32, cast back to out's dtype."""
    weight = torch.sigmoid(lse.float() - sinks.float()[None, :, None])
    return (out.float() * weight.unsqueeze(-1)).to(out.dtype)


def flex_call(function, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, *, scale: float | None,
              softcap: float, sinks: torch.Tensor | None) -> torch.Tensor:
    """``function`` (FlexAttention, compiled or not) with the soft-cap's score_mod and ``mask``;
    with ``sinks``, through its log-sum-exp (``add_sinks``; ``return_aux`` where torch has it,
    else the older ``return_lse``)."""
    kwargs = dict(score_mod=softcap_score_mod(softcap) if softcap else None, block_mask=mask, scale=scale,
                  enable_gqa=k.shape[1] != q.shape[1])
    if sinks is None:
        return function(q, k, v, **kwargs)
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # torch < 2.9
        out, lse = function(q, k, v, return_lse=True, **kwargs)
    else:
        out, aux = function(q, k, v, return_aux=AuxRequest(lse=True), **kwargs)
        lse = aux.lse
    return add_sinks(out, lse, sinks)


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int = 0, scale: float | None = None,
                softcap: float = 0.0, sinks: torch.Tensor | None = None,
                documents: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention with every option by FlexAttention (module docstring); compiled on CUDA."""
    from torch.nn.attention.flex_attention import flex_attention

    compiling = torch.compiler.is_compiling()
    mask = block_mask(q.shape[2], q.device, window, documents, cache=not compiling)
    function = compiled_flex() if q.device.type == "cuda" and not compiling else flex_attention
    return flex_call(function, q, k, v, mask, scale=scale, softcap=softcap, sinks=sinks)


def flex_attention_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, *, window: int = 0,
                          scale: float | None = None, softcap: float = 0.0, sinks: torch.Tensor | None = None,
                          documents: torch.Tensor | None = None) -> torch.Tensor:
    """``Attention.kernel`` of ``attn=flex``: ``flex_attend`` where it runs, else the fallbacks
    (module docstring)."""
    from plait.run.modules.layers import core_attention, eager_attention

    if flex_runs(q, dropout_p, k, v, sinks):
        return flex_attend(q, k, v, window=window, scale=scale, softcap=softcap, sinks=sinks, documents=documents)
    if softcap or sinks is not None:
        return eager_attention(q, k, v, dropout_p, window=window, scale=scale, softcap=softcap, sinks=sinks,
                               documents=documents)
    return core_attention(q, k, v, dropout_p, window=window, scale=scale, documents=documents)
