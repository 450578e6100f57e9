"""The environment torchrun's workers start with: threads per process and, on a CPU, the allocator.

* ``OMP_NUM_THREADS``: torchrun gives each worker 1 thread (and warns) when it is unset; plait
  shares the cores among the node's workers instead.
* glibc malloc, CPU runs only: a block above the mmap threshold (32 MiB at most) is mapped fresh
  from the OS on every allocation and unmapped when freed, so every step's large tensors - the
  logits and their gradient (tokens × vocab), the embedding and LM-head gradients (vocab ×
  hidden) - pay a page fault per 4 KiB page in the first kernel that writes them (about 1 s per
  GB on the 2-core VM of ``bench/results/cpu_loop.md``: a 60M model's LM-head GEMM ran 30% below
  the profiled GEMM rate, its fills at 1 GB/s). ``MALLOC_MMAP_MAX_=0`` serves every block from
  the heap and ``MALLOC_TRIM_THRESHOLD_`` keeps freed memory there, so the next step reuses it
  without faults (that model's step ran about 25% faster). ``MALLOC_ARENA_MAX=1`` keeps gloo's
  threads in that same heap: each of them otherwise allocates its collectives' buffers in an
  arena of its own, whose 64 MiB heap glibc maps and unmaps around every large message (the 60M
  model's ZeRO-3 steps page-faulted about 110 MB per process and step; with one arena 20 MB, and
  the step ran about 10% faster). The profile's host-time runs get the same environment, so what
  it measures is what ``plait train`` runs.

Variables the user set are left as they are, and the parent process's environment is restored
when the run ends (a sweep or a profile launches many runs from one process).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from plait.run.env import LAUNCHER_PID

CPU_ALLOCATOR = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**40), "MALLOC_ARENA_MAX": "1"}


def worker_variables(nproc_per_node: int, cpu: bool) -> dict[str, str]:
    """The variables plait adds for the workers when they are not already set (``PLAIT_LAUNCHER_PID``,
    the process the workers die with, is always this one)."""
    variables = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc_per_node))}
    if cpu:
        variables.update(CPU_ALLOCATOR)
    return variables


@contextlib.contextmanager
def worker_environment(nproc_per_node: int, cpu: bool) -> Iterator[dict[str, str]]:
    """``os.environ`` with ``worker_variables`` added where unset (torchrun passes it to the
    workers), restored on exit; yields what was added."""
    added = {k: v for k, v in worker_variables(nproc_per_node, cpu).items() if k not in os.environ}
    launcher = {LAUNCHER_PID: str(os.getpid())}  # plait.run.env.die_with_launcher
    saved = {key: os.environ.get(key) for key in [*added, *launcher]}
    os.environ.update({**added, **launcher})
    try:
        yield added
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
