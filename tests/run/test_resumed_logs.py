"""A resumed run's JSONL log and TensorBoard events continue without duplicates (issue 31 item 9): the
lines of the steps after the resumed checkpoint, about to be re-run, move into one "replayed" line
(nothing written is lost, every step appears once), and TensorBoard purges those steps' events."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorboard")

import checkpoint_tasks
import runtime_tasks

from plait.run.checkpoint import store


def test_a_resumed_run_logs_every_step_once(tmp_path):
    log, tb = tmp_path / "run.jsonl", tmp_path / "tb"
    runtime_tasks.in_one_process(checkpoint_tasks.train_logged, str(log), str(tb), steps=4,
                                 checkpoint_dir=str(tmp_path / "a"), checkpoint_every=2)
    with open(log, "a", encoding="utf-8") as handle:
        handle.write('{"step": 5, "lo')  # a line cut short by a kill
    runtime_tasks.in_one_process(checkpoint_tasks.train_logged, str(log), str(tb), steps=4,
                                 checkpoint_dir=str(tmp_path / "b"),
                                 resume_from=str(tmp_path / "a" / store.final_name(2)))
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [line for line in lines if "loss" in line and not line.get("summary")]
    assert [line["step"] for line in steps] == [1, 2, 3, 4]
    [replayed] = [line for line in lines if line.get("event") == "replayed"]
    assert replayed["after_step"] == 2 and replayed["lines"][-1] == {"raw": '{"step": 5, "lo'}
    first_run = {line["step"]: line["loss"] for line in replayed["lines"] if "loss" in line}
    assert first_run == {s["step"]: s["loss"] for s in steps[2:]}  # the re-run steps, bit for bit
    assert [line.get("event") for line in lines].count("resume") == 1

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tb))
    events.Reload()
    assert [event.step for event in events.Scalars("loss")] == [1, 2, 3, 4]
