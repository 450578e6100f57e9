"""The metrics JSONL file (``plait.run.observe.jsonl``): what the writer writes, the reader reads back."""

from __future__ import annotations

import json

import pytest

from plait.errors import PlaitError
from plait.measure.report.train_log import read_train_log
from plait.measure.sweep.run_one import read_summary
from plait.measure.sweep.timing import step_times_of_log
from plait.run.metrics import RunSummary, StepRecord
from plait.run.observe.jsonl import HEADER, JsonlLog, last_summary, read_log

STEPS = [StepRecord(step=i, loss=3.0 - i / 4, lr=1e-3, grad_norm=0.5, step_time_s=0.25 + i / 8,
                    tokens_per_s=1024.0, mfu=None) for i in range(3)]
SUMMARY = RunSummary(steps=3, final_loss=2.5, step_time_s=0.5, tokens_per_s=1024.0, mfu=None,
                     peak_memory_bytes=None, peak_host_rss_bytes=2**20, device="cpu", world_size=1, layout="dp=1")


def write_run(path, summary: bool = True) -> list[dict]:
    log = JsonlLog(str(path))
    records = [record.to_dict() for record in STEPS] + ([SUMMARY.to_dict()] if summary else [])
    for record in records:
        log.write(record)
    log.close()
    return records


def test_a_written_log_reads_back_record_for_record_after_its_format_line(tmp_path):
    path = tmp_path / "run.jsonl"
    records = write_run(path)
    assert json.loads(path.read_text().splitlines()[0]) == {"format": "plait-metrics/1"} == HEADER
    assert read_log(path) == records
    assert last_summary(read_log(path)) == read_summary(path) == SUMMARY.to_dict()
    assert step_times_of_log(path) == [record.step_time_s for record in STEPS]
    assert read_train_log(path).loss == [(record.step + 1, record.loss) for record in STEPS]


def test_a_cut_short_last_line_and_a_line_that_is_not_json_are_skipped(tmp_path):
    path = tmp_path / "run.jsonl"
    records = write_run(path, summary=False)
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(2, "not json at all\n")
    lines.insert(3, "[1, 2]\n")  # JSON, but not a record
    path.write_text("".join(lines) + '{"step": 4, "lo')
    assert read_log(path) == records
    assert read_summary(path) is None
    assert step_times_of_log(path) == [record.step_time_s for record in STEPS]


def test_a_log_without_the_format_line_reads_the_same(tmp_path):
    path = tmp_path / "old.jsonl"
    records = write_run(path)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[1:]))  # as plait wrote it before
    assert read_log(path) == records


def test_appending_writes_no_second_format_line(tmp_path):
    path = tmp_path / "run.jsonl"
    write_run(path, summary=False)
    log = JsonlLog(str(path), append=True, resume_step=2)  # steps 1..2 done: step 3 is set aside
    log.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines.count(HEADER) == 1 and lines[0] == HEADER
    assert [record["step"] for record in read_log(path) if "loss" in record] == [1, 2]
    assert read_log(path)[-1]["event"] == "replayed" and read_log(path)[-1]["lines"] == [STEPS[2].to_dict()]


def test_a_log_of_a_later_version_is_refused_in_one_line(tmp_path):
    path = tmp_path / "new.jsonl"
    path.write_text(json.dumps({"format": "plait-metrics/2"}) + "\n" + json.dumps(STEPS[0].to_dict()) + "\n")
    with pytest.raises(PlaitError, match="format 'plait-metrics/2', expected 'plait-metrics/1'"):
        read_log(path)
