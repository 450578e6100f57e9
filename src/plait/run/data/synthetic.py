"""Exact synthetic token rows, set up faster for large batches: the same ids as
``np.random.default_rng([seed, step, position]).integers(0, vocab, size=n, dtype=np.int64)``, row by row.

numpy builds such a generator in three stages, each reproduced here:

1. ``SeedSequence([seed, step, position])`` hashes the three 32-bit words into a pool of four
   and draws four 64-bit words from it: plain uint32 arithmetic, done here for all rows at once.
2. ``PCG64`` takes the first two words as its 128-bit seed and the last two as its stream
   (``pcg64_set_seed``: ``inc = stream·2 + 1``, advance, add the seed, advance). The state is
   set on one reused bit generator (``BitGenerator.state``), which costs a dictionary instead of
   a new generator.
3. ``integers(0, vocab, size=n)`` is numpy's own, on one ``Generator`` over that bit generator.

So only the per-row set-up changes; the draws are numpy's, bit for bit. Stage 1 costs a fixed
~0.2-0.4 ms of numpy calls whatever the row count, so it pays from about ``VECTOR_ROWS`` rows
on (measured on a loaded 2-core CPU, 33-token rows: 8 rows 0.15 ms per-row vs 0.33 ms here, 64
rows 3.3 vs 1.6 ms, 256 rows 19 vs 7.4 ms); below that each row gets its own generator, as numpy
would. Either way the batch is made off the critical path (``plait.run.data.prefetch``).
Each of seed, step and position must be below 2^32 (a larger one is more than one entropy
word: such batches are made row by row).
``tests/run/test_data_fast.py`` checks the identity against numpy over many (seed, step, position).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MASK32 = 0xFFFFFFFF
INIT_A, MULT_A, INIT_B, MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
MIX_MULT_L, MIX_MULT_R = 0xCA01F9DD, 0x4973F715
PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645  # PCG's default 128-bit LCG multiplier
MASK128 = (1 << 128) - 1
VECTOR_ROWS = 32  # from this many rows on, stage 1 is vectorized (below: one generator per row)


def _u32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.uint64) & MASK32


def seed_words(entropy: np.ndarray) -> np.ndarray:
    """SeedSequence(entropy row).generate_state(4, uint64) for every row of ``entropy``, a
    (rows, 3) uint32-valued array: (rows, 4) uint64 (numpy's ``mix_entropy`` then ``generate_state``)."""
    hash_const = INIT_A

    def hashmix(value):
        nonlocal hash_const
        value = _u32(value ^ hash_const)
        hash_const = (hash_const * MULT_A) & MASK32
        value = _u32(value * hash_const)
        return value ^ (value >> 16)

    def mix(x, y):
        result = _u32(_u32(MIX_MULT_L * x) - _u32(MIX_MULT_R * y) + (1 << 32))
        return result ^ (result >> 16)

    entropy = entropy.astype(np.uint64)
    zero = np.zeros(len(entropy), dtype=np.uint64)
    pool = [hashmix(entropy[:, i] if i < entropy.shape[1] else zero) for i in range(4)]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    hash_const = INIT_B
    words = []
    for i in range(8):
        value = _u32(pool[i % 4] ^ hash_const)
        hash_const = (hash_const * MULT_B) & MASK32
        value = _u32(value * hash_const)
        words.append(value ^ (value >> 16))
    # uint32 pairs viewed as uint64 (little-endian): low word first
    return np.stack([words[2 * j] | (words[2 * j + 1] << 32) for j in range(4)], axis=1)


def pcg64_state(words: Sequence[int]) -> dict:
    """The ``PCG64.state`` that ``PCG64(SeedSequence)`` starts from, given its four seed words."""
    seed = (int(words[0]) << 64) | int(words[1])
    inc = (((int(words[2]) << 64) | int(words[3])) << 1 | 1) & MASK128
    state = inc  # 0·mult + inc
    state = (state + seed) & MASK128
    state = (state * PCG_MULT + inc) & MASK128
    return {"bit_generator": "PCG64", "state": {"state": state, "inc": inc}, "has_uint32": 0, "uinteger": 0}


def slow_row(seed: int, step: int, position: int, n: int, vocab: int) -> np.ndarray:
    return np.random.default_rng([seed, step, position]).integers(0, vocab, size=n, dtype=np.int64)


def synthetic_rows(seed: int, step: int, positions: Sequence[int], n: int, vocab: int) -> np.ndarray:
    """int64 (len(positions), n): row ``i`` equals ``slow_row(seed, step, positions[i], n, vocab)``."""
    positions = [int(p) for p in positions]
    out = np.empty((len(positions), n), dtype=np.int64)
    if not positions:
        return out
    if len(positions) < VECTOR_ROWS or max(seed, step, *positions) > MASK32:  # (> 2^32: several entropy words)
        for row, p in enumerate(positions):
            out[row] = slow_row(seed, step, p, n, vocab)
        return out
    words = seed_words(np.array([[seed, step, p] for p in positions], dtype=np.uint64))
    bits = np.random.PCG64()
    generator = np.random.Generator(bits)
    for row in range(len(positions)):
        bits.state = pcg64_state(words[row])
        out[row] = generator.integers(0, vocab, size=n, dtype=np.int64)
    return out
