"""Tests of the DistPool harness itself (tests/support/distpool.py) through the dist_pool fixture."""

import os
import time

import pytest

torch = pytest.importorskip("torch")

import pool_tasks
from distpool import DistTaskError


@pytest.mark.parametrize("ws", [2, 4])
def test_results_per_rank(dist_pool, ws):
    pool = dist_pool(ws)
    out = pool.run(pool_tasks.allreduce_sum, 2.0, offset=1.0)
    total = sum((r + 1) * 2.0 + 1.0 for r in range(ws))
    assert [o["rank"] for o in out] == list(range(ws))
    assert all(o["world"] == ws and o["sum"] == total and o["threads"] == 1 for o in out)
    assert len({o["pid"] for o in out}) == ws
    for t in pool.run("pool_tasks:gather_tensor"):  # CPU tensors come back by value
        assert torch.equal(t, torch.arange(ws, dtype=torch.float32))


def test_pool_is_reused(dist_pool):
    pool = dist_pool(2)
    assert dist_pool(2) is pool
    pids = [o["pid"] for o in pool.run(pool_tasks.allreduce_sum)]
    # the same processes answer again: nothing was respawned (a wall-time bound would say less, and
    # fail on a loaded machine)
    assert [o["pid"] for o in pool.run(pool_tasks.allreduce_sum)] == pids


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_groups_a_task_builds_are_destroyed_after_it(dist_pool):
    """A task's meshes and subgroups do not outlive it: without release_task_groups every gloo group
    kept its threads (3 per group) for the rest of the session, 420-540 per pool process by mid-suite.
    The second run also proves that no cache hands it the first run's (destroyed) groups."""
    pool = dist_pool(4)
    first = pool.run(pool_tasks.build_groups)
    second = pool.run(pool_tasks.build_groups)
    after = pool.run(pool_tasks.worker_state)
    for one, two, end in zip(first, second, after):
        assert one["during"]["groups"] >= one["before"]["groups"] + 4  # the groups were there (4+ of this rank's own)
        assert one["during"]["threads"] > one["before"]["threads"]  # ... and their threads
        assert two["before"]["groups"] == end["groups"] == 1  # only the default group survives a task
        assert two["before"]["threads"] <= one["before"]["threads"] and end["threads"] <= one["before"]["threads"]
        assert two["sums"] == one["sums"] == [2.0, 2.0, 4.0, 2.0, 4.0]  # group sizes: dp, tp, dp_tp, subgroup, world
        assert torch.equal(two["product"], one["product"])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_an_idle_pool_holds_no_groups_of_its_last_task(dist_pool):
    """The groups are released as soon as every rank has replied (the parent's RELEASE), not when the
    pool's next task comes: an idle pool kept its last task's gloo threads, whose TCP loops keep
    waking (110-157 threads per rank, half a core between the idle pools of a 2-core suite)."""
    pool = dist_pool(4)
    pool.run(pool_tasks.worker_state)  # whatever an earlier test left is released before this task

    def threads() -> list[int]:  # gloo's threads (a group's TCP loop and workers), not e.g. an allocator's
        def gloo(pid: int) -> int:
            names = []
            for task in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{task}/comm") as comm:
                        names.append(comm.read())
                except OSError:  # the thread ended meanwhile
                    pass
            return sum("gloo" in name for name in names)

        return [gloo(process.pid) for process in pool.processes]

    idle = threads()
    built = pool.run(pool_tasks.build_groups)
    assert all(one["during"]["threads"] > one["before"]["threads"] for one in built)  # its groups' threads
    deadline = time.monotonic() + 60.0  # the release runs while the parent goes on; wait for it, not a bound
    while threads() != idle and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threads() == idle  # no task ran since build_groups


def test_non_importable_function_is_refused(dist_pool):
    pool = dist_pool(2)
    with pytest.raises(ValueError, match="module-level"):
        pool.run(lambda: None)
    assert pool.alive


def test_error_on_one_rank_kills_pool_then_fixture_respawns(dist_pool):
    pool = dist_pool(2)
    with pytest.raises(DistTaskError) as info:
        pool.run(pool_tasks.raise_on_rank, 1, timeout=30)
    msg = str(info.value)
    assert "rank 1 raised while running pool_tasks.raise_on_rank" in msg
    assert "Traceback" in msg and "pool_tasks.py" in msg and "ValueError: boom from rank 1" in msg
    assert not pool.alive and not any(p.is_alive() for p in pool.processes)  # rank 0 was stuck in a barrier
    with pytest.raises(DistTaskError, match="dead"):
        pool.run(pool_tasks.allreduce_sum)
    fresh = dist_pool(2)
    assert fresh is not pool and fresh.alive
    assert [o["sum"] for o in fresh.run(pool_tasks.allreduce_sum)] == [3.0, 3.0]


@pytest.mark.parametrize("task, expected", [
    (pool_tasks.exit_on_rank, r"rank 1 died while running pool_tasks.exit_on_rank \(exit code 7\)"),
    (pool_tasks.unpicklable_result, r"(?s)rank 0 raised.*cannot be pickled.*rank 1 also raised"),
    (pool_tasks.warn_plan_key, r"(?s)rank 0 raised.*UserWarning: Parallelize plan key"),
])
def test_other_failures_raise(dist_pool, task, expected):
    pool = dist_pool(2)
    with pytest.raises(DistTaskError, match=expected):
        pool.run(task, timeout=30)
    assert not pool.alive


def test_hang_hits_timeout(dist_pool):
    pool = dist_pool(2)
    t0 = time.monotonic()
    with pytest.raises(DistTaskError, match=r"timeout: running pool_tasks.hang_on_rank took longer than 10 s; "
                                            r"no reply from rank\(s\) \[0\]"):
        pool.run(pool_tasks.hang_on_rank, 0, timeout=10)  # rank 1 answers at once, even on a loaded CPU
    assert time.monotonic() - t0 < 600  # cut at run()'s timeout, not when the hang (3600 s) ends; loose for a loaded CPU
    assert not pool.alive and not any(p.is_alive() for p in pool.processes)


def test_worker_killed_while_idle_is_replaced(dist_pool):
    pool = dist_pool(2)
    pool.processes[1].kill()
    pool.processes[1].join(5)
    assert not pool.alive
    fresh = dist_pool(2)
    assert fresh is not pool and not any(p.is_alive() for p in pool.processes)
    assert [o["sum"] for o in fresh.run(pool_tasks.allreduce_sum)] == [3.0, 3.0]


def test_close_is_clean(dist_pool):
    pool = dist_pool(2)
    procs = list(pool.processes)
    pool.close()
    assert [p.exitcode for p in procs] == [0, 0]  # barrier + destroy_process_group + os._exit(0) (E10)
    assert not pool.alive
