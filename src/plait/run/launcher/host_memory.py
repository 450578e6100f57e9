"""Host memory of a CPU run: the planner's bytes per process against ``MemAvailable`` (no torch).

On the CPU nothing raises an out-of-memory error: the kernel's OOM killer ends a worker with
SIGKILL. So ``plait train`` checks before launching (``check``: refused with the numbers unless
``--allow-oom``), and when a worker of a CPU run is killed anyway the launcher's message carries
the same numbers (``HostMemory.describe``).

The bytes per process are the planner's (``plait.run.launcher.micro_batch.cpu_process_bytes``:
model states 16 bytes per parameter, activations counted twice because the CPU runs in fp32);
the interpreter and torch's own few hundred MiB per process are not in them.
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.errors import PlaitError
from plait.spec.units import DEFAULT_GPU, GIB, MIB


@dataclass(frozen=True)
class HostMemory:
    """What the processes of one host are predicted to need, and what the host had available."""

    per_process: float  # bytes one process needs at its peak (planner)
    processes: int  # processes of the run on this host
    available: float | None  # MemAvailable before launch, bytes (None: /proc/meminfo unreadable)

    @property
    def need(self) -> float:
        """Bytes all the processes of this host need together."""
        return self.per_process * self.processes

    @property
    def fits(self) -> bool:
        return self.available is None or self.need <= self.available

    def describe(self) -> str:
        """``the planner predicted 3.1 GiB per process (× 4 = 12.4 GiB), this host has 9.0 GiB available``."""
        text = f"the planner predicted {_size(self.per_process)} per process"
        if self.processes > 1:
            text += f" (× {self.processes} = {_size(self.need)})"
        if self.available is None:
            return text + "; this host's available memory is unknown (no MemAvailable in /proc/meminfo)"
        return text + f", this host has {_size(self.available)} available"

    def kill_note(self) -> str:
        """``describe`` for a worker the OS killed; when the prediction fits, it says so."""
        if self.fits and self.available is not None:
            return self.describe() + " (that fits: other processes' memory, or the scheduler, may be the cause)"
        return self.describe()


def _size(nbytes: float) -> str:
    """GiB with one decimal, or MiB below 1 GiB (a tiny model is not "0.0 GiB")."""
    return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB else f"{nbytes / MIB:.1f} MiB"


def host_memory(config, processes: int, available: float | None = None) -> HostMemory:
    """The planner's host memory for ``config`` (a RunConfig) run by ``processes`` processes on this host;
    ``available`` defaults to this host's ``MemAvailable``."""
    from plait.plan.memory import estimate_memory
    from plait.run.launcher.micro_batch import cpu_process_bytes, host_available_bytes
    from plait.spec.hardware import cluster_for_gpu

    job = config.job
    cluster = cluster_for_gpu(DEFAULT_GPU, job.layout.world_size)  # only the memory items are used
    per_process = cpu_process_bytes(estimate_memory(job.model, cluster, job.job_spec, job.layout))
    return HostMemory(per_process, processes, host_available_bytes() if available is None else available)


def of_cpu_run(config, processes: int) -> HostMemory | None:
    """``host_memory`` of a run on the CPU (None on GPU: device memory is checked there, and a GPU
    out-of-memory is an error the worker reports itself)."""
    from plait.run.device import uses_gpu

    return None if uses_gpu(config.runtime.device) else host_memory(config, processes)


def check(memory: HostMemory, allow_oom: bool) -> list[str]:
    """Refuse (PlaitError) a CPU run predicted not to fit in the host's available memory, or with
    ``allow_oom`` return the warning."""
    if memory.fits:
        return []
    message = (f"this CPU run is predicted not to fit in host memory: {memory.describe()}; the OS would kill "
               "a worker (SIGKILL). Use fewer processes (--nproc-per-node), a smaller model, batch or mbs, "
               "ckpt=full, or zero=3")
    if not allow_oom:
        raise PlaitError(message + "; --allow-oom runs it anyway")
    return [message]
