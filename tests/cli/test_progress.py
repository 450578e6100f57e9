"""plait.progress.ProgressBar off a terminal: numbered plain lines, every N-th and the last."""

from __future__ import annotations

from plait.progress import ProgressBar


def test_plain_lines_every_n_items_and_the_last(capsys):
    """Lines at items N, 2N, ... (counted from 1, as --checkpoint-every counts) and the last."""
    bar = ProgressBar("train", 7, done=2, every=2, unit="step")
    for i in range(5):
        bar.advance(f"item {i}")
    bar.message("done")
    bar.close()
    assert capsys.readouterr().out.splitlines() == ["step 4/7 item 1", "step 6/7 item 3", "step 7/7 item 4", "done"]


def test_plain_lines_start_with_the_first_item(capsys):
    bar = ProgressBar("train", 5, every=2, unit="step")
    for i in range(5):
        bar.advance(f"item {i}")
    assert capsys.readouterr().out.splitlines() == ["step 1/5 item 0", "step 2/5 item 1", "step 4/5 item 3",
                                                    "step 5/5 item 4"]


def test_disabled_prints_nothing_and_lines_off_prints_only_messages(capsys):
    quiet = ProgressBar("profile", 3, enabled=False)
    quiet.advance("x")
    quiet.message("hidden")
    silent_steps = ProgressBar("sweep", 2, lines=False)
    silent_steps.status("running")
    silent_steps.message("[1/2] dp=2: ok", markup=False)
    silent_steps.advance()
    assert capsys.readouterr().out.splitlines() == ["[1/2] dp=2: ok"]
