"""Issue 34's data mixtures, as the issue's "done when" asks: two small corpora trained as a 30/70
mixture on 2 processes, stopped (as SIGTERM stops a run) and resumed on another layout, must give
the uninterrupted run's losses and per-source token counts equal to the schedule's; a run
streaming parquet shards does the same (its checkpoint records where the stream was)."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import checkpoint_tasks  # noqa: E402
import runtime_tasks  # noqa: E402
import tolerances  # noqa: E402

from plait.run.checkpoint import store  # noqa: E402
from plait.run.data.prepare import prepare  # noqa: E402
from plait.run.data.schedule import Schedule  # noqa: E402

STEPS, STOP, GLOBAL_BATCH, SEQ = 6, 3, 8, 32


def words(seed: int, n: int) -> str:
    return " ".join(f"w{(seed * 7919 + i * 104729) % 97}" for i in range(n))


def run_and_resume(pool, tmp_path, data: str, resume_layout: str) -> tuple[dict, dict, dict]:
    """(the uninterrupted dp=2 run, the run resumed on ``resume_layout`` after STOP steps, the checkpoint's manifest)."""
    common = dict(steps=STEPS, global_batch=GLOBAL_BATCH, seq_len=SEQ, data=data, with_params=False)
    full = pool.run(checkpoint_tasks.train, "dp=2", **common)[0]
    stopped = pool.run(checkpoint_tasks.train, "dp=2", stop_after=STOP, checkpoint_dir=str(tmp_path / "ckpt"),
                       **common)[0]
    assert stopped["steps"] == list(range(STOP))
    checkpoint = store.verify(tmp_path / "ckpt" / store.final_name(STOP))
    log = tmp_path / "resumed.jsonl"
    resumed = pool.run(checkpoint_tasks.train, resume_layout, resume_from=str(checkpoint.path), log=str(log),
                       **common)[0]
    assert resumed["steps"] == list(range(STOP, STEPS))
    assert resumed["losses"] == pytest.approx(full["losses"][STOP:], rel=tolerances.LOSS_RTOL)
    resumed["lines"] = [json.loads(line) for line in log.read_text().splitlines()]
    return full, resumed, checkpoint.manifest


@pytest.fixture(scope="module")
def mixture(tmp_path_factory) -> str:
    """--data of two small token files, 30/70."""
    root = tmp_path_factory.mktemp("corpora")
    for name, seed in (("web", 1), ("books", 2)):
        (root / f"{name}.txt").write_text(words(seed, 3000))
        prepare([root / f"{name}.txt"], root / f"{name}.tok")
    return f"0.3:{root / 'web.tok'},0.7:{root / 'books.tok'}"


def test_a_30_70_mixture_resumes_on_another_layout(dist_pool, tmp_path, mixture):
    full, resumed, manifest = run_and_resume(dist_pool(2), tmp_path, mixture, "pp=2")
    schedule = Schedule([Fraction("0.3"), Fraction("0.7")])
    for steps_done, tokens in ((STOP, manifest["data"]["tokens"]), (STEPS, full["summary"]["data_tokens"]),
                               (STEPS, resumed["summary"]["data_tokens"])):
        web, books = schedule.counts(steps_done * GLOBAL_BATCH)
        assert tokens == {"web": web * SEQ, "books": books * SEQ}
        assert abs(web - 0.3 * steps_done * GLOBAL_BATCH) < 1  # the schedule's promise, at this prefix
    steps = [line for line in resumed["lines"] if "loss" in line and not line.get("summary")]
    assert [line["step"] for line in steps] == [4, 5, 6]
    for line in steps:
        web, books = schedule.counts(line["step"] * GLOBAL_BATCH)
        assert (line["data_tokens/web"], line["data_tokens/books"]) == (web * SEQ, books * SEQ)


def test_a_streamed_parquet_run_resumes_on_another_layout(dist_pool, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    for k in range(3):  # row groups of 8 documents: several units per shard, so the bookmark moves
        texts = [words(10 * k + i, 20 + i % 13) for i in range(40)]
        pq.write_table(pa.table({"text": texts, "id": list(range(40))}), shards / f"part-{k:03d}.parquet",
                       row_group_size=8)
    full, resumed, manifest = run_and_resume(dist_pool(2), tmp_path, str(shards), "dp=1,tp=2")
    assert full["summary"]["data_tokens"] == resumed["summary"]["data_tokens"] == {
        "shards": STEPS * GLOBAL_BATCH * SEQ}
    mark = manifest["data"]["streams"]["shards"]
    assert manifest["data"]["tokens"] == {"shards": STOP * GLOBAL_BATCH * SEQ}
    assert 0 < mark["unit"] and mark["token"] <= STOP * GLOBAL_BATCH * SEQ  # where the next sample's unit starts


def test_tensorboard_gets_a_scalar_per_source(tmp_path, mixture):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    runtime_tasks.in_one_process(checkpoint_tasks.train_logged, str(tmp_path / "run.jsonl"), str(tmp_path / "tb"),
                                 steps=2, global_batch=GLOBAL_BATCH, seq_len=SEQ, data=mixture, log_every=1)
    events = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    schedule = Schedule([Fraction("0.3"), Fraction("0.7")])
    for index, name in enumerate(("web", "books")):
        assert [(e.step, e.value) for e in events.Scalars(f"data_tokens/{name}")] == [
            (step, schedule.counts(step * GLOBAL_BATCH)[index] * SEQ) for step in (1, 2)]
