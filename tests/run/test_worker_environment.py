"""The workers' environment (``plait.run.launcher.environment``): threads shared among the node's
workers, the CPU allocator settings on CPU runs only, the user's own values kept, the parent's
environment restored after the run. No torch."""

from __future__ import annotations

import os

from plait.run.launcher.environment import CPU_ALLOCATOR, worker_environment, worker_variables


def test_cpu_runs_get_the_allocator_settings_and_gpu_runs_do_not():
    cpu = worker_variables(2, cpu=True)
    assert cpu["MALLOC_MMAP_MAX_"] == "0" and int(cpu["MALLOC_TRIM_THRESHOLD_"]) >= 2**30
    assert cpu["MALLOC_ARENA_MAX"] == "1"  # gloo's threads allocate in the same (kept) heap
    assert cpu["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    gpu = worker_variables(2, cpu=False)
    assert set(gpu) == {"OMP_NUM_THREADS"}
    assert worker_variables(10**6, cpu=False)["OMP_NUM_THREADS"] == "1"  # never 0 threads


def test_user_values_are_kept_and_the_parent_environment_is_restored(monkeypatch):
    for key in (*CPU_ALLOCATOR, "OMP_NUM_THREADS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")  # the user's choice
    before = dict(os.environ)
    with worker_environment(2, cpu=True) as added:
        assert os.environ["MALLOC_TRIM_THRESHOLD_"] == "12345" and "MALLOC_TRIM_THRESHOLD_" not in added
        assert os.environ["MALLOC_MMAP_MAX_"] == "0" and set(added) == {"MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX", "OMP_NUM_THREADS"}
    assert dict(os.environ) == before
    try:
        with worker_environment(2, cpu=False):
            assert "MALLOC_MMAP_MAX_" not in os.environ
            raise RuntimeError("a failed run")
    except RuntimeError:
        pass
    assert dict(os.environ) == before  # restored on the way out of a failure too
