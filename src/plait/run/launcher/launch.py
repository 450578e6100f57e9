"""Launch the workers of a run through torchrun (``torch.distributed.run``), in this process.

``plait train`` does what ``torchrun [flags] -m plait.run.worker RUN_DIR`` does, with the
flags built from its own options (``torchrun_args`` shows them; ``--dry-run`` prints the
equivalent command). One node: torchrun's standalone rendezvous. Several nodes: run the same
``plait train`` command on every node with ``--nnodes``, ``--rdzv-endpoint`` (host:port of
one of them) and ``--rdzv-id``; torchrun's c10d rendezvous assigns ranks.

When a worker fails, torchrun stops the others; each failed rank left an error file in the
run directory, and the launcher turns the first one into a PlaitError naming the rank.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class LaunchOptions:
    """torchrun's process placement: processes per node, nodes, rendezvous."""

    nproc_per_node: int = 1
    nnodes: int = 1
    rdzv_endpoint: str | None = None  # host:port of the rendezvous (multi-node)
    rdzv_id: str = "plait"
    node_rank: int | None = None  # only with the static rendezvous (no endpoint)
    master_addr: str | None = None
    master_port: int | None = None
    max_restarts: int = 0  # torchrun restarts all workers this many times after a failure
    min_nnodes: int | None = None  # elastic: torchrun starts once this many nodes joined (up to nnodes)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def torchrun_args(options: LaunchOptions, run_dir: str) -> list[str]:
    """The torchrun command-line arguments of this launch (without the program name)."""
    args = [f"--nproc-per-node={options.nproc_per_node}", f"--max-restarts={options.max_restarts}"]
    if options.nnodes == 1 and not options.rdzv_endpoint and options.master_addr is None:
        args.append("--standalone")
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


def command_line(options: LaunchOptions, run_dir: str) -> str:
    """The equivalent shell command (what ``--dry-run`` prints)."""
    return shlex.join(["torchrun", *torchrun_args(options, run_dir)])


def launch(config: RunConfig, options: LaunchOptions, run_dir: str | None = None) -> dict:
    """Run the job to completion; returns rank 0's summary (a dict), or raises PlaitError.

    ``config`` must have passed ``plait.run.launcher.preflight.preflight`` for these ``options``.
    """
    owned = run_dir is None
    directory = Path(run_dir or tempfile.mkdtemp(prefix="plait-run-"))
    directory.mkdir(parents=True, exist_ok=True)
    config.save(directory / "config.json")
    for stale in directory.glob("error-rank*.json"):
        stale.unlink()
    try:
        _run_torchrun(torchrun_args(options, str(directory)), directory, options.nproc_per_node)
        summary_file = directory / "summary.json"
        return json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    finally:
        if owned:
            for path in directory.iterdir():
                path.unlink()
            directory.rmdir()


def _run_torchrun(args: list[str], run_dir: Path, nproc_per_node: int) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # torchrun sets 1 thread per worker (and warns) when unset; share the cores instead
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    try:
        run(parse_args(args))
    except ChildFailedError as exc:
        raise PlaitError(_failure_message(run_dir, exc)) from None
    except SignalException as exc:
        raise RunStopped(f"stopped by {signal.Signals(exc.sigval).name}: the workers were asked to finish their "
                         "step and save a checkpoint (with --checkpoint-dir) within 30 s; resume with --resume") \
            from None
    except (RuntimeError, OSError, ValueError) as exc:  # rendezvous timeouts, ports in use, bad endpoints
        raise PlaitError(f"torchrun could not start the workers: {type(exc).__name__}: {exc}") from None


def _failure_message(run_dir: Path, exc: Exception) -> str:
    errors = []
    for path in sorted(run_dir.glob("error-rank*.json")):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if not errors:
        return f"training failed: a worker died without a message ({str(exc).strip().splitlines()[0]})"
    # the root cause failed first; the other ranks then fail in collectives with their dead peer
    errors.sort(key=lambda e: (e.get("time", 0.0), e["rank"]))
    first = errors[0]
    text = f"training failed on rank {first['rank']}: {first['message']}"
    if "traceback" in first:
        text += "\n" + first["traceback"].rstrip()
    others = [e["rank"] for e in errors if e is not first]
    if others:
        text += f"\n(ranks {', '.join(map(str, others))} also stopped)"
    return text


def print_dry_run(config: RunConfig, options: LaunchOptions) -> None:
    print(command_line(options, "RUN_DIR"))
    print("# RUN_DIR/config.json:")
    json.dump(config.to_dict(), sys.stdout, indent=2)
    print()
