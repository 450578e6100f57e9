"""Honest step times for a sweep: warm-up excluded, medians, spreads, repeats and the noisy flag. No torch.

A ``plait train`` run writes one JSONL line per optimizer step (``step_time_s``, seconds). The sweep
drops the first ``warmup`` steps of every run and takes the median of the rest (``RunTiming``). A
layout run ``R`` times (``--repeats``) reports the median of its runs' medians (``LayoutTiming``).

Spread (seconds): with one run, the interquartile range of its post-warm-up step times; with
several, the range (max - min) of the runs' medians. After the sweep a layout is *noisy* when its
spread exceeds the gap (in measured step time) to its nearest neighbour in the measured ranking:
its place in the ranking is not settled by the measurement (``noisy_flags``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from plait.errors import PlaitError
from plait.run.observe.jsonl import is_summary, read_log


# What a sweep times when --repeats and --min-time are not given. CPU runs (``bench/sweep_noise.py``,
# bench/results/sweep_noise.md): the processes of a run compute and communicate in lockstep on the
# cores they share with the host, so single runs of identical code landed up to 76% apart with 2
# timed steps and 38% with at least 1 s timed; the median of 3 runs of at least 1 s each kept two
# reports of identical code within 25% of each other. GPU runs keep one run of --steps steps: their
# processes do not share the compute, and every extra run pays the start-up again.
CPU_REPEATS = 3
CPU_MIN_TIME_S = 1.0


def default_repeats(cpu_runs: bool) -> int:
    """Runs per layout when --repeats is not given: ``CPU_REPEATS`` for CPU runs, else 1."""
    return CPU_REPEATS if cpu_runs else 1


def default_min_time_s(cpu_runs: bool) -> float:
    """Seconds of post-warm-up steps per run when --min-time is not given: ``CPU_MIN_TIME_S`` for CPU
    runs, else 0 (the steps as given)."""
    return CPU_MIN_TIME_S if cpu_runs else 0.0


def default_warmup_steps(steps: int) -> int:
    """Warm-up steps ``plait train``'s summary skips (``plait.run.metrics.steady_state``): none for a
    one-step run, the first step, or the first two when there are at least six steps."""
    return 2 if steps >= 6 else 1 if steps >= 2 else 0


def check_warmup(steps: int, warmup: int) -> None:
    """A PlaitError unless at least one step is left after ``warmup`` warm-up steps."""
    if warmup < 0:
        raise PlaitError(f"--warmup-steps {warmup}: must be 0 or more")
    if steps <= warmup:
        raise PlaitError(f"--steps {steps} leaves no step to measure after {warmup} warm-up step(s); "
                         f"give --steps {warmup + 1} or more (or fewer --warmup-steps)")


def quartiles(values: list[float]) -> tuple[float, float]:
    """(first, third) quartile, linear interpolation between order statistics (numpy's default)."""
    data = sorted(values)
    if len(data) == 1:
        return data[0], data[0]

    def at(q: float) -> float:
        position = q * (len(data) - 1)
        low = math.floor(position)
        high = min(low + 1, len(data) - 1)
        return data[low] + (data[high] - data[low]) * (position - low)

    return at(0.25), at(0.75)


@dataclass(frozen=True)
class RunTiming:
    """One run's post-warm-up step times (seconds) and their statistics."""

    step_times: tuple[float, ...]
    warmup: int

    @property
    def median(self) -> float:
        return statistics.median(self.step_times)

    @property
    def measured_seconds(self) -> float:
        """Sum of the post-warm-up step times (seconds)."""
        return sum(self.step_times)


def step_times_of_log(log_path: Path, with_profiled: bool = False) -> list:
    """Step times (seconds) of a ``plait train --log`` file, in step order (summary lines skipped);
    ``with_profiled``: (seconds, whether the step ran under the memory profiler) pairs instead."""
    steps = []
    try:
        records = read_log(log_path)
    except OSError:
        return []
    for record in records:
        if not is_summary(record) and "step" in record and isinstance(record.get("step_time_s"), (int, float)):
            steps.append((record["step"], float(record["step_time_s"]), bool(record.get("profiled"))))
    ordered = sorted(steps, key=lambda item: item[0])
    return [(seconds, profiled) for _, seconds, profiled in ordered] if with_profiled else \
        [seconds for _, seconds, _ in ordered]


def run_timing(log_path: Path, warmup: int) -> RunTiming | None:
    """The post-warm-up timing of one run's log; None when no step is left after the warm-up. A
    step that ran under the memory profiler (``"profiled": true``, the counted-memory window of a
    short CPU run) is left out too, unless it is the only one left."""
    after = step_times_of_log(log_path, with_profiled=True)[warmup:]
    times = [seconds for seconds, profiled in after if not profiled] or [seconds for seconds, _ in after]
    return RunTiming(tuple(times), warmup) if times else None


@dataclass(frozen=True)
class LayoutTiming:
    """What a layout's runs measured; every value in seconds."""

    step_time: float  # median over the runs' medians
    step_min: float  # over every post-warm-up step of every run
    step_max: float
    step_iqr: float  # interquartile range of every post-warm-up step of every run
    repeat_min: float  # the fastest run's median
    repeat_max: float  # the slowest run's median
    spread: float  # one run: step_iqr; several: repeat_max - repeat_min
    repeats: int
    measured_steps: int  # post-warm-up steps per run (the last run's)

    @staticmethod
    def of(runs: list[RunTiming]) -> LayoutTiming:
        if not runs:
            raise ValueError("a layout timing needs at least one run")
        medians = [run.median for run in runs]
        pooled = [t for run in runs for t in run.step_times]
        q1, q3 = quartiles(pooled)
        spread = q3 - q1 if len(runs) == 1 else max(medians) - min(medians)
        return LayoutTiming(step_time=statistics.median(medians), step_min=min(pooled), step_max=max(pooled),
                            step_iqr=q3 - q1, repeat_min=min(medians), repeat_max=max(medians), spread=spread,
                            repeats=len(runs), measured_steps=len(runs[-1].step_times))


def steps_for_min_time(first: RunTiming, min_time_s: float, steps: int) -> int:
    """Total steps (warm-up included) that give at least ``min_time_s`` seconds after the warm-up at
    ``first``'s median step time; never fewer than ``steps``."""
    needed = math.ceil(min_time_s / first.median) if first.median > 0 else 1
    return max(steps, first.warmup + needed)


def noisy_flags(step_times: list[float], spreads: list[float]) -> list[bool]:
    """For each layout (measured step time, spread; seconds): whether its spread exceeds the gap to
    its nearest neighbour in the ranking by measured step time. A single layout is never noisy."""
    if len(step_times) != len(spreads):
        raise ValueError("one spread per step time")
    order = sorted(range(len(step_times)), key=lambda i: step_times[i])
    flags = [False] * len(step_times)
    for position, index in enumerate(order):
        gaps = [abs(step_times[index] - step_times[order[p]]) for p in (position - 1, position + 1)
                if 0 <= p < len(order)]
        flags[index] = bool(gaps) and spreads[index] > min(gaps)
    return flags
