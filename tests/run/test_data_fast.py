"""The data path off the critical path: exact fast synthetic rows, the prefetching source, and
the scheduled garbage collector."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from plait.run.data.synthetic import VECTOR_ROWS, pcg64_state, seed_words, slow_row, synthetic_rows
from plait.run.data.tokens import SyntheticTokens, TokenFile, prepare


@pytest.mark.parametrize("seed,step,vocab,n", [
    (0, 0, 512, 33), (1234, 7, 50257, 129), (2**32 - 1, 2**31, 7, 5), (5, 9, 2, 1), (3, 3, 128256, 100),
    (1, 2, 1, 4), (2**40, 1, 5, 3), (11, 2**33, 300, 17),
])
@pytest.mark.parametrize("positions", [
    [*range(0, 120, 3), 2**32 - 1, 7],  # vectorized set-up (>= VECTOR_ROWS rows)
    [*range(0, 120, 3), 2**32],  # a position of two entropy words: one generator per row
    [5, 0, 3],  # few rows: one generator per row
])
def test_fast_rows_equal_numpy_generators(seed, step, vocab, n, positions):
    want = np.stack([slow_row(seed, step, p, n, vocab) for p in positions])
    got = synthetic_rows(seed, step, positions, n, vocab)
    assert got.dtype == np.int64 and got.shape == (len(positions), n)
    np.testing.assert_array_equal(got, want)


def test_the_vectorized_set_up_is_used_from_vector_rows_on(monkeypatch):
    import plait.run.data.synthetic as synthetic

    calls = []
    monkeypatch.setattr(synthetic, "seed_words", lambda e: calls.append(len(e)) or seed_words(e))
    synthetic_rows(1, 2, range(VECTOR_ROWS), 9, 100)
    synthetic_rows(1, 2, range(VECTOR_ROWS - 1), 9, 100)
    assert calls == [VECTOR_ROWS]


def test_seed_words_are_numpys_pcg64_start():
    rng = np.random.default_rng(7)
    entropy = rng.integers(0, 2**32, size=(50, 3), dtype=np.uint64)
    words = seed_words(entropy)
    for row, w in zip(entropy, words):
        bits = np.random.PCG64(np.random.SeedSequence([int(v) for v in row]))
        assert pcg64_state(w)["state"] == bits.state["state"]


def test_synthetic_tokens_keep_their_stream():
    source = SyntheticTokens(300, seed=3)
    rows = source.batch(5, [4, 0, 2], 16)
    for row, p in zip(rows, [4, 0, 2]):
        np.testing.assert_array_equal(row, np.random.default_rng([3, 5, p]).integers(0, 300, 17, dtype=np.int64))
    assert synthetic_rows(1, 1, [], 4, 10).shape == (0, 4)


@pytest.mark.parametrize("kind", ["synthetic", "file"])
def test_prefetching_source_reads_the_same_rows(tmp_path, kind):
    from plait.run.data.prefetch import PrefetchingSource

    if kind == "synthetic":
        source = SyntheticTokens(300, seed=3)
    else:
        text = tmp_path / "a.txt"
        text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
        prepare([text], tmp_path / "tokens.bin")
        source = TokenFile(tmp_path / "tokens.bin", seed=3)
    prefetched = PrefetchingSource(source)
    # consecutive steps (prefetched), a jump (a resume: made on the spot), other positions
    requests = [(0, range(4)), (1, range(4)), (2, range(4)), (7, range(4)), (8, range(2, 4)), (9, range(4))]
    for step, positions in requests:
        np.testing.assert_array_equal(prefetched.batch(step, positions, 8, 4), source.batch(step, positions, 8, 4))
    assert prefetched.hits == 2 and prefetched.misses == 4
    assert prefetched.vocab_size == source.vocab_size and prefetched.description == source.description
    prefetched.close()
    np.testing.assert_array_equal(prefetched.batch(10, range(4), 8, 4), source.batch(10, range(4), 8, 4))


def test_prefetched_errors_reach_the_caller():
    from plait.errors import PlaitError
    from plait.run.data.prefetch import PrefetchingSource

    prefetched = PrefetchingSource(SyntheticTokens(10))
    with pytest.raises(PlaitError, match="seq_len"):
        prefetched.batch(0, [0], 0)
    prefetched.close()


def test_to_device_keeps_the_tokens():
    torch = pytest.importorskip("torch")
    from plait.run.data.prefetch import to_device

    rows = np.arange(12, dtype=np.int64).reshape(3, 4)
    assert torch.equal(to_device(rows, torch.device("cpu")), torch.from_numpy(rows))
    tensor = torch.from_numpy(rows)
    assert to_device(tensor, torch.device("cpu")) is tensor


def test_scheduled_gc_turns_the_collector_off_and_back_on():
    from plait.run.memory.host_gc import ScheduledGC

    assert gc.isenabled()
    calls = []
    gc.callbacks.append(lambda phase, info: calls.append(info["generation"]) if phase == "start" else None)
    try:
        with ScheduledGC(3) as collector:
            assert not gc.isenabled()
            calls.clear()
            for done in range(1, 8):
                collector.after_step(done)
            assert collector.collections == 2 and calls == [1, 1]  # after steps 3 and 6
        assert gc.isenabled()
        with ScheduledGC(0) as collector:
            assert gc.isenabled()
            collector.after_step(50)
            assert collector.collections == 0
    finally:
        gc.callbacks.pop()
        gc.enable()


def test_gc_every_is_checked():
    from plait.errors import PlaitError
    from plait.run.config import RuntimeConfig

    assert RuntimeConfig().gc_every == 50
    with pytest.raises(PlaitError, match="gc_every"):
        RuntimeConfig(gc_every=-1)
    with pytest.raises(PlaitError, match="qkv"):
        RuntimeConfig(qkv="packed")
