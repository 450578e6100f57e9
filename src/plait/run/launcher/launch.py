"""Launch the workers of a run through torchrun (``torch.distributed.run``), in this process.

``plait train`` does what ``torchrun [flags] -m plait.run.worker RUN_DIR`` does, with the
flags built from its own options (``torchrun_args`` shows them; ``--dry-run`` prints the
equivalent command). One node: torchrun's standalone rendezvous. Several nodes: run the same
``plait train`` command on every node with ``--nnodes``, ``--rdzv-endpoint`` (host:port of
one of them) and ``--rdzv-id``; torchrun's c10d rendezvous assigns ranks.

When a worker fails, torchrun stops the others; each failed rank left an error file in the
run directory, and the launcher turns the first one into a PlaitError naming the rank. Every
launched run ends with ``RUN_DIR/outcome.json`` (``plait.run.launcher.outcome``): how it ended,
for programs such as ``plait sweep``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from plait.errors import PlaitError, RunStopped
from plait.run.config import RunConfig
from plait.run.device import uses_gpu
from plait.run.launcher.environment import worker_environment
from plait.run.launcher.host_memory import HostMemory
from plait.run.launcher.outcome import (
    EXIT_ERROR,
    EXIT_OK,
    Outcome,
    failed_run,
    first_line,
    outcome_path,
    refused,
    write_outcome,
)
from plait.run.settings import setting


@dataclass(frozen=True)
class LaunchOptions:
    """torchrun's process placement: processes per node, nodes, rendezvous."""

    nproc_per_node: int = setting(1, "--nproc-per-node", "processes (GPUs) per node", "where", aliases=("--nproc",),
                                  unset=True)  # not given: the layout's world size over the nodes
    nnodes: int = setting(1, "--nnodes", "nodes (run the same command on each); elastic: MIN:MAX with "
                          "--rdzv-endpoint", "where", kind=str, flag_default="1")  # the flag: "N" or "MIN:MAX"
    rdzv_endpoint: str | None = setting(None, "--rdzv-endpoint", "host:port of the rendezvous, for several nodes",
                                        "where")  # multi-node
    rdzv_id: str = setting("plait", "--rdzv-id", "job id shared by the nodes of one run (default: derived from the "
                           "command line and the scheduler's job id, the same on every node of the job)", "where",
                           unset=True)  # not given: resolve.job_rdzv_id, never a fixed default
    node_rank: int | None = setting(None, "--node-rank", "this node's rank (static rendezvous, with --master-addr)",
                                    "where")  # only with the static rendezvous (no endpoint)
    master_addr: str | None = setting(None, "--master-addr", "address of node 0 (static rendezvous)", "where")
    master_port: int | None = setting(None, "--master-port", "port on node 0 (static rendezvous; default 29500)",
                                      "where")
    max_restarts: int = setting(0, "--max-restarts", "torchrun restarts after a worker dies; each restart resumes "
                                "from the newest checkpoint", "checkpoints")  # all workers restart, this many times
    min_nnodes: int | None = None  # elastic: torchrun starts once this many nodes joined (up to nnodes)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def torchrun_args(options: LaunchOptions, run_dir: str) -> list[str]:
    """The torchrun command-line arguments of this launch (without the program name)."""
    args = [f"--nproc-per-node={options.nproc_per_node}", f"--max-restarts={options.max_restarts}"]
    if options.nnodes == 1 and not options.rdzv_endpoint and options.master_addr is None:
        args += ["--standalone", f"--local-addr={LOOPBACK}"]  # the workers' store on loopback (loopback_stores)
    elif options.rdzv_endpoint:
        nodes = f"{options.min_nnodes}:{options.nnodes}" if options.min_nnodes not in (None, options.nnodes) \
            else str(options.nnodes)
        args += [f"--nnodes={nodes}", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint={options.rdzv_endpoint}", f"--rdzv-id={options.rdzv_id}"]
    else:  # static rendezvous: every node names its rank and the master
        if options.node_rank is None or options.master_addr is None:
            raise PlaitError("multi-node without --rdzv-endpoint needs --node-rank and --master-addr")
        args += [f"--nnodes={options.nnodes}", f"--node-rank={options.node_rank}",
                 f"--master-addr={options.master_addr}", f"--master-port={options.master_port or 29500}"]
    return args + ["-m", "plait.run.worker", run_dir]


def job_rdzv_id(request: dict) -> str:
    """The rendezvous id of a job that gave no ``--rdzv-id`` (``request``: the train request's fields):
    the same on every node that runs the same command - a digest of it, and of the scheduler's job
    id when there is one - and another for another job; never the fixed ``plait`` that let two
    jobs on one endpoint join each other's rendezvous."""
    import hashlib

    fields = {k: v for k, v in request.items() if k not in ("run_dir", "dry_run", "node_rank")}
    fields["scheduler_job"] = next((os.environ[k] for k in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")
                                    if os.environ.get(k)), None)
    return "plait-" + hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def command_line(options: LaunchOptions, run_dir: str) -> str:
    """The equivalent shell command (what ``--dry-run`` prints)."""
    return shlex.join(["torchrun", *torchrun_args(options, run_dir)])


class RunFailed(PlaitError):
    """A launched run whose workers failed (or could not start); RUN_DIR/outcome.json says how."""


def launch(config: RunConfig, options: LaunchOptions, run_dir: str | None = None,
           host_memory: HostMemory | None = None) -> dict:
    """Run the job to completion; returns rank 0's summary (a dict), or raises PlaitError.

    ``config`` must have passed ``plait.run.launcher.preflight.preflight`` for these ``options``.
    Every exit writes ``RUN_DIR/outcome.json`` (``plait.run.launcher.outcome``): ok, refused (a
    multi-node setup torchrun cannot take), failed or oom (RunFailed), stopped (RunStopped).
    ``host_memory`` (CPU runs): the planner's host memory, quoted when the OS kills a worker.
    """
    owned = run_dir is None
    directory = Path(run_dir or tempfile.mkdtemp(prefix="plait-run-"))
    directory.mkdir(parents=True, exist_ok=True)
    config.save(directory / "config.json")
    for stale in [*directory.glob("error-rank*.json"), outcome_path(directory)]:
        stale.unlink(missing_ok=True)
    try:
        try:
            outcome, message = workers_outcome(torchrun_args(options, str(directory)), directory,
                                               options.nproc_per_node, host_memory=host_memory,
                                               cpu=not uses_gpu(config.runtime.device))
        except PlaitError as exc:
            write_outcome(directory, refused(exc))
            raise
        except BaseException as exc:  # e.g. Ctrl-C outside torchrun's own handlers: still say how it ended
            write_outcome(directory, Outcome("failed", first_line(f"{type(exc).__name__}: {exc}")))
            raise
        write_outcome(directory, outcome)
        raise_for(outcome, message)
        summary_file = directory / "summary.json"
        return json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    finally:
        if owned:
            for path in directory.iterdir():
                path.unlink()
            directory.rmdir()


def record_refusal(run_dir: str | None, exc: PlaitError) -> None:
    """Write ``RUN_DIR/outcome.json`` for a ``plait train`` that refused ``exc`` before launching.

    Nothing without a run directory, and nothing for the errors of a launched run (launch() has
    written their outcome). A run directory that cannot be written is left as it is: the refusal
    itself is what the user must see.
    """
    if run_dir is None or isinstance(exc, (RunFailed, RunStopped)):
        return
    try:
        write_outcome(run_dir, refused(exc))
    except OSError:
        pass


def run_torchrun(args: list[str], run_dir: Path, nproc_per_node: int, what: str = "training",
                 cpu: bool = False) -> None:
    """Run torchrun with ``args`` (``torchrun_args``' form) in this process, to completion.

    Raises RunFailed when a worker failed (the message names the first failed rank, from the
    ``error-rank<R>.json`` files in ``run_dir``; ``what`` names the work: "training failed on
    rank 1: ..."), RunStopped when a signal stopped the run.
    """
    raise_for(*workers_outcome(args, run_dir, nproc_per_node, what, cpu=cpu))


def raise_for(outcome: Outcome, message: str) -> None:
    """Raise the error of a run that did not end ok: RunStopped or RunFailed with ``message``."""
    if outcome.status == "stopped":
        raise RunStopped(message, exit_code=outcome.exit_code)
    if outcome.status != "ok":
        raise RunFailed(message)


def workers_outcome(args: list[str], run_dir: Path, nproc_per_node: int, what: str = "training",
                    host_memory: HostMemory | None = None, cpu: bool = False) -> tuple[Outcome, str]:
    """Run torchrun with ``args``; (how it ended, the error message with traceback, "" when ok).

    The workers start with ``plait.run.launcher.environment.worker_environment`` (``cpu``: the CPU
    allocator settings too).

    ``host_memory``: a CPU run's predicted and available host memory; a worker killed by SIGKILL
    is then reported as killed by the OS, with these numbers (``outcome.failed_run``)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from plait.run.launcher.restarts import restart_notes

    try:
        with worker_environment(nproc_per_node, cpu), loopback_stores("--standalone" in args), \
                restart_notes(Path(run_dir), what, lambda note: print(f"plait: {note}", flush=True)):
            run(parse_args(args))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        signal_name = failure.signal_name() if failure.exitcode is not None and failure.exitcode < 0 else None
        died = f"rank {rank} ended with {signal_name or f'exit status {failure.exitcode}'}"
        exits = {r: f.exitcode for r, f in exc.failures.items() if f.exitcode is not None}
        return failed_run(run_dir, what, died=died, dead_rank=rank, signal=signal_name, exits=exits,
                          memory_note=host_memory.kill_note() if host_memory is not None else None)
    except SignalException as exc:
        name = signal.Signals(exc.sigval).name
        message = (f"stopped by {name}: the workers were asked to finish their step and save a checkpoint "
                   "(with --checkpoint-dir) within 30 s; resume with --resume")
        return Outcome("stopped", message, exit_code=128 + int(exc.sigval), signal=name), message
    except (RuntimeError, OSError, ValueError) as exc:  # rendezvous timeouts, ports in use, bad endpoints
        message = f"torchrun could not start the workers: {type(exc).__name__}: {exc}"
        return Outcome("failed", first_line(message), exit_code=EXIT_ERROR), message
    return Outcome("ok", exit_code=EXIT_OK), ""


LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def loopback_stores(single_node: bool):
    """A single-node run's rendezvous and worker stores listen on 127.0.0.1 only, and gloo on the
    loopback interface: torch's TCPStore otherwise listens on every interface (``[::]``), an
    unauthenticated key-value store anyone on the network can reach. torchrun creates the stores
    in this process: ``torch.distributed.TCPStore`` is replaced meanwhile by a subclass that hands
    the server a socket bound to loopback (``master_listen_fd``). Nothing changes for several nodes."""
    if not single_node:
        yield
        return
    import datetime
    import socket

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    original = dist.TCPStore

    class LoopbackTCPStore(original):
        def __init__(self, host_name, port, world_size=None, is_master=False,
                     timeout=datetime.timedelta(seconds=300), wait_for_workers=True, multi_tenant=False,
                     master_listen_fd=None, use_libuv=True):
            if is_master and master_listen_fd is None:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    listener.bind((LOOPBACK, port))
                    listener.listen(128)
                except OSError:
                    listener.close()
                    raise
                port, master_listen_fd = listener.getsockname()[1], listener.detach()
            super().__init__(host_name, port, world_size, is_master, timeout, wait_for_workers, multi_tenant,
                             master_listen_fd, use_libuv)

    gloo = {} if "GLOO_SOCKET_IFNAME" in os.environ or "lo" not in {n for _, n in socket.if_nameindex()} \
        else {"GLOO_SOCKET_IFNAME": "lo"}
    dist.TCPStore = c10d_rendezvous_backend.TCPStore = LoopbackTCPStore
    os.environ.update(gloo)
    try:
        yield
    finally:
        dist.TCPStore = c10d_rendezvous_backend.TCPStore = original
        for key in gloo:
            os.environ.pop(key, None)


def print_dry_run(config: RunConfig, options: LaunchOptions) -> None:
    print(command_line(options, "RUN_DIR"))
    print("# RUN_DIR/config.json:")
    json.dump(config.to_dict(), sys.stdout, indent=2)
    print()
