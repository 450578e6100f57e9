"""Packed documents (``plait train --doc-mask``): each token attends only within its document.

A token file is documents back to back, each followed by the end-of-text id (``plait data
prepare``). A training row of ``seq_len`` tokens cuts through several of them. With document
masking the row's tokens get **document ids** (``document_ids``: the number of end-of-text
tokens before each one, so an end-of-text token belongs to the document it closes), attention
allows key j for query i only when both are in the same document (on top of the causal mask and
a sliding window: ``document_mask``), and positions **restart at 0 in every document**
(``document_positions``), as torchtitan's document masking and Hugging Face's
``DataCollatorWithFlattening`` (``position_ids`` per document) do: a document packed into a row
is computed exactly as it would be alone, whatever sits before it. The first document of a row
is usually the tail of one cut by the row boundary; it starts at position 0 like the rest.

Document ids are always those of the **whole** row ``(batch, seq)`` in position order; a
context-parallel kernel takes its rank's queries and each block's keys from it by their global
positions (``plait.run.parallel.context``), and a pipeline stage receives it with every
micro-batch (a keyword argument of the schedule's step, which torch passes to every stage).

Kernels: the attention kernels of ``plait.run.modules.layers`` take ``documents=`` and pass SDPA
the boolean mask (batch, 1, seq, seq) (its memory-efficient or math kernel computes the whole
square), or, on CUDA without dropout, run ``flex_attention`` with a block mask built from the
document ids (``flex_document_attention``): blocks of 128×128 scores wholly outside every
document are skipped, so a row of documents of mean length L costs about what attention over
L tokens costs (``plait.plan.kernels.kernel_keys_per_query``). FlexAttention has no backward on
the CPU (torch 2.13) and the CUDA path has not been run on a GPU yet: none was available.
"""

from __future__ import annotations

import functools

import torch


def document_ids(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """int64 (batch, seq): document index of each token within its row, from 0; a token equal to
    ``eos_id`` closes its document (the next token starts the next one)."""
    ends = (tokens == eos_id).long()
    return ends.cumsum(dim=1) - ends


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """int64 (batch, seq): each token's position within its document (0 at every document's first
    token), from the row's document ids (non-decreasing along the row)."""
    seq = documents.shape[1]
    index = torch.arange(seq, device=documents.device).expand(documents.shape)
    starts = torch.ones(documents.shape, dtype=torch.bool, device=documents.device)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first


def document_mask(q_documents: torch.Tensor, k_documents: torch.Tensor, q_positions: torch.Tensor,
                  k_positions: torch.Tensor, window: int = 0) -> torch.Tensor:
    """bool (batch, queries, keys), True where a query may see a key: the key is at or before the
    query (global positions in the row, (queries,) and (keys,)), within ``window`` of it (W > 0: at
    most W-1 positions before) and in the same document ((batch, queries) and (batch, keys) ids)."""
    distance = q_positions[:, None] - k_positions[None, :]
    allowed = distance >= 0
    if window:
        allowed = allowed & (distance < window)
    return allowed[None] & (q_documents[:, :, None] == k_documents[:, None, :])


def row_mask(documents: torch.Tensor, window: int = 0) -> torch.Tensor:
    """``document_mask`` of a whole row against itself: bool (batch, 1, seq, seq), SDPA's attn_mask."""
    positions = torch.arange(documents.shape[1], device=documents.device)
    return document_mask(documents, documents, positions, positions, window)[:, None]


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


# [(documents, version, window, seq, block mask)] of the latest rows, one per window (local and global
# layers): the layers of one forward share their rows' masks. An entry holds the documents tensor
# itself, so that no other tensor can take its id while it is cached.
_BLOCK_MASKS: list = []


def block_mask_of(documents: torch.Tensor, window: int, seq: int, cache: bool = True):
    """FlexAttention's block mask of ``document_mask`` (causal, window, same document) for the row;
    ``cache``: built once per (documents tensor, window) and reused by the layers that follow."""
    from torch.nn.attention.flex_attention import create_block_mask

    if cache:
        _BLOCK_MASKS[:] = [entry for entry in _BLOCK_MASKS
                           if entry[0] is documents and entry[1:4:2] == (documents._version, seq)]
        for _, _, cached_window, _, mask in _BLOCK_MASKS:
            if cached_window == window:
                return mask

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = (q_idx >= kv_idx) & (documents[b, q_idx] == documents[b, kv_idx])
        return allowed & (q_idx - kv_idx < window) if window else allowed

    mask = create_block_mask(mask_mod, documents.shape[0], None, seq, seq, device=documents.device)
    if cache:
        _BLOCK_MASKS.append((documents, documents._version, window, seq, mask))
    return mask


def flex_document_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: torch.Tensor,
                            window: int = 0, scale: float | None = None) -> torch.Tensor:
    """Document-masked causal attention of (batch, heads, seq, head_dim) tensors by compiled
    FlexAttention (CUDA): only the 128×128 blocks that some document's causal triangle touches
    are computed. K/V may have fewer heads (GQA)."""
    gqa = k.shape[1] != q.shape[1]
    if torch.compiler.is_compiling():  # inside a compiled block: traced with it, no cache
        from torch.nn.attention.flex_attention import flex_attention

        mask = block_mask_of(documents, window, q.shape[2], cache=False)
        return flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=gqa)
    mask = block_mask_of(documents, window, q.shape[2])
    return _compiled_flex()(q, k, v, block_mask=mask, scale=scale, enable_gqa=gqa)


def flex_runs(q: torch.Tensor, dropout_p: float) -> bool:
    """Whether ``flex_document_attention`` serves this call: CUDA tensors, no dropout, and a torch
    with FlexAttention."""
    if q.device.type != "cuda" or dropout_p:
        return False
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True
