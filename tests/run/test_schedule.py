"""Learning-rate schedules (plait.run.optim.lr_at): exact values at chosen steps, the floor, and the
checks of the optimizer settings. Pure functions of the step: one process, no process group."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from plait.cli import main
from plait.errors import PlaitError
from plait.run.checkpoint.select import check_given
from plait.run.config import OptimConfig, RunConfig, TrainJob
from plait.run.launcher.request import TrainRequest
from plait.run.launcher.resolve import _same_run_flags
from plait.run.optim import decay_start, lr_at
from plait.spec.layout import Layout
from plait.spec.models import get_model

EXACT = 1e-15  # one or two fp64 roundings of values O(1)


def rates(config: OptimConfig, total: int) -> list[float]:
    return [lr_at(step, total, config) for step in range(total)]


def test_the_default_is_the_original_cosine_to_a_tenth():
    config = OptimConfig(lr=1.0, warmup_steps=4)
    assert (config.schedule, config.floor_lr) == ("cosine", 0.1)
    assert rates(config, 20)[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]  # warm-up, then p = 0 at step 4
    # p = (12 - 4) / (20 - 4) = 1/2: halfway down the cosine
    assert lr_at(12, 20, config) == pytest.approx(0.1 + 0.9 * 0.5, abs=EXACT)
    # the last step sits one increment above the floor; step T (one past the last) is the floor
    assert lr_at(19, 20, config) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 15 / 16)), abs=EXACT)
    assert lr_at(20, 20, config) == pytest.approx(0.1, abs=EXACT)
    assert OptimConfig().floor_lr == pytest.approx(3e-5, rel=EXACT)


def test_min_lr_is_an_absolute_floor():
    config = OptimConfig(lr=2.0, warmup_steps=0, min_lr=0.5)
    assert config.floor_lr == 0.5
    assert lr_at(0, 10, config) == 2.0
    assert lr_at(5, 10, config) == pytest.approx(0.5 + 1.5 * 0.5, abs=EXACT)
    assert lr_at(10, 10, config) == pytest.approx(0.5, abs=EXACT)
    assert lr_at(25, 10, config) == pytest.approx(0.5, abs=EXACT)  # past the end: stays at the floor


def test_linear_decays_in_equal_steps():
    config = OptimConfig(lr=1.0, warmup_steps=2, schedule="linear", min_lr=0.0)
    values = rates(config, 12)
    assert values[:2] == [0.5, 1.0]
    # p = (s - 2) / 10 after the warm-up
    assert values[2:] == pytest.approx([1.0 - k / 10 for k in range(10)], abs=EXACT)


def test_wsd_is_stable_then_decays_to_the_floor_on_the_last_step():
    config = OptimConfig(lr=1.0, warmup_steps=2, schedule="wsd", min_lr=0.1, decay_fraction=0.2)
    assert decay_start(20, config) == 16  # the last round(0.2 × 20) = 4 steps decay
    values = rates(config, 20)
    assert values[:2] == [0.5, 1.0]
    assert values[2:16] == [1.0] * 14
    assert values[16:] == pytest.approx([0.1 + 0.9 * (1 - k / 4) for k in (1, 2, 3, 4)], abs=EXACT)
    assert values[19] == pytest.approx(0.1, abs=EXACT)


def test_wsd_decay_never_starts_inside_the_warm_up():
    config = OptimConfig(lr=1.0, warmup_steps=5, schedule="wsd", min_lr=0.0, decay_fraction=0.5)
    assert decay_start(6, config) == 5  # T - round(3) = 3 would cut into the warm-up
    assert rates(config, 6) == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 0.0], abs=EXACT)


def test_wsd_decays_at_least_one_step():
    config = OptimConfig(lr=1.0, warmup_steps=1, schedule="wsd", min_lr=0.25, decay_fraction=0.01)
    assert decay_start(10, config) == 9  # round(0.1) = 0 steps, raised to 1
    assert rates(config, 10) == [1.0] * 9 + [0.25]


def test_constant_holds_the_peak_after_the_warm_up():
    config = OptimConfig(lr=0.5, warmup_steps=2, schedule="constant")
    assert rates(config, 6) == [0.25, 0.5, 0.5, 0.5, 0.5, 0.5]


@pytest.mark.parametrize("fields, words", [
    ({"schedule": "step"}, "lr_schedule='step' must be one of cosine, linear, wsd, constant"),
    ({"min_lr": 1.0}, "min_lr=1.0 must be between 0 and lr"),
    ({"min_lr": -1e-5}, "must be between 0 and lr"),
    ({"min_lr": float("nan")}, "must be between 0 and lr"),
    ({"schedule": "constant", "min_lr": 0.0}, "min_lr has no effect with lr_schedule=constant"),
    ({"decay_fraction": 0.0}, "decay_fraction=0.0 must be in (0, 1]"),
    ({"decay_fraction": 1.5}, "decay_fraction=1.5 must be in (0, 1]"),
])
def test_bad_schedule_settings_are_refused(fields, words):
    with pytest.raises(PlaitError, match="invalid run") as caught:
        OptimConfig(lr=1e-3, **fields)
    assert words in str(caught.value)


def test_schedule_settings_round_trip_json():
    optim = OptimConfig(lr=1e-3, schedule="wsd", min_lr=1e-5, decay_fraction=0.3)
    config = RunConfig(job=TrainJob(model=get_model("tiny"), layout=Layout.parse("dp=1"), global_batch=8, seq_len=32),
                       optim=optim)
    assert RunConfig.from_dict(config.to_dict()).optim == optim


def test_decay_fraction_without_wsd_is_refused_on_the_command_line(capsys):
    argv = ["train", "--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--device", "cpu", "--dry-run"]
    assert main(argv + ["--decay-fraction", "0.3"]) == 2
    assert "--decay-fraction applies to --lr-schedule wsd only" in capsys.readouterr().err
    assert main(argv + ["--lr-schedule", "wsd", "--decay-fraction", "0.3", "--min-lr", "1e-5"]) == 0


def test_a_resumed_run_keeps_its_schedule():
    saved = RunConfig(job=TrainJob(model=get_model("tiny"), layout=Layout.parse("dp=1"), global_batch=8, seq_len=32),
                      optim=OptimConfig(schedule="wsd"))
    check_given(saved, _same_run_flags(TrainRequest(lr_schedule="wsd"), saved, implicit=False))  # the same: fine
    for request, flag in ((TrainRequest(lr_schedule="cosine"), "--lr-schedule"),
                          (TrainRequest(min_lr=1e-6), "--min-lr"), (TrainRequest(decay_fraction=0.5), "--decay-fraction")):
        with pytest.raises(PlaitError, match=f"{flag} .* differs from the checkpoint's"):
            check_given(saved, _same_run_flags(request, saved, implicit=False))
