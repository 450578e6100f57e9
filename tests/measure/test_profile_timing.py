"""The profile's timing of work whose ratio is fitted (attention backward over forward): batches
interleaved, so that a busy spell of a shared machine slows both sides of the ratio, not one. A fake
clock stands in for the device: each call advances it by its cost times the machine's slowness."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from plait.measure.profile import bench  # noqa: E402


class FakeMachine:
    """A clock that a call advances by ``cost``, ``factor`` times more when it starts inside the busy
    spell [``busy_from``, ``busy_to``) seconds."""

    def __init__(self, busy_from: float, busy_to: float, factor: float):
        self.now, self.calls = 0.0, 0
        self.busy_from, self.busy_to, self.factor = busy_from, busy_to, factor

    def clock(self) -> float:
        return self.now

    def work(self, cost: float):
        def fn():
            slow = self.factor if self.busy_from <= self.now < self.busy_to else 1.0
            self.now += cost * slow
            self.calls += 1
        return fn


def _timed(monkeypatch, machine: FakeMachine, interleaved: bool) -> tuple[float, float]:
    monkeypatch.setattr(bench.time, "perf_counter", machine.clock)
    forward, backward = machine.work(1e-3), machine.work(3e-3)  # a backward 2x the forward: fwd+bwd = 3x
    cpu = torch.device("cpu")
    if interleaved:
        return tuple(bench.time_interleaved([forward, backward], cpu, min_time_s=1e-2))
    return bench.time_call(forward, cpu, 1e-2), bench.time_call(backward, cpu, 1e-2)


def test_a_busy_spell_on_one_side_distorts_sequential_timing_not_interleaved(monkeypatch):
    # interleaved: warm-ups and sizing calls end at 8 ms, round 1 (10 forward calls, 3 backward) at
    # 27 ms; the spell slows round 2 (to 217 ms) and round 3 is quiet, so the medians are rounds 1 and 3.
    # Sequential: the forward's batches end near 77 ms, and the spell covers all of the backward's.
    busy = (0.0265, 0.2165)
    fwd, fwd_bwd = _timed(monkeypatch, FakeMachine(*busy, factor=10.0), interleaved=False)
    assert (fwd_bwd - fwd) / fwd > 20  # the profile's backward factor, off by an order of magnitude
    fwd, fwd_bwd = _timed(monkeypatch, FakeMachine(*busy, factor=10.0), interleaved=True)
    assert (fwd_bwd - fwd) / fwd == pytest.approx(2.0)


def test_interleaved_timing_on_a_quiet_machine_is_time_calls(monkeypatch):
    quiet = FakeMachine(0.0, 0.0, factor=1.0)
    assert _timed(monkeypatch, quiet, interleaved=True) == pytest.approx((1e-3, 3e-3))
    assert _timed(monkeypatch, FakeMachine(0.0, 0.0, 1.0), interleaved=False) == pytest.approx((1e-3, 3e-3))


def test_time_call_runs_the_agreed_number_of_calls(monkeypatch):
    machine = FakeMachine(0.0, 0.0, 1.0)
    monkeypatch.setattr(bench.time, "perf_counter", machine.clock)
    seconds = bench.time_call(machine.work(1e-3), torch.device("cpu"), 1e-2, agree=lambda calls: 4)
    assert seconds == pytest.approx(1e-3)
    assert machine.calls == 2 + 3 * 4  # the warm-up and the sizing call, then 3 batches of the agreed 4
