"""plait.progress.ProgressBar off a terminal: numbered plain lines, every N-th and the last."""

from __future__ import annotations

from plait.progress import ProgressBar


def test_plain_lines_every_n_items_and_the_last(capsys):
    bar = ProgressBar("train", 7, done=2, every=2, unit="step")
    for i in range(5):
        bar.advance(f"item {i}")
    bar.message("done")
    bar.close()
    assert capsys.readouterr().out.splitlines() == ["step 3/7 item 0", "step 5/7 item 2", "step 7/7 item 4", "done"]


def test_disabled_prints_nothing_and_lines_off_prints_only_messages(capsys):
    quiet = ProgressBar("profile", 3, enabled=False)
    quiet.advance("x")
    quiet.message("hidden")
    silent_steps = ProgressBar("sweep", 2, lines=False)
    silent_steps.status("running")
    silent_steps.message("[1/2] dp=2: ok", markup=False)
    silent_steps.advance()
    assert capsys.readouterr().out.splitlines() == ["[1/2] dp=2: ok"]
