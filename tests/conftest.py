"""Suite-wide pytest setup. Must not import torch at import time (tests/plan/test_no_torch.py)."""

import os
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# tests/ mirrors the packages (spec, plan, run, measure, cli); helpers live in tests/support. Test
# modules import helpers and task modules by their bare names, so every folder is on the path
# (the distributed pool's workers put the same folders on theirs: tests/support/distpool.py).
TEST_FOLDERS = [os.path.join(TESTS_DIR, name) for name in sorted(os.listdir(TESTS_DIR))
                if os.path.isdir(os.path.join(TESTS_DIR, name)) and not name.startswith((".", "_"))]
for _folder in reversed(TEST_FOLDERS):
    if _folder not in sys.path:
        sys.path.insert(0, _folder)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a long test (still run in CI)")
    # A TP plan key that does not resolve only warns, and the grads are then silently wrong.
    config.addinivalue_line("filterwarnings", "error:Parallelize plan key")


@pytest.fixture(scope="session")
def dist_pool():
    """Factory: ``dist_pool(world_size)`` gives the session's live DistPool of that size (see tests/support/distpool.py).

    A pool killed by a failed task is replaced by a fresh one on the next call; all are closed at session end.
    """
    from distpool import DistPool

    pools = {}

    def get(world_size: int) -> DistPool:
        pool = pools.get(world_size)
        if pool is None or not pool.alive:
            if pool is not None:
                pool.close()
            pool = pools[world_size] = DistPool(world_size)
        return pool

    yield get
    for pool in pools.values():
        pool.close()


@pytest.fixture(scope="session")
def references():
    """Factory: ``references(model)`` is the single-process run of ``runtime_tasks.reference`` (default
    3 steps) for that model, computed once per session in this process."""
    import runtime_tasks

    cache: dict[str, dict] = {}

    def get(model: str = "tiny") -> dict:
        if model not in cache:
            cache[model] = runtime_tasks.reference(model=model)
        return cache[model]

    return get
