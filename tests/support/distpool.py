"""A persistent pool of gloo ranks on CPU for distributed test bodies.

Spawning N processes and importing torch in each costs 1.5 s (2 ranks) to 4 s
(4 ranks) on 2 cores, so the suite keeps one pool per world size and runs many
test bodies on it. The ranks are forked from a server process that imported torch
and the common task modules once (multiprocessing's forkserver, ``PRELOAD``): a
pool started later (another world size, or the replacement of a killed one) then
costs a fork per rank instead of an interpreter and its imports::

    pool = DistPool(2)                              # fork + init_process_group("gloo") once
    out = pool.run(pool_tasks.allreduce_sum, 3.0)   # fn(3.0) on every rank; rank-ordered results
    pool.close()                                    # barrier, destroy_process_group, os._exit(0)

Task functions must be module-level (they are imported by name in the workers;
every folder of ``tests`` and, if needed, ``src`` are on the workers' sys.path).
A task learns its rank from ``torch.distributed.get_rank()`` (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT are set as well). Arguments and return
values are pickled: return plain Python/numpy values or CPU tensors. ``timeout``
is run()'s own keyword. Tasks share the default process group, so they must not
init or destroy it, and every rank must issue the same collectives. Any other
group a task builds (a DeviceMesh, ``new_group``) lives only until every rank has
finished the task: the workers destroy it then (``release_task_groups``, on the
parent's ``RELEASE``), so a task must not keep one for a later task.

On the first error (a rank raises, dies, or the run times out) every worker is
killed - the others may be stuck in a collective - and ``run`` raises
``DistTaskError`` with the failing rank's traceback. The pool is then dead and
refuses further work; the ``dist_pool`` fixture replaces it with a fresh one.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import importlib
import importlib.util
import os
import pickle
import signal
import sys
import time
import traceback
import warnings
import weakref
from datetime import timedelta
from multiprocessing import connection, get_context

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC_DIR = os.path.join(os.path.dirname(TESTS_DIR), "src")
# every folder of tests/ (task modules sit beside their tests; helpers in support/)
TEST_FOLDERS = [os.path.join(TESTS_DIR, name) for name in sorted(os.listdir(TESTS_DIR))
                if os.path.isdir(os.path.join(TESTS_DIR, name)) and not name.startswith((".", "_"))]
PG_TIMEOUT = timedelta(seconds=60)  # a rank stuck in a collective gives up after this instead of hanging the suite
# Warnings (message regexes) that are errors inside the workers too: pytest's filters apply only to the parent.
ERROR_WARNINGS = ("Parallelize plan key",)
# What the forkserver imports once, so that a forked rank starts with it: torch, its distributed
# packages the runtime imports on first use, and the task modules most tests run (1.5 s of CPU per
# rank on 2 cores, measured 2026-11-27, against 0.05 s for a fork). A name that fails to import is
# skipped by multiprocessing (the rank then imports it itself, as before).
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.distributed.pipelining", "torch.distributed.checkpoint",
           "plait.run.trainer", "plait.spec.models", "runtime_tasks", __name__)


# What the parent sends every rank once all have replied to a task: release the task's process groups
# now (``release_task_groups``). A pool that then waits idle (another world size's pool is running, or
# its next task is files away) would otherwise keep them: every gloo group holds a TCP loop thread, which
# keeps waking while idle, and two worker threads per rank. Measured in a clean-clone suite on 2 cores
# (2026-11-29): idle pools held up to 36 groups per rank (110 threads, 5% of a core each) and burned half
# a core between them.
RELEASE = "release"


class DistTaskError(RuntimeError):
    """A task failed on some rank, timed out, or the pool could not start / is dead."""


def _worker(rank, world_size, port, conn, parent_pid, error_warnings):
    """Worker main loop: init gloo once, then run (module, name, args, kwargs) tasks until told to stop."""
    os.setpgid(0, 0)  # own process group: Ctrl-C is the parent's business, and kill covers any children
    if sys.platform.startswith("linux"):  # die with the parent, even if it is SIGKILLed
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if _gone(parent_pid):  # the forkserver is the parent; the pool's owner died before prctl
        os._exit(1)
    # a crash in native code (a SIGSEGV in gloo was seen once) prints every thread's Python stack to
    # stderr, which pytest shows with the failing test
    faulthandler.enable(all_threads=True)
    for folder in reversed(TEST_FOLDERS):
        sys.path.insert(0, folder)
    if importlib.util.find_spec("plait") is None:  # e.g. a stale editable install
        sys.path.append(SRC_DIR)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # N ranks share the cores: more threads each only oversubscribe them
        store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout=PG_TIMEOUT)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=PG_TIMEOUT)
        gc.freeze()  # torch's own objects live as long as the worker: release_task_groups' collections skip them
        conn.send(("ready", None))
    except BaseException:  # noqa: BLE001 - report anything, SystemExit included
        conn.send(("err", traceback.format_exc()))
        os._exit(1)
    release_error = None  # a failed RELEASE: reported as the next task's error (it has no reply of its own)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # parent gone
            os._exit(1)
        if task is None:
            break
        if task == RELEASE:
            try:
                release_task_groups()
            except BaseException:  # noqa: BLE001 - kept for the next task's reply
                release_error = traceback.format_exc()
            continue
        module, name, args, kwargs = task
        try:
            if release_error is not None:
                raise RuntimeError(f"releasing the previous task's process groups failed:\n{release_error}")
            with warnings.catch_warnings():  # filter changes made by a task do not leak into the next
                for pattern in error_warnings:
                    warnings.filterwarnings("error", message=pattern)
                value = getattr(importlib.import_module(module), name)(*args, **kwargs)
        except BaseException:  # noqa: BLE001 - report anything, SystemExit included
            reply = ("err", traceback.format_exc())
        else:
            try:
                reply = ("ok", pickle.dumps(value))
            except Exception as e:  # noqa: BLE001 - pickling raises many kinds
                hint = "return plain Python/numpy values or CPU tensors"
                reply = ("err", f"the result {type(value).__name__} cannot be pickled ({e!r}); {hint}\n")
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            os._exit(1)
    # Clean exit; without it gloo sometimes aborts at exit with "terminate called without an active exception" (E10).
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return os.getppid() == 1


def _context():
    """The forkserver context, its server importing ``PRELOAD`` (started on the first pool, with this
    process's sys.path and environment at that time)."""
    ctx = get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def release_task_groups() -> int:
    """Destroy every process group but the default one, and the DTensor caches that name them; returns how many.

    The worker calls it on the parent's ``RELEASE``, sent once every rank has replied to a task (a
    failed task kills the pool instead), so it releases what the task built after every rank has
    finished it: no rank tears down a group a peer still uses, and no barrier is needed. Each task
    builds its own
    DeviceMesh / ``new_group()``s; left alive, every gloo group keeps 3 threads per rank for the rest
    of the session: 420-540 threads per pool process by mid-suite, which made two pytest-xdist
    workers slower than one.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    default = c10d._get_default_group()
    groups = [pg for pg in list(c10d._world.pg_names) if pg is not default]
    for pg in groups:
        dist.destroy_process_group(pg)
    pg = None
    count = len(groups)
    del groups[:]
    if count:
        _clear_mesh_caches()
        # A gloo group's threads end with its last reference, which meshes and modules keep in cycles.
        # Everything alive after this collection is frozen (out of the collector's sight), so the next
        # one scans only what later tasks leave behind: 0.5 s per rank otherwise (300k objects with torch).
        gc.collect()
        gc.freeze()
    return count


def _clear_mesh_caches() -> None:
    """Forget cached DTensor results that hold a task's DeviceMesh.

    The sharding propagation caches (Python and, from torch 2.13, the C++ dispatch fast path) key
    on specs whose meshes compare equal by shape and ranks, and return output specs holding the
    *cached* mesh: a later task's equal mesh would get one whose groups are destroyed ("Could not
    resolve the process group registered under the name N"). The redistribute planners and the
    mesh topology are cached by mesh as well. Every name is looked up, not assumed: torch 2.11 and
    2.13 differ.
    """
    try:
        from torch.distributed.tensor import debug
    except ImportError:  # no DTensor in this torch: nothing cached
        return
    debug._clear_sharding_prop_cache()  # 2.11: the Python cache; 2.13: it and the C++ fast path's
    from torch.distributed.tensor import _collective_utils, _redistribute

    for clear in (getattr(_redistribute, "clear_redistribute_planner_cache", None),
                  getattr(getattr(_redistribute, "_gen_transform_infos", None), "cache_clear", None),
                  getattr(getattr(getattr(_collective_utils, "MeshTopoInfo", None), "build_from_mesh", None),
                          "cache_clear", None)):
        if clear is not None:
            clear()


class DistPool:
    """``world_size`` gloo ranks (forked processes) that run module-level functions on every rank."""

    def __init__(self, world_size: int, start_timeout: float = 120.0, error_warnings=ERROR_WARNINGS):
        import torch.distributed as dist  # the parent hosts the rendezvous store: no free-port race

        self.world_size = world_size
        self._alive = False
        self._store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=PG_TIMEOUT, wait_for_workers=False)
        ctx = _context()
        self.processes, self._conns = [], []
        _LIVE.add(self)
        try:
            for rank in range(world_size):
                parent_end, child_end = ctx.Pipe()
                p = ctx.Process(target=_worker, name=f"distpool-ws{world_size}-rank{rank}",
                                args=(rank, world_size, self._store.port, child_end, os.getpid(), tuple(error_warnings)))
                p.start()
                child_end.close()  # so that a dead worker reads as EOF here
                self.processes.append(p)
                self._conns.append(parent_end)
            self._collect(start_timeout, "starting the pool")
        except BaseException:
            self.kill()
            raise
        self._alive = True

    @property
    def alive(self) -> bool:
        """True while the pool can take work: started, no task failed, not closed, no worker gone."""
        return self._alive and all(p.exitcode is None for p in self.processes)

    def run(self, fn, *args, timeout: float = 120.0, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the per-rank results in rank order.

        ``fn`` is a module-level function (or a "module:function" string). Raises DistTaskError
        (and kills the pool) if any rank raises, dies, or the run takes longer than ``timeout`` s.
        """
        if not self.alive:
            raise DistTaskError(f"DistPool(world_size={self.world_size}) is dead (an earlier task failed or it was closed)")
        if isinstance(fn, str):
            module, _, name = fn.partition(":")
        else:
            module, name = fn.__module__, fn.__qualname__
        if module == "__main__" or "<locals>" in name or not name:
            raise ValueError(f"{fn!r} is not a module-level function the workers can import")
        task, what = (module, name, args, kwargs), f"running {module}.{name}"
        try:
            for rank, conn in enumerate(self._conns):
                try:
                    conn.send(task)
                except OSError:
                    raise DistTaskError(f"rank {rank} is gone (exit code {self.processes[rank].exitcode})") from None
            replies = self._collect(timeout, what)
            for conn in self._conns:  # every rank is done with the task's groups: drop them now, not at the next task
                try:
                    conn.send(RELEASE)
                except OSError:  # a rank gone after its reply: the next run reports it
                    pass
            return [pickle.loads(v) for v in replies]
        except BaseException:
            self.kill()  # on any failure, or Ctrl-C: the ranks may be stuck in a collective
            raise

    def _collect(self, timeout: float, what: str) -> list:
        """One reply from every rank, or DistTaskError naming the first failing rank (its traceback included)."""
        replies, pending = {}, dict(zip(self._conns, range(self.world_size)))
        deadline = time.monotonic() + timeout
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(pending.values())
                raise DistTaskError(f"timeout: {what} took longer than {timeout:g} s; no reply from rank(s) {missing}")
            for conn in connection.wait(list(pending), timeout=remaining):
                rank = pending.pop(conn)
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    proc = self.processes[rank]
                    proc.join(1)
                    raise DistTaskError(f"rank {rank} died while {what} (exit code {proc.exitcode})") from None
                if status == "err":
                    errors = sorted([(rank, value), *self._late_errors(pending)])
                    text = "".join(f"\n--- rank {r} also raised:\n{tb}" for r, tb in errors[1:])
                    raise DistTaskError(f"rank {errors[0][0]} raised while {what}:\n{errors[0][1]}{text}")
                replies[rank] = value
        return [replies[r] for r in range(self.world_size)]

    @staticmethod
    def _late_errors(pending, grace: float = 0.2) -> list:
        """(rank, traceback) of other ranks that fail within ``grace`` s (they may have failed on their own, too)."""
        errors, deadline = [], time.monotonic() + grace
        while pending and (remaining := deadline - time.monotonic()) > 0:
            for conn in connection.wait(list(pending), timeout=remaining):
                rank = pending.pop(conn)
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    continue
                if status == "err":
                    errors.append((rank, value))
        return errors

    def kill(self) -> None:
        """SIGKILL every worker (and anything it started); the pool is dead afterwards."""
        self._alive = False
        for p in self.processes:
            if p.pid is None:
                continue
            try:  # the worker's process group outlives it while its children do
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if p.exitcode is None:  # not yet in its own group (still starting)
                p.kill()
        for p in self.processes:
            p.join(5)
        self._release()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the workers cleanly (barrier, destroy_process_group, exit 0); kill whatever is left after ``timeout`` s."""
        if self.alive:
            self._alive = False
            for conn in self._conns:
                try:
                    conn.send(None)
                except OSError:
                    pass
            deadline = time.monotonic() + timeout
            for p in self.processes:
                p.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def _release(self) -> None:
        for conn in self._conns:
            conn.close()
        self._conns = []
        self._store = None  # drops the parent's rendezvous server
        _LIVE.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_LIVE):
        pool.close(timeout=5.0)
