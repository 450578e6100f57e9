"""Save and load training state with torch.distributed.checkpoint (DCP), layout-independently.

The state is keyed by the *plain model's* parameter names (``plait.run.model.canonical_name``):
``model.<name>`` for every parameter and ``optim.<name>.<exp_avg|exp_avg_sq|step>`` for AdamW's
state. Values are the tensors the rank holds - DTensors under FSDP2 and tensor parallelism,
plain tensors otherwise - so DCP records each one's global shape and which piece each rank
wrote, and a later load under any other layout (another dp/tp/pp/ZeRO stage, another world
size, one process) reads exactly the pieces it needs. Pipeline ranks hold disjoint names;
replicated copies are written once.

What is not a tensor lives in the manifest (``plait.run.checkpoint.store``): the step, the run
config (model, global batch, sequence length, seed, data, optimizer and schedule), the layout
and world size. The learning rate is a pure function of the step and the schedule, the data
order a pure function of (seed, step, position in the global batch), and the dropout RNG is
re-seeded at every step from (seed, step, data-parallel rank, pipeline rank); so the step *is*
the scheduler, data-loader and RNG state, and resuming needs no per-rank generator snapshot.

Saving: every rank writes its pieces into ``step_N.tmp-<id>`` (asynchronously on GPU: DCP
stages to host memory and writes from a thread, over a dedicated gloo group), then the ranks
checksum the files between them, rank 0 writes the manifest and renames the directory.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException

from plait.errors import PlaitError
from plait.run.checkpoint import store
from plait.run.checkpoint.safe_reader import SafeFileSystemReader, read_metadata_file
from plait.run.faults import NO_FAULTS, FaultPlan
from plait.run.model import canonical_name
from plait.run.parallel.parallelize import ModelParts

ADAM_STATE = ("exp_avg", "exp_avg_sq")


def named_parameters(parts: ModelParts) -> dict[str, torch.nn.Parameter]:
    """{plain-model name: parameter} of this rank (a tied parameter once, under its first name)."""
    out: dict[str, torch.nn.Parameter] = {}
    seen: set[int] = set()
    for name, param in parts.named_parameters():
        if id(param) not in seen:
            seen.add(id(param))
            out[canonical_name(name)] = param
    return out


def ensure_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create AdamW's state (zeros, step 0) for parameters that have none yet, so it can be loaded into."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state[param]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                for key in ADAM_STATE:
                    state[key] = torch.zeros_like(param, memory_format=torch.preserve_format)


def training_state(parts: ModelParts, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The flat, layout-independent state dict of this rank (views of the live tensors).

    FSDP units are resharded first: after a forward with no backward (an evaluation) a unit that
    does not reshard after forward holds gathered parameters, which are not the optimizer's."""
    parts.reshard()
    ensure_optimizer_state(optimizer)
    out: dict[str, torch.Tensor] = {}
    for name, param in named_parameters(parts).items():
        out[f"model.{name}"] = param.detach()
        state = optimizer.state[param]
        for key in ADAM_STATE:
            out[f"optim.{name}.{key}"] = state[key]
        out[f"optim.{name}.step"] = state["step"]
    for name, buffer in parts.state_buffers():  # MoE: the sigmoid routers' balancing biases
        out[f"model.{name}"] = buffer
    return out


def own_files(directory: Path, rank: int) -> list[str]:
    """The files of a DCP checkpoint that ``rank`` wrote: ``__<rank>_*.distcp``, and ``.metadata`` on rank 0."""
    names = [p.name for p in directory.iterdir() if p.name.startswith(f"__{rank}_") and p.name.endswith(".distcp")]
    if rank == 0 and (directory / ".metadata").is_file():
        names.append(".metadata")
    return sorted(names)


@dataclass
class PendingSave:
    """A checkpoint whose files are being written; ``finish`` commits it."""

    step: int
    temporary: Path
    final: Path
    future: object | None = None  # concurrent Future of an async DCP save; None when written synchronously
    records: dict | None = None  # size and CRC-32 of the files this rank wrote, once they are written
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    data: dict | None = None  # the data mixture's state at this step (``data_state``), for the manifest


class Checkpointer:
    """Writes checkpoints of one run into ``root``: every ``every`` steps, on request, at the end.

    All methods are collective: every rank must call them at the same step. Each rank checksums
    the files it wrote itself (for an async save, in the writer thread, while they are still in
    the page cache); rank 0 adds any file nobody claimed, writes the manifest and renames.
    ``parts`` and ``optimizer`` are what ``after_step`` saves; ``faults`` is the fault-injection
    hook, called at "in-save" between writing a checkpoint's files and committing it.
    """

    def __init__(self, root: str | Path, every: int, keep: int, run: dict, layout: str, use_async: bool,
                 device: torch.device, parts: ModelParts | None = None,
                 optimizer: torch.optim.Optimizer | None = None, faults: FaultPlan = NO_FAULTS,
                 data_state=None):
        self.root = Path(root)
        self.data_state = data_state  # steps_done -> the data mixture's state (per-source tokens, stream bookmarks)
        self.every = every
        self.keep = keep
        self.run = run
        self.layout = layout
        self.sink_ids: dict[str, str] = {}  # rank 0's W&B / MLflow run ids, into each manifest (``sinks``)
        self.use_async = use_async
        self.device = device
        self.parts = parts
        self.optimizer = optimizer
        self.faults = faults
        self.pending: PendingSave | None = None
        self.saved: list[int] = []
        self.stall_s: list[float] = []  # training time lost to each save: staging/writing plus the commit
        self._group = None
        _all_ranks_ok(lambda: store.check_writable(self.root) if dist.get_rank() == 0 else None)

    def after_step(self, steps_done: int, last_step: bool, stop: bool) -> dict | None:
        """The checkpoint schedule, called by every rank after each optimizer step (``steps_done`` in all).

        At the last step or on a stop request: save and commit before returning. Every ``every``
        steps: start a save and return its JSONL event. Otherwise: commit an asynchronous save
        whose writes are done.
        """
        if last_step or stop:
            self.save(steps_done, self.parts, self.optimizer)
            self.finish()
            return None
        if self.every > 0 and steps_done % self.every == 0:
            self.save(steps_done, self.parts, self.optimizer)
            return {"event": "checkpoint", "step": steps_done, "stall_s": self.stall_s[-1]}
        self.poll()
        return None

    def save(self, steps_done: int, parts: ModelParts, optimizer: torch.optim.Optimizer) -> None:
        """Start writing the state after ``steps_done`` optimizer steps (finishes any earlier save first)."""
        start = time.perf_counter()
        self.finish()
        if steps_done in self.saved:
            return  # e.g. SIGTERM right after a periodic save of the same step
        token = _shared_token()
        temporary = self.root / store.temp_name(steps_done, token)
        final = self.root / store.final_name(steps_done)
        if final.exists():
            raise PlaitError(f"checkpoint {final} already exists; plait never overwrites a checkpoint "
                             "(resume from the newest one, or use a new --checkpoint-dir)")
        state = training_state(parts, optimizer)
        writer = FileSystemWriter(temporary, overwrite=False)
        pending = PendingSave(steps_done, temporary, final)
        pending.data = self.data_state(steps_done) if self.data_state is not None and dist.get_rank() == 0 else None
        rank = dist.get_rank()
        if self.use_async:
            pending.future = dcp.async_save(state, storage_writer=writer, process_group=self._async_group())
            pending.future.add_done_callback(lambda future: _checksum_own(pending, rank, future))
            self.pending = pending
            self.stall_s.append(time.perf_counter() - start)
        else:
            with _write_errors(temporary):
                dcp.save(state, storage_writer=writer)
            _checksum_own(pending, rank, None)
            self.pending = pending
            self.finish()
            self.stall_s.append(time.perf_counter() - start)

    def poll(self) -> None:
        """Commit an asynchronous save once every rank's writes and checksums are done (one small all-reduce)."""
        if self.pending is None:
            return
        start = time.perf_counter()
        # on the training group, from the main thread: the writer thread owns the async group
        done = torch.tensor([1 if self.pending.ready.is_set() else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if int(done.item()):
            self.finish()
            if self.stall_s:
                self.stall_s[-1] += time.perf_counter() - start

    def finish(self) -> None:
        """Wait for the pending save and its checksums, write the manifest, rename, prune."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        pending.ready.wait()
        failed = torch.tensor([1 if pending.error is not None else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        if int(failed.item()):
            with _write_errors(pending.temporary):
                raise pending.error or RuntimeError("another rank could not write its part")
        rank, world = dist.get_rank(), dist.get_world_size()
        gathered: list[dict] = [{} for _ in range(world)]
        dist.all_gather_object(gathered, pending.records)
        self.faults.at(pending.step, "in-save")

        def commit() -> None:
            with _write_errors(pending.temporary):
                files = {k: v for part in gathered for k, v in part.items()}
                unclaimed = [name for name in store.data_files(pending.temporary) if name not in files]
                files.update(store.file_records(pending.temporary, unclaimed))
                store.write_manifest(pending.temporary, pending.step, files, self.run,
                                     {"layout": self.layout, "world_size": world, "torch": torch.__version__,
                                      **({"data": pending.data} if pending.data is not None else {}),
                                      **({"sinks": dict(self.sink_ids)} if self.sink_ids else {})})
                store.commit(pending.temporary, pending.final)
                store.prune(self.root, self.keep)

        _all_ranks_ok(commit if rank == 0 else (lambda: None))
        self.saved.append(pending.step)

    def _async_group(self):
        """A gloo group for the async writer thread, apart from the training collectives."""
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group


def _checksum_own(pending: PendingSave, rank: int, future) -> None:
    """Record the size and CRC-32 of the files this rank wrote (runs in the writer thread when async)."""
    try:
        if future is not None:
            future.result()
        pending.records = store.file_records(pending.temporary, own_files(pending.temporary, rank))
    except BaseException as exc:  # noqa: BLE001 - handed to the main thread, raised by finish()
        pending.error = exc
    finally:
        pending.ready.set()


def _all_ranks_ok(action) -> None:
    """Run ``action`` (which may raise on one rank only) and raise the same error on every rank."""
    message = None
    try:
        action()
    except (PlaitError, OSError) as exc:
        message = str(exc)
    messages = [None] * dist.get_world_size()
    dist.all_gather_object(messages, message)
    first = next((m for m in messages if m), None)
    if first:
        raise PlaitError(first)


@contextlib.contextmanager
def _write_errors(directory: Path):
    """Turn a failed checkpoint write (disk full, permissions, I/O) into one clear PlaitError."""
    try:
        yield
    except (OSError, RuntimeError, CheckpointException) as exc:
        raise PlaitError(f"could not write checkpoint {directory} ({write_failure(exc, directory)[:200]}); the "
                         "previous checkpoints are intact. Free disk space or choose another --checkpoint-dir") from None


def write_failure(exc: BaseException, directory: Path) -> str:
    """Why a write into ``directory`` failed, in words: the OS error (``No space left on device``) when
    one is in the exception's chain or text; a full disk when the filesystem has (almost) no space
    left - torch's zip writer then only says ``unexpected pos 704 vs 598``; else the error's last line."""
    seen, pending = set(), [exc]
    while pending:
        error = pending.pop()
        if isinstance(error, tuple):  # DCP's failures: (exception, traceback) per rank
            pending += list(error)
            continue
        if not isinstance(error, BaseException) or id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno:
            return f"{os.strerror(error.errno)}{f': {error.filename}' if error.filename else ''}"
        pending += [error.__cause__, error.__context__, *getattr(error, "failures", {}).values()]
    text = str(exc)
    line = next((line.strip() for line in text.splitlines() if "Errno" in line or "No space" in line), None)
    if line:
        return line
    free = free_bytes(directory)
    if free is not None and free < FULL_DISK_BYTES:
        return f"No space left on device: {free:,} bytes free on the filesystem of {directory.parent}"
    return text.strip().splitlines()[-1] if text.strip() else type(exc).__name__


FULL_DISK_BYTES = 64 * 2**20  # a failed write with less free space than this is a full disk


def free_bytes(directory: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem of ``directory`` (or its parent)."""
    for path in (directory, directory.parent):
        try:
            stats = os.statvfs(path)
        except OSError:
            continue
        return stats.f_bavail * stats.f_frsize
    return None


def _shared_token() -> str:
    """A name suffix that rank 0 draws and every rank agrees on."""
    token = [f"{os.getpid():x}{time.time_ns() & 0xFFFFFF:06x}"]
    dist.broadcast_object_list(token, src=0)
    return token[0]


def load_checkpoint(path: str | Path, parts: ModelParts, optimizer: torch.optim.Optimizer) -> None:
    """Load a checkpoint written under any layout into this rank's parameters and AdamW state, in place."""
    try:  # one clear line for metadata that is not DCP's (the reader below refuses it too, in DCP's words)
        read_metadata_file(Path(path) / ".metadata")
    except PlaitError as exc:
        raise PlaitError(f"cannot load checkpoint {path}: {exc}") from None
    state = training_state(parts, optimizer)
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(path))
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - CheckpointException is a BaseException
        text = str(exc).strip().splitlines()
        missing = [line for line in text if "Missing key" in line or "not found" in line]
        raise PlaitError(f"cannot load checkpoint {path}: {(missing or text or [type(exc).__name__])[0][:300]}") \
            from None
