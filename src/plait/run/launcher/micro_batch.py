"""``plait train --layout`` without ``mbs``: pick the micro-batch size, and say which (no torch at import).

A user who leaves ``mbs`` out wants the fastest micro-batch that fits, not ``mbs=1`` (gradient
accumulation over one-sequence micro-batches). The choice, printed as ``completed: mbs=N — ...``:

* with a GPU spec (``--gpu SPEC``, or the GPU torch sees when its name identifies a spec): the
  planner's fastest micro-batch that fits with the memory headroom (``plait.plan.complete``; every
  other layout key stays as given or at its default);
* on the CPU without a GPU spec: the largest micro-batch dividing the per-rank batch whose
  planner-predicted memory, for all the processes of this host, fits in ``MemAvailable``
  (``/proc/meminfo``) with ``HOST_HEADROOM`` to spare. Larger micro-batches are faster on the CPU
  (fewer, larger GEMMs; no accelerator memory to run out of). The CPU runs in fp32, so the
  activations (predicted in bf16) count twice; model states are 16 bytes per parameter either way.
* otherwise (a GPU without a spec, or ``MemAvailable`` unreadable): ``mbs=1``, said so.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from plait.errors import PlaitError
from plait.spec.layout import Layout
from plait.spec.units import DEFAULT_GPU, GIB

HOST_HEADROOM = 0.5  # fraction of MemAvailable left to the OS, the Python heap and autograd temporaries
MEMINFO = Path("/proc/meminfo")


def mbs_given(layout_text: str | None) -> bool:
    """Whether a ``--layout`` text writes ``mbs`` (no layout: not given): read from its keys, the text
    not parsed again (``plait.run.launcher.target.TrainTarget`` parsed it)."""
    keys = (item.split("=", 1)[0].strip().lower().replace("-", "_")
            for item in (layout_text or "").replace(" ", ",").split(","))
    return "mbs" in keys


def host_available_bytes(path: Path = MEMINFO) -> float | None:
    """``MemAvailable`` of ``/proc/meminfo``, bytes; None when unreadable."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_process_bytes(memory) -> float:
    """Bytes one CPU process needs, from the planner's ``MemoryBreakdown`` (see the module docstring)."""
    activations = memory.activations + memory.embedding_activations + memory.logits
    return memory.model_states + memory.zero3_buffers + 2.0 * activations


def _valid(model, job, layout: Layout) -> bool:
    from plait.spec.hardware import cluster_for_gpu
    from plait.spec.validate import errors_of, validate

    cluster = cluster_for_gpu(DEFAULT_GPU, layout.world_size)
    return not errors_of(validate(model, cluster, job, layout))


def host_mbs(model, job, layout: Layout, processes: int, available: float) -> tuple[int, str]:
    """(largest mbs whose predicted memory fits on this host, why) - see the module docstring."""
    from plait.plan.memory import estimate_memory
    from plait.spec.hardware import cluster_for_gpu
    from plait.spec.units import divisors

    per_rank = job.global_batch // layout.dp
    if per_rank < 1:
        return 1, f"the global batch {job.global_batch} is smaller than dp={layout.dp}"
    budget = available * (1 - HOST_HEADROOM)
    cluster = cluster_for_gpu(DEFAULT_GPU, layout.world_size)  # only the memory items are used
    for mbs in sorted(divisors(per_rank), reverse=True):
        candidate = dataclasses.replace(layout, mbs=mbs)
        if not _valid(model, job, candidate):
            continue
        need = processes * cpu_process_bytes(estimate_memory(model, cluster, job, candidate))
        if need <= budget or mbs == 1:
            return mbs, (f"the largest micro-batch dividing the per-rank batch {per_rank} whose predicted "
                         f"memory ({need / GIB:.1f} GiB for {processes} processes) fits in "
                         f"{1 - HOST_HEADROOM:.0%} of the host's {available / GIB:.1f} GiB available"
                         + ("" if need <= budget else " (even mbs=1 does not; it runs anyway)"))
    return 1, "no micro-batch size is valid for this layout"


def gpu_mbs(model, job, layout: Layout, gpu: str) -> tuple[int, str]:
    """(the planner's fastest mbs that fits on ``gpu``, why)."""
    from plait.plan.complete import complete
    from plait.spec.hardware import cluster_for_gpu

    cluster = cluster_for_gpu(gpu, layout.world_size)
    given = {k: v for k, v in layout.to_dict().items() if k != "mbs"}
    completion = complete(model, cluster, job, given, max_mbs=max(1, job.global_batch // layout.dp))
    why = "the planner's fastest micro-batch that fits" if completion.fits else (
        "the planner's micro-batch needing the least memory (none fits)")
    return completion.layout.mbs, f"{why} on {cluster.gpu.name}"


def choose_mbs(model, job, layout: Layout, gpu: str | None, on_gpu: bool, processes: int) -> tuple[Layout, str]:
    """``layout`` with the micro-batch size chosen, and the note ``completed: mbs=N — why``."""
    if gpu:
        try:
            mbs, why = gpu_mbs(model, job, layout, gpu)
        except PlaitError as exc:  # the layout itself is refused later, with its own message
            mbs, why = layout.mbs, f"kept: {exc}"
    elif on_gpu:
        mbs, why = 1, "this GPU has no spec (pass --gpu SPEC, or mbs=N in --layout)"
    else:
        available = host_available_bytes()
        if available is None:
            mbs, why = 1, f"{MEMINFO} has no MemAvailable to size it by"
        else:
            try:
                mbs, why = host_mbs(model, job, layout, processes, available)
            except PlaitError as exc:  # the layout itself is refused later, with its own message
                mbs, why = layout.mbs, f"kept: {exc}"
    try:
        chosen = dataclasses.replace(layout, mbs=mbs)
    except PlaitError:
        chosen, mbs, why = layout, layout.mbs, "kept the default"
    return chosen, f"completed: mbs={mbs} — {why}"


def complete_run_mbs(config, processes: int):
    """(``config`` with its layout's mbs chosen, the note) for a fresh run whose ``--layout`` left mbs out."""
    runtime, job = config.runtime, config.job
    gpu, on_gpu = runtime.gpu, False
    if not gpu and runtime.device != "cpu":
        from plait.run.device import gpu_from_device_name, local_accelerator, uses_gpu

        on_gpu = uses_gpu(runtime.device)
        gpu = gpu_from_device_name(local_accelerator() or "") if on_gpu else None
    from plait.spec.layout import JobSpec

    layout, note = choose_mbs(job.model, JobSpec(job.global_batch, job.seq_len), job.layout, gpu, on_gpu, processes)
    return dataclasses.replace(config, job=dataclasses.replace(job, layout=layout)), note


def keep_saved_mbs(layout: Layout, saved: Layout, global_batch: int) -> Layout:
    """A resumed run's ``--layout`` without mbs keeps the saved run's micro-batch when it divides the
    new per-rank batch (a requeue with the same command line trains on as it started)."""
    per_rank = global_batch // layout.dp
    return dataclasses.replace(layout, mbs=saved.mbs) if per_rank and per_rank % saved.mbs == 0 else layout
