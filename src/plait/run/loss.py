"""The token loss: mean cross entropy in fp32, from full logits (``loss=unfused``) or in chunks
(``loss=fused``) that never materialize the micro-batch's full fp32 logits.

``loss=fused``: the model stops before its LM head (``Transformer.returns_hidden``) and
``chunked_token_loss`` takes the final hidden state. It splits the tokens into chunks of
``LOSS_CHUNK_TOKENS``; for each it applies the LM head module, computes the fp32 cross entropy
(summed) and drops the chunk's logits: the chunk runs under ``torch.utils.checkpoint``
(non-reentrant), which keeps only its inputs (a view of the hidden state, the labels) and
recomputes the chunk's logits in the backward. At most one chunk's logits are alive at any time
(``plait.plan.memory.loss_tokens``). The head runs as a module, so its tensor-parallel hooks run:
with tp > 1 the logits are vocabulary-sharded and the cross entropy is ``loss_parallel``'s (the
caller's ``loss_context``). With sequence parallelism the final norm's output is a sequence
shard; it is gathered first, as the head's column-parallel input would be.

The sum over chunks divided by the token count is the same mean as ``token_loss``'s.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from plait.spec.layout import LOSS_CHUNK_TOKENS

CHUNK_TOKENS = LOSS_CHUNK_TOKENS  # tokens per chunk (module-level so that tests can use small chunks)


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over the tokens of a (micro-)batch, in fp32 (``loss=unfused``).

    ``logits`` may be a vocabulary-sharded DTensor: inside ``loss_parallel()`` the cross
    entropy is computed without gathering the full logits.
    """
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def _replicated(hidden: torch.Tensor) -> torch.Tensor:
    """A sequence-sharded DTensor (sequence parallelism) gathered to every tensor-parallel rank."""
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(hidden, DTensor) and not all(p.is_replicate() for p in hidden.placements):
        return hidden.redistribute(placements=[Replicate()] * hidden.device_mesh.ndim)
    return hidden


def chunked_token_loss(hidden: torch.Tensor, labels: torch.Tensor, head: nn.Module,
                       chunk_tokens: int | None = None, owner: nn.Module | None = None) -> torch.Tensor:
    """Mean fp32 cross entropy of ``head(hidden)`` against ``labels``, ``chunk_tokens`` tokens at a
    time (default ``CHUNK_TOKENS``).

    ``hidden``: the final hidden state (batch, seq, hidden); ``labels``: (batch, seq) token ids.
    ``owner``: the FSDP2 unit holding the head, if any. The head runs after that unit's forward
    and is recomputed in the backward before the unit's pre-backward hook gathers its parameters,
    so the unit is gathered here (``unshard``) and stays so until its post-backward reshards it.
    """
    chunk_tokens = chunk_tokens or CHUNK_TOKENS
    if hasattr(owner, "unshard"):  # an FSDPModule
        owner.unshard()
    flat = _replicated(hidden).flatten(0, 1)
    targets = labels.flatten()

    def chunk_loss(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(head(h).float(), y, reduction="sum")

    total = None
    for start in range(0, targets.numel(), chunk_tokens):
        stop = start + chunk_tokens
        part = checkpoint(chunk_loss, flat[start:stop], targets[start:stop], use_reentrant=False)
        total = part if total is None else total + part
    return total / targets.numel()


def loss_function(loss: str, head: nn.Module | None, default: Callable = token_loss,
                  owner: nn.Module | None = None) -> Callable:
    """The ``(output, labels) -> loss`` function of ``Layout.loss`` for a model part holding ``head``
    (the LM head module; None on ranks that compute no loss) in ``owner`` (its FSDP2 unit, if any)."""
    if loss != "fused" or head is None:
        return default

    def fused(hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return chunked_token_loss(hidden, labels, head, owner=owner)

    return fused
