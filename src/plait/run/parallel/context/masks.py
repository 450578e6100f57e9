"""The masks of a context-parallel rank's attention blocks, from global positions alone.

A block pairs the rank's queries with one rank's keys (``SequenceShard`` positions, head-tail).
Beyond the causal mask, a key j is hidden from a query i by a sliding window (W > 0: i - j >= W)
and, with packed documents, by a document boundary (the rows' document ids (batch, seq), which
every rank holds whole). ``BlockMasks`` builds a block's boolean mask where these hide something
and says when they hide the whole block, which the kernels then skip (no scores computed, in
the forward nor the backward): with a window of W tokens only the blocks within W positions of
a query chunk are computed.
"""

from __future__ import annotations

import torch

from plait.run.parallel.context.shard import SequenceShard

SKIP = "skip"  # BlockMasks' answer for a block no query sees any key of


def allowed_pairs(q_positions: torch.Tensor, k_positions: torch.Tensor, window: int = 0,
                  documents: torch.Tensor | None = None) -> torch.Tensor:
    """bool (1 or batch, queries, keys): causal, within ``window`` (0: none), the same document."""
    distance = q_positions[:, None] - k_positions[None, :]
    allowed = distance >= 0
    if window:
        allowed = allowed & (distance < window)
    allowed = allowed[None]
    if documents is not None:
        allowed = allowed & (documents[:, q_positions, None] == documents[:, None, k_positions])
    return allowed


class BlockMasks:
    """``masks(src, queries, keys)``: the mask of this rank's queries (sliced) against rank
    ``src``'s keys (sliced) as ``allowed_pairs`` gives it, None where the block's own causal
    structure is all there is (no window, no documents), or ``SKIP`` where nothing is allowed."""

    def __init__(self, rank: int, size: int, local: int, device, window: int = 0,
                 documents: torch.Tensor | None = None) -> None:
        self.size, self.local, self.device = size, local, device
        self.window, self.documents = window, documents
        self.mine = SequenceShard(rank, size).positions(local, device)

    def __call__(self, src: int, queries: slice = slice(None), keys: slice = slice(None)):
        theirs = SequenceShard(src, self.size).positions(self.local, self.device)[keys]
        mine = self.mine[queries]
        if self.window and int(mine.min() - theirs.max()) >= self.window:  # every query W or more past every key
            return SKIP
        if not self.window and self.documents is None:
            return None
        allowed = allowed_pairs(mine, theirs, self.window, self.documents)
        if not bool(allowed.any()):
            return SKIP
        return allowed
