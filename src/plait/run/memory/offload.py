"""Activation offload: what chosen blocks save for the backward goes to host memory or disk.

``Layout.offload`` = α (``offload=cpu:0.5`` / ``offload=disk:0.5``): on each GPU the first
``plait.plan.activations.offloaded_layer_count`` blocks (Kwai's fraction, pipeline-stage aware)
run their forward under ``torch.autograd.graph.saved_tensors_hooks``:

  * **pack** (forward): a tensor that autograd saves is moved off the device and replaced by a
    handle. Parameters are never moved (a view of an ``nn.Parameter`` - FSDP's unsharded ones
    included - or autocast's cached bf16 copy of one), nor model buffers (RoPE tables). The unit
    moved is the tensor's *storage*: a tensor saved twice, or two views of one storage (a GEMM
    input saved by Q, K and V; a transposed view), are moved once and share the handle
    (deduplication by storage address, checked alive with a weak reference). A DTensor moves its
    local shard and is rebuilt with its mesh and placements. Deduplication is scoped to one
    block's forward (and checks the version counter): a pipeline stage's receive buffer is
    refilled in place between micro-batches, so the same live storage may hold new values.
  * **unpack** (backward): the handle gives the tensor back on the device (the same storage
    layout: views are rebuilt with ``set_``).
  * **prefetch**: when the gradient reaches a block's output (its backward is about to start),
    the transfers of that block and of the offloaded block before it in the same forward are
    started, so the previous block's tensors are on their way while this one computes; each copy
    leaves the device with the last node that saved it (the graph's handles alone hold it).
  * **double buffer** in the forward: a block's device bytes go when the block after next starts
    (on GPU once the compute stream has waited for their copy-out). Forward and backward so hold
    two blocks at most, as ``plait.plan.memory.offload_buffer_bytes`` counts.

Targets:
  * ``cpu``: on GPU, pinned host buffers and asynchronous copies on a side CUDA stream, ordered
    by events: the compute stream waits only for a copy not yet done when its tensor is needed or
    its memory let go. On CPU the same code path copies synchronously (host to host).
  * ``disk`` (SSDTrain-style): one file per storage in a fresh directory of this rank
    (``plait-offload-rank<R>-*``, made by the trainer under ``--offload-dir``, by default in the
    system temporary directory), written and read by one background I/O thread; prefetch queues
    the reads. A write that fails (e.g. ENOSPC: disk full) stops the run with a ``PlaitError``
    naming the file and the reason at the next save or load.

Counters (``OffloadStats``, per step): bytes out and back, tensors, deduplicated saves, transfer
time (side stream / I/O thread) and the time training (on GPU the compute stream) waited: exposed.
Not offloaded: what ``ckpt=balanced``'s selective checkpoint caches (``offloadable_items``); not
with ``--compile`` (refused by the run config).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.multiprocessing.reductions import StorageWeakRef

from plait.errors import PlaitError
from plait.plan.activations import offloaded_layer_count
from plait.run.memory.offload_handles import (
    OffloadStats,
    Saved,
    Stored,
    bytes_of,
    is_parameter,
)
from plait.spec.layout import Layout

MAX_PENDING_WRITE_BYTES = 4 * 2**30  # disk: the forward waits when this much is queued for writing


class ActivationOffloader:
    """Saved-tensor hooks that move activations of chosen blocks to ``target`` (cpu or disk)."""

    def __init__(self, target: str, device: torch.device, directory: str | Path | None = None,
                 resident: Callable[[], list[torch.Tensor]] | None = None,
                 max_pending_bytes: int = MAX_PENDING_WRITE_BYTES):
        if target not in ("cpu", "disk"):
            raise ValueError(f"offload target {target!r} must be cpu or disk")
        self.target = target
        self.cuda = device.type == "cuda"
        if self.cuda and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.resident = resident  # tensors never moved (model buffers), looked up at the first save
        self._resident_ptrs: set[int] | None = None
        self.stats = OffloadStats()
        self._lock = threading.Lock()  # the I/O thread adds its transfer time to ``stats``
        self._seen: dict[tuple, tuple[StorageWeakRef, Stored, int]] = {}
        self._timed: list[tuple] = []  # GPU: (kind, start event, end event) read at the step's end
        self._serial = 0
        self._last: tuple[weakref.ref, list[Stored]] | None = None  # the last offloaded block's output, group
        self._copying: list[list[Stored]] = []  # groups whose device bytes are held until copied out
        self._pending: list[tuple[Future, int]] = []
        self._failure: BaseException | None = None
        self.directory: Path | None = None
        self.io: ThreadPoolExecutor | None = None
        if target == "disk":
            if directory is None:
                raise ValueError("offload to disk needs a directory")
            self.directory = Path(directory)
            self.directory.mkdir(parents=True, exist_ok=True)
            self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plait-offload-io")
        self.max_pending_bytes = max_pending_bytes

    # ------------------------------------------------------------------ hooks
    def hooks(self) -> saved_tensors_hooks:
        return saved_tensors_hooks(self.pack, self.unpack)

    def attach(self, block: nn.Module) -> None:
        """Offload what ``block`` saves in its forward; prefetch when its backward is near."""
        state: dict = {}

        def enter(module, args):
            self._release(self._copying[:-1])  # the double buffer: the last block's copy-out may still run
            group: list[Stored] = []
            previous = self._last  # the block that ran just before, if its output is this input
            x = args[0] if args else None
            linked = previous if previous is not None and previous[0]() is x else None
            state["group"] = (group, linked[1] if linked else None)
            self._group = group
            self._seen = {}  # deduplicate within one block's forward only: buffers (pipeline receive
            # buffers) are refilled in place between forwards, without a version bump
            ctx = self.hooks()
            ctx.__enter__()
            state["ctx"] = ctx

        def leave(module, args, output):
            ctx = state.pop("ctx", None)
            if ctx is not None:
                ctx.__exit__(None, None, None)
            self._group = None
            self._seen = {}  # its handles stay with the graph alone (and leave with it)
            group, before = state.pop("group", ([], None))
            self._copying.append(list(group))
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(self._prefetch_hook(group, before))
                self._last = (weakref.ref(output), group)

        self._group = None
        block.register_forward_pre_hook(enter)
        block.register_forward_hook(leave, always_call=True)

    def _prefetch_hook(self, group: list[Stored], before: list[Stored] | None):
        def hook(grad):
            self._release(self._copying)  # the backward has begun: every copy-out is enqueued
            for stored in group + (before or []):
                self._prefetch(stored)
            # the graph's handles alone hold them now: each copy leaves with the last node that saved
            # it (kept here, every block's stayed until the step's end: the GPU proof's offload peak)
            group.clear()
            if before is not None:
                before.clear()
        return hook

    # ------------------------------------------------------------------ pack
    def _skip(self, t: torch.Tensor) -> bool:
        if self._resident_ptrs is None:
            self._resident_ptrs = {b.untyped_storage().data_ptr() for b in (self.resident() if self.resident else [])}
        return (is_parameter(t) or t.untyped_storage().nbytes() == 0
                or t.untyped_storage().data_ptr() in self._resident_ptrs)

    def pack(self, t: torch.Tensor):
        self._raise_failure()
        if is_parameter(t):
            return t
        dtensor = None
        local = t
        if hasattr(t, "device_mesh") and hasattr(t, "placements"):
            with torch.no_grad():
                local = t.to_local()
            dtensor = (t.device_mesh, t.placements, t.shape, t.stride())
        if type(local) is not torch.Tensor or local.device != self.device or self._skip(local):
            return t  # tensor subclasses (an async collective's result), other devices stay as they are
        storage = local.untyped_storage()
        key = (storage.data_ptr(), local.device)
        entry = self._seen.get(key)
        if entry is not None and not entry[0].expired() and entry[2] == local._version:
            self.stats.deduplicated += 1
            stored = entry[1]
        else:
            stored = self._move_out(storage, local.device)
            self._seen[key] = (StorageWeakRef(storage), stored, local._version)
            if self._group is not None:
                self._group.append(stored)
        return Saved(stored, local.storage_offset(), tuple(local.shape), tuple(local.stride()), local.dtype, dtensor)

    def _move_out(self, storage, device: torch.device) -> Stored:
        stored = Stored(storage.nbytes(), device)
        self.stats.bytes_out += stored.nbytes
        self.stats.tensors += 1
        source = bytes_of(storage)
        if self.cuda:
            host = torch.empty(stored.nbytes, dtype=torch.uint8, pin_memory=True)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(self.stream):
                start.record()
                host.copy_(source, non_blocking=True)
                end.record()
            self._timed.append(("transfer", start, end))
            stored.host, stored.event, stored.source = host, end, source  # source: until _release
        else:
            began = time.perf_counter()
            if self.target == "cpu":
                stored.host = source.clone()
            else:
                stored.host = source  # the I/O thread reads it; freed once written
            spent = time.perf_counter() - began
            self.stats.transfer_s += spent
            self.stats.exposed_s += spent
        if self.target == "disk":
            self._serial += 1
            stored.path = self.directory / f"{self._serial:09d}.bin"
            stored.write = self.io.submit(self._write, stored)
            self._pending.append((stored.write, stored.nbytes))
            self._throttle()
        return stored

    def _release(self, groups: list[list[Stored]]) -> None:
        """Let the device bytes of ``groups`` go (and drop them from ``_copying``), on GPU once the compute
        stream waits for their copy-out: reused stream-ordered (``record_stream`` let a peak grow)."""
        for group in groups:
            held = [stored.event for stored in group if stored.source is not None and stored.event is not None]
            if self.cuda and held:
                self._exposed_wait(held)
            for stored in group:
                stored.source = None
        released = {id(group) for group in groups}
        self._copying = [group for group in self._copying if id(group) not in released]

    # ------------------------------------------------------------------ disk I/O (thread)
    def write_file(self, path: Path, data: torch.Tensor) -> None:
        """Write the bytes of ``data`` (uint8, host) to ``path``; tests replace it to simulate errors."""
        with open(path, "wb") as handle:
            handle.write(memoryview(data.numpy()))

    def _write(self, stored: Stored) -> None:
        began = time.perf_counter()
        if stored.event is not None:
            stored.event.synchronize()
        try:
            self.write_file(stored.path, stored.host)
        except OSError as exc:
            self._failure = self._failure or exc  # the first failure is the reason
            raise
        stored.host = None  # the host / device copy is freed: the bytes are on disk
        self._add_transfer(time.perf_counter() - began)

    def _read(self, stored: Stored) -> torch.Tensor:
        began = time.perf_counter()
        data = torch.empty(stored.nbytes, dtype=torch.uint8, pin_memory=self.cuda)
        with open(stored.path, "rb") as handle:
            if handle.readinto(memoryview(data.numpy())) != stored.nbytes:
                raise OSError(f"short read of {stored.path}")
        os.remove(stored.path)
        stored.path = None
        if self.cuda:
            with torch.cuda.stream(self.stream):
                loaded = data.to(stored.device, non_blocking=True)
                stored.event = torch.cuda.Event()
                stored.event.record()
        else:
            loaded = data
        self._add_transfer(time.perf_counter() - began)
        return loaded

    def _add_transfer(self, seconds: float) -> None:
        with self._lock:
            self.stats.transfer_s += seconds

    def _throttle(self) -> None:
        """Wait (exposed) while more than ``max_pending_bytes`` wait to be written."""
        self._pending = [(f, n) for f, n in self._pending if not f.done() or f.exception()]
        self._raise_failure()
        while sum(n for _, n in self._pending) > self.max_pending_bytes:
            future, _ = self._pending.pop(0)
            self._wait(future)

    def _wait(self, future: Future):
        began = time.perf_counter()
        try:
            return future.result()
        except OSError as exc:
            self._failure = self._failure or exc
            self._raise_failure()
        finally:
            self.stats.exposed_s += time.perf_counter() - began

    def _raise_failure(self) -> None:
        if self._failure is not None:
            exc = self._failure
            raise PlaitError(f"activation offload to disk failed: {exc.strerror or exc} "
                             f"({getattr(exc, 'filename', None) or self.directory}); stopping. Free space in "
                             f"{self.directory}, pass --offload-dir DIR on a larger disk, or use offload=cpu:FRACTION")

    # ------------------------------------------------------------------ unpack
    def _prefetch(self, stored: Stored) -> None:
        if stored.loaded is not None or stored.read is not None:
            return
        if self.target == "disk":
            stored.read = self.io.submit(self._read, stored)
        elif self.cuda:
            # in the compute stream's memory, where it is used and freed (not in the side stream's pool)
            current = torch.cuda.current_stream(stored.device)
            stored.loaded = torch.empty(stored.nbytes, dtype=torch.uint8, device=stored.device)
            self.stream.wait_stream(current)  # that memory may have been another tensor's until now
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(self.stream):
                start.record()
                stored.loaded.copy_(stored.host, non_blocking=True)
                end.record()
            stored.loaded.record_stream(self.stream)  # not reused while the copy may run (unpack waits)
            self._timed.append(("transfer", start, end))
            stored.event = end
        else:
            began = time.perf_counter()
            stored.loaded = stored.host.clone()
            spent = time.perf_counter() - began
            self.stats.transfer_s += spent
            self.stats.exposed_s += spent
        self.stats.bytes_in += stored.nbytes

    def unpack(self, saved):
        if not isinstance(saved, Saved):
            return saved
        stored = saved.stored
        self._prefetch(stored)
        if stored.read is not None:
            stored.loaded = self._wait(stored.read)
            stored.read = None
        data = stored.loaded
        if self.cuda:
            self._exposed_wait([stored.event])
            data.record_stream(torch.cuda.current_stream(self.device))
        out = torch.empty(0, dtype=saved.dtype, device=stored.device).set_(
            data.untyped_storage(), saved.offset, saved.size, saved.stride)
        if saved.dtensor is not None:
            from torch.distributed.tensor import DTensor

            mesh, placements, shape, stride = saved.dtensor
            with torch.no_grad():
                out = DTensor.from_local(out, mesh, placements, run_check=False, shape=shape, stride=stride)
        return out

    def _exposed_wait(self, events: list) -> None:
        """The compute stream waits for ``events`` (GPU copies); the wait is timed as exposed."""
        current = torch.cuda.current_stream(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(current)
        for event in events:
            current.wait_event(event)
        end.record(current)
        self._timed.append(("exposed", start, end))

    # ------------------------------------------------------------------ bookkeeping
    def step_stats(self) -> OffloadStats:
        """This step's counters (call after the step, with the device synchronized); resets them."""
        self._raise_failure()
        for kind, start, end in self._timed:
            seconds = start.elapsed_time(end) / 1e3
            if kind == "transfer":
                self.stats.transfer_s += seconds
            else:
                self.stats.exposed_s += seconds
        self._timed.clear()
        self._seen = {}
        self._release(self._copying)
        with self._lock:
            stats, self.stats = self.stats, OffloadStats()
        return stats

    def close(self) -> None:
        """Stop the I/O thread and delete the offload files."""
        if self.io is not None:
            self.io.shutdown(wait=True, cancel_futures=True)
            self.io = None
        if self.directory is not None and self.directory.exists():
            shutil.rmtree(self.directory, ignore_errors=True)


def apply_activation_offload(chunks: list[nn.Module], layout: Layout, pp_rank: int, device: torch.device,
                             directory: str | Path | None) -> tuple[ActivationOffloader | None, list[str]]:
    """Attach an offloader to this GPU's chosen blocks; returns it (None without offload) and their ids."""
    owner = {layer_id: chunk for chunk in chunks for layer_id in chunk.layers}
    chosen = list(owner)[:offloaded_layer_count(layout, len(owner), pp_rank)]  # in order, over its virtual stages
    if not chosen:
        return None, []

    def buffers() -> list[torch.Tensor]:
        return [b for chunk in chunks for b in chunk.buffers()]

    offloader = ActivationOffloader(layout.offload_target, device, directory, resident=buffers)
    for layer_id in chosen:
        offloader.attach(owner[layer_id].layers[layer_id])
    return offloader, chosen
