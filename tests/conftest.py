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


def suite_workers(config) -> int:
    """How many pytest-xdist workers run this session: ``PLAIT_TEST_WORKERS`` (default 0: in this process).

    With N > 1 the whole suite (no paths given) runs on N workers, file by file (``--dist loadfile``:
    a module's fixtures are built once). It is off by default: on a 2-core clean clone (2026-11-27)
    two workers drove the load average to 450 and ran slower than one process, because each worker
    keeps its own session pools of 2- and 4-rank gloo processes (``dist_pool``), whose process groups
    (one per layout a task builds) are never destroyed and hold ~500 threads each by mid-suite.
    ``-n N`` on the command line still wins; given paths always run in this process.
    """
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return 0
    if config.getoption("numprocesses", None) is not None or config.getoption("collectonly"):
        return 0  # -n given (it wins), or nothing runs
    if config.getoption("usepdb", False):
        return 0
    wanted = max(0, int(os.environ.get("PLAIT_TEST_WORKERS", "0")))
    testpaths = getattr(pytest.Config, "ArgsSource", None)  # pytest >= 7.2
    if wanted <= 1 or testpaths is None or config.args_source != testpaths.TESTPATHS:
        return 0
    return wanted


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own pytest_configure (trylast) starts the workers
def pytest_configure(config):
    workers = suite_workers(config)
    if workers:
        config.option.numprocesses = workers
        config.option.dist = "loadfile"
        config.option.tx = ["popen"] * workers
        config.option.loadscopereorder = False  # files in collection order (LONGEST_FIRST), not by test count
    config.addinivalue_line("markers", "slow: a long test (still run in CI)")
    # A TP plan key that does not resolve only warns, and the grads are then silently wrong.
    config.addinivalue_line("filterwarnings", "error:Parallelize plan key")


# Under xdist, files go to the workers in the workers' collection order, so the folders with the longest
# files go first (tests/run holds the multi-rank parity runs): a long file handed out last would leave
# one core idle at the end (xdist's own order, by test count, hands out files of few long tests last).
LONGEST_FIRST = ("run", "cli", "measure", "support", "plan", "spec")


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # in this process: pytest's own order, as before
        return

    def folder_rank(item) -> int:
        parts = os.path.relpath(str(item.path), TESTS_DIR).split(os.sep)
        return LONGEST_FIRST.index(parts[0]) if len(parts) > 1 and parts[0] in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=folder_rank)  # stable: each file's tests keep their order, and stay together


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
