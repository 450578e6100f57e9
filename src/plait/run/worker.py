"""The process that torchrun starts on every rank: ``python -m plait.run.worker RUN_DIR``.

``RUN_DIR/config.json`` holds the RunConfig. The worker initializes the process group (NCCL on
GPU, gloo on CPU) with a finite timeout, so that when one rank fails the others stop at their
next collective instead of hanging; torchrun's agent then stops the rest. A failing rank writes
``RUN_DIR/error-rank<R>.json`` (message, and the traceback unless it is a plait error) for the
launcher to show.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from plait.errors import PlaitError
from plait.run.config import RunConfig
from plait.run.startup import arm_sigterm, startup_config


def init_process_group(config: RunConfig) -> None:
    """Join the job's process group (env:// variables set by torchrun).

    The store is namespaced by torchrun's restart count and the world size: after an elastic
    restart the agent's store still holds the previous attempt's gloo addresses, which would make
    the new workers connect to dead peers.
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = timedelta(seconds=config.timeout_s)
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         is_master=(not agent_store and rank == 0), timeout=timeout)
    # the world size changes when nodes join or leave, which restarts the workers without counting a restart
    store = dist.PrefixStore(f"attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}_{world}", base)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def say(text: str) -> None:
    """A line on rank 0's stdout (the launcher's console)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"plait train: {text}", flush=True)


def write_error(run_dir: Path, rank: int, exc: BaseException) -> None:
    record = {"rank": rank, "type": type(exc).__name__, "message": str(exc), "time": time.time()}
    if not isinstance(exc, PlaitError):
        record["traceback"] = traceback.format_exc()
    (run_dir / f"error-rank{rank}.json").write_text(json.dumps(record))


def run_as_worker(run_dir: Path, program: str, body) -> None:
    """Run ``body()`` on this torchrun rank and exit without interpreter teardown.

    A failure is written to ``run_dir/error-rank<R>.json`` for the launcher and ends the process
    with status 1; success ends it with 0 after a barrier and destroying the process group.
    (Teardown is skipped: it can abort in gloo's threads, a torch issue seen on CPU.)
    """
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    try:
        body()
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the launcher
        write_error(run_dir, rank, exc)
        print(f"plait {program}: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0])

    def train() -> None:
        config = RunConfig.load(run_dir / "config.json")
        stop = arm_sigterm(say)  # before init: the process group's threads must inherit the signal mask
        init_process_group(config)
        from plait.run.trainer import run_training

        config, finished = startup_config(config, say)
        if not finished:
            result = run_training(config, stop=stop)
            if dist.get_rank() == 0:
                (run_dir / "summary.json").write_text(json.dumps(result.summary.to_dict()))

    run_as_worker(run_dir, "train", train)


if __name__ == "__main__":
    main()
