"""SequenceShard: which tokens of every sequence a context-parallel rank holds (head-tail balanced).

Its own module so that the attention kernels, the model and the data path can all import it
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class SequenceShard:
    """Which tokens of every sequence cp rank ``rank`` of ``size`` holds (head-tail balanced)."""

    rank: int
    size: int

    @property
    def chunk_ids(self) -> tuple[int, int]:
        """The two chunks (of 2·size) this rank holds, in order."""
        return self.rank, 2 * self.size - 1 - self.rank

    def positions(self, local_len: int, device: torch.device | str) -> torch.Tensor:
        """Global positions (int64, ``local_len``) of this rank's tokens of a sequence."""
        if local_len % 2:
            raise ValueError(f"a context-parallel rank holds two equal chunks; got {local_len} tokens")
        chunk = local_len // 2
        first, second = self.chunk_ids
        return torch.cat([torch.arange(first * chunk, (first + 1) * chunk, device=device),
                          torch.arange(second * chunk, (second + 1) * chunk, device=device)])

    def shard(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of full sequences along ``dim`` (e.g. (batch, seq) token ids)."""
        full = tensor.shape[dim]
        if full % (2 * self.size):
            raise ValueError(f"sequence of {full} tokens is not a multiple of 2·cp = {2 * self.size}")
        pieces = tensor.chunk(2 * self.size, dim=dim)
        first, second = self.chunk_ids
        return torch.cat([pieces[first], pieces[second]], dim=dim)


def sequence_shard_of(group: dist.ProcessGroup) -> SequenceShard:
    return SequenceShard(rank=dist.get_rank(group), size=dist.get_world_size(group))
