"""A block's offloaded activations, once brought back for the backward, leave again with its graph.

The first GPU proof (bench/results/gpu_proof) measured ``offload=cpu:1`` at 51 GiB allocated against
45.8 GiB without offload: the offloader's own lists kept every block's copy that the backward had
brought back until the step's end, so the peak was the whole micro-batch's activations on the device
again. On CPU the copies are host tensors, which is why the memory-truth tests could not see it;
here the copies are followed one by one (weak references), and their bytes counted exactly.

When the gradient reaches block k's output, blocks k and k - 1 have been fetched back (the block
about to run and the one prefetched behind it) and blocks after k have finished their backward: the
copies alive then are exactly groups k and k - 1, in bytes. After the backward none is alive.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

from plait.run.memory.offload import ActivationOffloader

WIDTH, ROWS, BLOCKS = 16, 8, 5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


def followed_offloader(blocks: nn.ModuleList):
    """An offloader on every block that records (block, weak ref to each copy brought back, bytes)."""
    offloader = ActivationOffloader("cpu", torch.device("cpu"))
    current = {"block": None}
    group_bytes: dict[int, int] = {}
    copies: list[tuple[int, weakref.ref, int]] = []
    block_of: dict[int, int] = {}  # id(Stored) -> block
    move_out, prefetch = offloader._move_out, offloader._prefetch

    def moved(storage, device):
        stored = move_out(storage, device)
        block_of[id(stored)] = current["block"]
        group_bytes[current["block"]] = group_bytes.get(current["block"], 0) + stored.nbytes
        return stored

    def fetched(stored):
        was = stored.loaded
        prefetch(stored)
        if stored.loaded is not None and stored.loaded is not was:
            copies.append((block_of[id(stored)], weakref.ref(stored.loaded), stored.nbytes))

    offloader._move_out, offloader._prefetch = moved, fetched
    for index, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda module, args, index=index: current.update(block=index))
        offloader.attach(block)
    return offloader, group_bytes, copies


def alive(copies) -> dict[int, int]:
    out: dict[int, int] = {}
    for block, ref, nbytes in copies:
        if ref() is not None:
            out[block] = out.get(block, 0) + nbytes
    return out


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_copies_brought_back_leave_with_their_blocks_backward(micro_batches):
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
    offloader, group_bytes, copies = followed_offloader(blocks)
    seen_at: dict[int, dict[int, int]] = {}

    for _ in range(micro_batches):
        seen_at.clear()
        x = torch.randn(ROWS, WIDTH, requires_grad=True)
        h = x
        for index, block in enumerate(blocks):
            h = block(h)
            # registered after the offloader's prefetch hook, so it runs after it
            h.register_hook(lambda grad, index=index: seen_at.__setitem__(index, alive(copies)))
        h.square().sum().backward()
        assert not alive(copies), "copies still on the device after the backward"

    assert set(seen_at) == set(range(BLOCKS))
    for k in range(BLOCKS):
        want = {b: group_bytes[b] // micro_batches for b in (k, k - 1) if b >= 0}
        assert seen_at[k] == want, f"at block {k}'s backward"
    offloader.close()


def test_a_storage_saved_twice_is_fetched_once_and_kept_until_its_last_use():
    """Deduplication still holds: one storage (a GEMM input saved by two GEMMs) is moved out once
    and both uses in the backward read the one copy, which leaves after the second."""
    torch.manual_seed(0)

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

        def forward(self, x):
            y = torch.tanh(x)
            return self.a(y) * self.b(y)

    blocks = nn.ModuleList([TwoHeads()])
    offloader, group_bytes, copies = followed_offloader(blocks)
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    out = blocks[0](x)
    stats = offloader.stats
    assert stats.deduplicated >= 1
    reference = nn.ModuleList([TwoHeads()])
    reference.load_state_dict(blocks.state_dict())
    want = torch.autograd.grad(reference[0](x).sum(), x)[0]
    got = torch.autograd.grad(out.sum(), x)[0]
    assert torch.equal(got, want)
    assert not alive(copies)
    offloader.close()


def test_device_bytes_are_held_for_two_blocks_of_the_forward_at_most():
    """The forward's double buffer (``ActivationOffloader._release``): a block's device bytes are held
    (on GPU, while the side stream may still copy them out) until the block after next starts, and
    every hold ends when the backward begins. On CPU the copy is synchronous and nothing is held, so
    the hold is marked here by hand where the GPU path marks it (``Stored.source``)."""
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
    offloader, group_bytes, copies = followed_offloader(blocks)
    groups: dict[int, list] = {}
    current = {"block": None}
    move_out = offloader._move_out

    def moved(storage, device):
        stored = move_out(storage, device)
        stored.source = storage  # what the GPU path holds
        groups.setdefault(current["block"], []).append(stored)
        return stored

    offloader._move_out = moved
    held_at: dict[int, set[int]] = {}

    def held() -> set[int]:
        return {b for b, group in groups.items() if any(s.source is not None for s in group)}

    def look(module, args, index):
        current.update(block=index)
        held_at[index] = held()

    for index, block in enumerate(blocks):  # registered after the offloader's: they run after its release
        block.register_forward_pre_hook(lambda module, args, index=index: look(module, args, index))
    h = torch.randn(ROWS, WIDTH, requires_grad=True)
    for block in blocks:
        h = block(h)
    assert held() == {BLOCKS - 2, BLOCKS - 1}
    h.register_hook(lambda grad: held_at.__setitem__("backward", held()))
    h.sum().backward()
    for k in range(BLOCKS):
        assert held_at[k] == ({k - 1} if k >= 1 else set()), f"at block {k}'s forward"
    assert held_at["backward"] == set() and offloader._copying == []
    offloader.close()
