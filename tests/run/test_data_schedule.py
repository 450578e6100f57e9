"""Data mixtures without torch: the exact-proportion schedule, the --data syntax and the job-file
table, the mixture's rows (single-source equivalence, layout independence), the streamed source
(equal to the token file ``prepare`` writes of the same shards), and the errors."""

from __future__ import annotations

import json
import random
from fractions import Fraction

import numpy as np
import pytest

from plait.errors import PlaitError
from plait.run.data.mixture import open_data
from plait.run.data.mixture_spec import canonical, data_table, is_mixture, parse_data
from plait.run.data.prepare import prepare
from plait.run.data.schedule import Schedule
from plait.run.data.tokens import TokenFile

SEQ = 16


@pytest.mark.parametrize("seed", range(40))
def test_every_prefix_is_within_one_sample_of_the_weights(seed):
    rng = random.Random(seed)
    k = rng.randint(1, 8)
    weights = [Fraction(rng.randint(1, 999), 1000) for _ in range(k)]
    schedule = Schedule(weights)
    share = np.array([float(w) for w in schedule.weights])
    counts = np.zeros(k)
    bound = 1 - 1 / max(2, 2 * k - 2)  # Tijdeman's bound, < 1 sample
    for i, source in enumerate(schedule.order[:2000].tolist()):
        counts[source] += 1
        assert np.abs(counts - share * (i + 1)).max() <= bound + 1e-12, i
    n = 3 * schedule.period + rng.randrange(schedule.period)
    assert np.abs(np.array(schedule.counts(n)) - share * n).max() <= bound + 1e-12
    assert schedule.counts(schedule.period) == schedule.shares


def test_locate_is_the_schedule_counted():
    schedule = Schedule([Fraction("0.3"), Fraction("0.7")])
    assert schedule.period == 10 and schedule.shares == [3, 7]
    source, local = schedule.locate(np.arange(50))
    for s in (0, 1):  # each source's samples are 0, 1, 2, ... in global order
        assert local[source == s].tolist() == list(range(int((source == s).sum())))
    assert schedule.counts(50) == [15, 35] and schedule.counts(7) == [int((source[:7] == 0).sum()), 7 - int(
        (source[:7] == 0).sum())]


def test_weights_are_exact_decimals_normalized():
    assert [str(s) for s in parse_data("0.3:a.tok, 0.7:b")] == ["0.3:a.tok", "0.7:b"]
    assert Schedule([s.fraction for s in parse_data("1:a,2:b")]).weights == [Fraction(1, 3), Fraction(2, 3)]
    assert not is_mixture("synthetic") and not is_mixture("corpus.tok") and is_mixture("1:corpus.tok")
    assert canonical("0.5:x.tok,0.5:d/").startswith("0.5:/") and canonical("0.5:x.tok,0.5:d/").endswith("d/")


@pytest.mark.parametrize(("spec", "words"), [
    ("0.3:a.tok,b.tok", "has no weight"), ("0:a.tok,1:b.tok", "must be > 0"), ("0.3:a.tok,,0.7:b", "empty source"),
    ("-1:a.tok,1:b.tok", "is not WEIGHT:PATH"), ("", "empty source"),
])
def test_bad_specs_are_one_line(spec, words):
    with pytest.raises(PlaitError, match=words):
        parse_data(spec)


def test_a_period_too_long_is_refused():
    with pytest.raises(PlaitError, match="round them to fewer decimals"):
        Schedule([Fraction("0.1234567"), Fraction("0.8765433")])


def test_job_file_table():
    table = {"sources": [{"path": "a.tok", "weight": 0.3}, {"path": "b/", "weight": 0.7}], "text_key": "body"}
    assert data_table(table, "job.toml: ") == {"data": "0.3:a.tok,0.7:b/", "data-text-key": "body"}
    with pytest.raises(PlaitError, match="weight must be a number > 0"):
        data_table({"sources": [{"path": "a"}, {"path": "b", "weight": 1}]}, "")
    with pytest.raises(PlaitError, match="no key 'wieght'"):
        data_table({"sources": [{"path": "a", "wieght": 1}]}, "")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpora")
    (root / "a.txt").write_text("alpha beta gamma delta " * 60)
    (root / "b.txt").write_text("one two three four five " * 90)
    prepare([root / "a.txt"], root / "a.tok")
    prepare([root / "b.txt"], root / "b.tok")
    shards = root / "shards"
    shards.mkdir()
    for k in range(3):  # JSON lines: the same reader as parquet, without pyarrow
        (shards / f"part{k}.jsonl").write_text("".join(json.dumps({"body": f"doc {k}.{i} " + "w " * (i % 5)}) + "\n"
                                                        for i in range(40)))
    prepare([shards], root / "shards.tok", text_key="body")
    return root


def test_one_source_reads_what_the_token_file_reads(corpora):
    alone = TokenFile(corpora / "a.tok", seed=7)
    mixed = open_data(f"1:{corpora / 'a.tok'}", 512, seed=7, seq_len=SEQ)
    for step in (0, 3, 40):  # 40: past the first epoch
        assert np.array_equal(mixed.batch(step, range(8), SEQ, 8), alone.batch(step, range(8), SEQ, 8))


def test_rows_do_not_depend_on_who_asks(corpora):
    spec = f"0.3:{corpora / 'a.tok'},0.7:{corpora / 'shards'}/"
    whole = open_data(spec, 512, seed=1, seq_len=SEQ, text_key="body")
    split = open_data(spec, 512, seed=1, seq_len=SEQ, text_key="body")
    try:
        for step in (5, 0, 60, 2):  # out of order, and past the stream's end
            full = whole.batch(step, range(8), SEQ, 8)
            parts = [split.batch(step, range(r * 2, r * 2 + 2), SEQ, 8) for r in (3, 0, 2, 1)]
            assert np.array_equal(full, np.concatenate([parts[1], parts[3], parts[2], parts[0]]))
    finally:
        whole.close(), split.close()


def test_a_stream_reads_the_token_file_prepare_writes(corpora):
    prepared = TokenFile(corpora / "shards.tok")
    stream = open_data(str(corpora / "shards"), 512, seq_len=SEQ, text_key="body")
    try:
        n = (prepared.n_tokens - 1) // SEQ
        rows = stream.batch(0, range(2 * n + 3), SEQ, 2 * n + 3)  # in order, epoch after epoch
        for j, row in enumerate(rows):
            w = j % n
            assert np.array_equal(row, prepared.tokens[w * SEQ: w * SEQ + SEQ + 1]), j
        state = stream.state(10, 8, SEQ)
        assert state["tokens"] == {"shards": 10 * 8 * SEQ}
        resumed = open_data(str(corpora / "shards"), 512, seq_len=SEQ, text_key="body")
        resumed.restore(state)  # starts at the bookmarked unit, reads the same rows
        mark = state["streams"]["shards"]["unit"]
        assert mark == 2  # 10 steps x 8 x 16 tokens lie in the third shard (~500 tokens each)
        assert np.array_equal(resumed.batch(10, range(8), SEQ, 8), stream.batch(10, range(8), SEQ, 8))
        assert min(resumed.sources[0].encoded) == mark  # the shards before the bookmark were not tokenized
        resumed.close()
    finally:
        stream.close()


def test_mixed_vocabularies_and_bad_sources_are_one_line(corpora, tmp_path):
    (tmp_path / "c.txt").write_text("x" * 100)
    prepare([tmp_path / "c.txt"], tmp_path / "c.tok", eos_id=300)
    with pytest.raises(PlaitError, match="needs one vocabulary"):
        open_data(f"0.5:{corpora / 'a.tok'},0.5:{tmp_path / 'c.tok'}", 512)
    with pytest.raises(PlaitError, match="not found"):
        open_data(f"0.5:{corpora / 'a.tok'},0.5:{tmp_path / 'missing.tok'}", 512)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlaitError, match="holds no token files"):
        open_data(f"0.5:{corpora / 'a.tok'},0.5:{tmp_path / 'empty'}", 512)
    with pytest.raises(PlaitError, match="no key 'text'"):
        open_data(str(corpora / "shards"), 512, seq_len=SEQ).batch(0, range(1), SEQ, 1)
    with pytest.raises(PlaitError, match="has vocab 257"):
        open_data(f"1:{corpora / 'a.tok'}", 100)


def test_a_job_file_names_a_mixture_with_tables(tmp_path):
    from plait.cli import build_parser
    from plait.cli.jobfile.read import parse_args

    job = tmp_path / "run.toml"
    job.write_text('model = "tiny"\n[data]\ntext_key = "body"\n[[data.sources]]\npath = "a.tok"\nweight = 0.3\n'
                   '[[data.sources]]\npath = "b/"\nweight = 0.7\n')
    args = parse_args(build_parser(), ["train", "--config", str(job)])
    assert (args.data, args.data_text_key, args.data_tokenizer) == ("0.3:a.tok,0.7:b/", "body", None)
    args = parse_args(build_parser(), ["train", "--config", str(job), "--data", "x.tok"])
    assert args.data == "x.tok"  # the command line wins, as for every flag


def test_shards_without_pyarrow_name_the_pip_command(tmp_path, monkeypatch):
    import sys

    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "a.parquet").write_bytes(b"PAR1")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.arrow").write_bytes(b"ARROW1")
    for name in ("pyarrow", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, name, None)  # import pyarrow raises ImportError
    with pytest.raises(PlaitError, match=r"pip install pyarrow"):
        open_data(str(tmp_path / "s"), 512)
    with pytest.raises(PlaitError, match=r"reading arrow files needs pyarrow: pip install pyarrow"):
        open_data(str(tmp_path / "t"), 512).batch(0, range(1), SEQ, 1)


@pytest.mark.parametrize("writer", ["new_stream", "new_file"])
def test_arrow_shards_stream_as_prepare_reads_them(tmp_path, writer):
    pa = pytest.importorskip("pyarrow")
    (tmp_path / "arrow").mkdir()
    for k in range(2):  # the stream format is what Hugging Face datasets writes
        table = pa.table({"text": [f"arrow doc {k}.{i} " * (1 + i % 3) for i in range(30)] + [None]})
        with getattr(pa.ipc, writer)(str(tmp_path / "arrow" / f"data-{k:05d}.arrow"), table.schema) as out:
            out.write_table(table)
    prepare([tmp_path / "arrow"], tmp_path / "arrow.tok")
    prepared = TokenFile(tmp_path / "arrow.tok")
    stream = open_data(str(tmp_path / "arrow" / "*.arrow"), 512, seq_len=SEQ)
    try:
        n = (prepared.n_tokens - 1) // SEQ
        rows = stream.batch(0, range(n), SEQ, n)
        assert all(np.array_equal(rows[w], prepared.tokens[w * SEQ: w * SEQ + SEQ + 1]) for w in range(n))
    finally:
        stream.close()
