"""The process that torchrun starts on every rank: ``python -m plait.run.worker RUN_DIR``.

``RUN_DIR/config.json`` holds the RunConfig. The worker reads torchrun's environment once
(``RankEnv``), chooses its device once (``plait.run.device.rank_device``) and parses
the test-only fault plan once (``FaultPlan``), and hands all three down. Then, in order:

* SIGTERM, SIGINT and SIGHUP reach a thread of their own (a wakeup pipe), so they are seen even while the main
  thread is blocked in a collective: the training loop finishes its step, saves and stops; a
  main thread that does not come back to the loop in time (stuck with a dead peer) is ended.
* The process group is joined (NCCL on GPU, gloo on CPU) with a finite timeout, so that when
  one rank fails the others stop at their next collective instead of hanging; torchrun's agent
  then stops the rest.
* Every rank must run the same config (several nodes each wrote their own ``config.json``):
  the ranks compare a hash of it and refuse to start on a mismatch.
* An elastic node-count change gives the workers a world size other than the layout's: they
  re-plan, all the same way (``plait.run.replan.replan`` is deterministic).
* With a checkpoint ``dir``, the newest checkpoint there (or the ``resume_from`` one) that
  verifies on all ranks is where training starts (``plait.run.checkpoint.select``). This covers
  torchrun restarts after a failure and node joins alike (a join restarts the workers without
  counting a failure). When it already holds every step, there is nothing left to train.
* ``plait.run.trainer.run_training`` trains; rank 0 writes ``RUN_DIR/summary.json``.

A failing rank writes ``RUN_DIR/error-rank<R>.json`` (message, and the traceback unless it is a
plait error) for the launcher to show.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from plait.atomic import atomic_write_text
from plait.errors import PlaitError
from plait.run.checkpoint import store
from plait.run.checkpoint.select import candidates, choose_checkpoint, nothing_to_train
from plait.run.config import RunConfig
from plait.run.env import RankEnv, die_with_launcher
from plait.run.faults import FaultPlan
from plait.run.device import rank_device
from plait.run.replan import replan

SIGTERM_GRACE_S = 25.0  # torchrun SIGKILLs its workers 30 s after SIGTERM


def init_process_group(env: RankEnv, device: torch.device, timeout_s: float) -> None:
    """Join the job's process group: NCCL for a GPU ``device``, else gloo; collectives time out after ``timeout_s`` s.

    The store is namespaced by torchrun's restart count and the world size: after an elastic
    restart the agent's store still holds the previous attempt's gloo addresses, which would make
    the new workers connect to dead peers.
    """
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    base = dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                         is_master=(not env.agent_store and env.rank == 0), timeout=timeout)
    # the world size changes when nodes join or leave, which restarts the workers without counting a restart
    prefixed = dist.PrefixStore(f"attempt_{env.restart_count}_{env.world_size}", base)
    dist.init_process_group(backend, store=prefixed, rank=env.rank, world_size=env.world_size, timeout=timeout)


def console(env: RankEnv) -> Callable[[str], None]:
    """``say(text)``: a line on rank 0's stdout (the launcher's console); nothing on other ranks."""

    def say(text: str) -> None:
        if env.rank == 0:
            print(f"plait train: {text}", flush=True)

    return say


def write_error(run_dir: Path, rank: int, exc: BaseException) -> None:
    record = {"rank": rank, "type": type(exc).__name__, "message": str(exc), "time": time.time()}
    if not isinstance(exc, PlaitError):
        record["traceback"] = traceback.format_exc()
    atomic_write_text(run_dir / f"error-rank{rank}.json", json.dumps(record), "error file")


def run_as_worker(run_dir: Path, program: str, body: Callable[[RankEnv], None]) -> None:
    """Run ``body(env)`` on this torchrun rank (``env``: its environment, read here once) and exit
    without interpreter teardown.

    The worker ends with its launcher (``plait.run.env.die_with_launcher``). A failure is written to ``run_dir/error-rank<R>.json`` for the launcher and ends the process
    with status 1; success ends it with 0 after a barrier and destroying the process group.
    (Teardown is skipped: it can abort in gloo's threads, a torch issue seen on CPU.)
    """
    die_with_launcher()
    env = RankEnv.from_environ()
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    try:
        body(env)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the launcher
        write_error(run_dir, env.rank, exc)
        print(f"plait {program}: rank {env.rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def config_digest(config: RunConfig) -> str:
    """Hash of the sub-configs that define the run: job, optimizer, checkpoints and runtime, and the
    evaluation (a collective every rank must run alike); not ``observe``, where it reports, nor the
    planner's ``prediction``."""
    data = config.to_dict()
    defining = {name: data[name] for name in ("job", "optim", "checkpoint", "runtime", "eval")}
    return hashlib.sha256(json.dumps(defining, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_same_config(config: RunConfig) -> None:
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, config_digest(config))
    if len(set(digests)) > 1:
        groups: dict[str, list[int]] = {}
        for rank, digest in enumerate(digests):
            groups.setdefault(digest, []).append(rank)
        raise PlaitError("the ranks were started with different run configs (ranks "
                         + " vs ".join(str(ranks) for ranks in groups.values())
                         + "); run the same plait train command on every node")


def startup_config(config: RunConfig, env: RankEnv, say) -> tuple[RunConfig, bool]:
    """(the config this attempt trains, whether training is already complete); a collective."""
    check_same_config(config)
    world = dist.get_world_size()
    if world != config.job.layout.world_size:
        config, why = replan(config, world, env.local_world_size)
        say(why)
    saving = config.checkpoint
    if not (saving.dir or saving.resume_from):
        return config, False
    listing = [candidates(saving) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(listing, src=0)
    if not listing[0]:
        return config, False
    chosen, refused = choose_checkpoint(listing[0], saving.dir, say)
    if chosen is None:
        if saving.resume_from:
            raise PlaitError(f"no valid checkpoint to resume from ({'; '.join(refused)})")
        return config, False  # nothing saved yet: start over
    restart = env.restart_count
    if chosen != (str(Path(saving.resume_from).resolve()) if saving.resume_from else None):
        say(f"{f'restart {restart}: ' if restart else ''}resuming from {chosen}")
    why = nothing_to_train(chosen, int(store.read_manifest(Path(chosen))["step"]), config.job.steps)
    if why:
        say(why)
    return dataclasses.replace(config, checkpoint=dataclasses.replace(saving, resume_from=chosen)), why is not None


class StopRequest:
    """Set by SIGTERM, SIGINT or SIGHUP; the training loop polls it once per step (which also serves as a heartbeat)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.last_poll = time.monotonic()
        self.poll_interval = 0.0  # seconds between the loop's polls, smoothed
        self.name: str | None = None  # the signal that asked to stop ("SIGTERM")

    def is_set(self) -> bool:
        now = time.monotonic()
        self.poll_interval = 0.7 * self.poll_interval + 0.3 * (now - self.last_poll)
        self.last_poll = now
        return self.event.is_set()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # a scheduler's, Ctrl-C's, a closed terminal's


def arm_sigterm(say) -> StopRequest:
    """Route SIGTERM, SIGINT and SIGHUP to a watcher thread (each stops the run the same way: finish
    the step, save, exit 128 + the signal); call from the main thread.

    The C-level handler writes the signal's number to a wakeup pipe whichever thread the kernel
    delivers it to (torch's own threads block no signal), and the watcher reads it there, so it is
    seen even while the main thread is blocked in a collective."""
    request = StopRequest()
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    for number in STOP_SIGNALS:
        signal.signal(number, lambda *_: None)  # the Python-level handler: nothing; the pipe does the work
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)

    def watch() -> None:
        signum = 0
        while signum not in STOP_SIGNALS:
            signum = os.read(read_end, 1)[0]
        name = request.name = signal.Signals(signum).name
        received = time.monotonic()
        request.event.set()
        say(f"{name}: finishing the step, then saving and stopping")
        # a loop that polls again has seen the request; one that does not is stuck (e.g. a dead peer)
        patience = min(SIGTERM_GRACE_S, max(10.0, 3.0 * request.poll_interval))
        while time.monotonic() - received < SIGTERM_GRACE_S:
            if request.last_poll < received and time.monotonic() - received > patience:
                break
            time.sleep(0.2)
        say(f"{name}: the training loop did not stop in time; exiting")
        os._exit(128 + signum)

    threading.Thread(target=watch, name="plait-sigterm", daemon=True).start()
    return request


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0])

    def train(env: RankEnv) -> None:
        config = RunConfig.load(run_dir / "config.json")
        say = console(env)
        stop = arm_sigterm(say)
        device = rank_device(config.runtime.device, env.local_rank)
        init_process_group(env, device, config.runtime.timeout_s)
        faults = FaultPlan.from_environ(env)
        from plait.run.trainer import run_training

        config, finished = startup_config(config, env, say)
        if not finished:
            result = run_training(config, device=device, stop=stop, env=env, faults=faults)
            if dist.get_rank() == 0:
                atomic_write_text(run_dir / "summary.json", json.dumps(result.summary.to_dict()), "run summary")

    run_as_worker(run_dir, "train", train)


if __name__ == "__main__":
    main()
