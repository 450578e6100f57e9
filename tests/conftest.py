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


DEFAULT_WORKERS = 2  # the CI machine has 2 cores; measured there (docs/testing.md)


def suite_workers(config) -> int:
    """How many pytest-xdist workers run this session: ``PLAIT_TEST_WORKERS`` (default 2; 0 or 1: in this process).

    The whole suite (no paths given) runs on N workers when pytest-xdist is installed (it is in the
    ``test`` extra; without it the suite runs in this process), file by file (``--dist loadfile``: a
    module's fixtures are built once), and each worker's torch computes on one thread
    (pytest_runtest_setup). On a 2-core clone (2026-11-27) 8 files on the gloo pools ran in 66 s on
    two workers against 98 s in one process, and with 6 planner/CLI files added 110 s against 152 s.
    Before, two workers had been slower than one process: their 2-thread OpenMP teams spun at their
    barriers on 2 shared cores (188 s against 98 s), and earlier still the pools' leaked gloo groups
    drove the load to 450 (tests/support/distpool.py, release_task_groups, fixed that).
    ``-n N`` on the command line still wins; given paths always run in this process.
    """
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return 0
    if config.getoption("numprocesses", None) is not None or config.getoption("collectonly"):
        return 0  # -n given (it wins), or nothing runs
    if config.getoption("usepdb", False):
        return 0
    wanted = max(0, int(os.environ.get("PLAIT_TEST_WORKERS", str(min(DEFAULT_WORKERS, os.cpu_count() or 1)))))
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
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput") \
            and config.getoption("numprocesses", None) not in (None, 0, "0"):
        one_thread_each()
    config.addinivalue_line("markers", "slow: a long test (still run in CI)")
    # A TP plan key that does not resolve only warns, and the grads are then silently wrong.
    config.addinivalue_line("filterwarnings", "error:Parallelize plan key")


def one_thread_each() -> None:
    """``OMP_NUM_THREADS=1`` (unless set) for the xdist workers and every process they start.

    The workers' own torch computes on one thread (pytest_runtest_setup), but the processes the tests
    start - ``plait train``'s ranks with one process per node (it gives them cores // nproc threads),
    the CLI and bench scripts run as subprocesses (bench/gpu_proof.sh's dry run, ``plait profile``,
    ``plait sweep``) - took torch's default, 2 threads, while the other worker kept the other core
    busy: their OpenMP teams spun at their barriers for a descheduled peer. Measured on the 2-core VM
    (2026-11-27, load 4 from other jobs): the gpu_proof dry run took 75 s of wall time and 51 s of
    CPU with 2 threads, 30 s and 22 s with one (the same spin in one process beside other jobs: a
    20-token ``plait generate`` of the tiny model took 2.7-12 s with 2 threads, 0.1 s with one). Set in the controller before the workers start, so that
    they inherit it; tests that check thread counts pass or clear the variable themselves."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")


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


def pytest_runtest_setup(item):
    """On an xdist worker, torch computes on one thread: two workers' 2-thread OpenMP teams on 2 cores
    (plus the pools' ranks) spin at their barriers for descheduled peers; that made the workers
    slower than one process (with an OMP_NUM_THREADS of the user's, too: one_thread_each keeps it)."""
    if hasattr(item.config, "workerinput") and "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)


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
