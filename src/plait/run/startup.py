"""What a worker does before training: agree on the config, re-plan, pick the checkpoint, arm SIGTERM.

* Every rank must run the same config (several nodes each wrote their own ``config.json``):
  the ranks compare a hash of it and refuse to start on a mismatch.
* An elastic node-count change gives the workers a world size other than the layout's: they
  re-plan, all the same way (``plait.run.checkpoint.select.replan`` is deterministic).
* With a ``checkpoint_dir``, the newest checkpoint there (or the ``resume_from`` one) that
  verifies on all ranks - the files split between them, each checked for size and CRC-32 -
  is where training starts. This covers torchrun restarts after a failure and node joins
  alike (a join restarts the workers without counting a failure). Refused ones are set aside.
* SIGTERM is received by a thread of its own (``sigwait``), so it is seen even while the main
  thread is blocked in a collective: the training loop finishes its step, saves and stops; a
  main thread that does not come back to the loop in time (stuck with a dead peer) is ended.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import torch.distributed as dist

from plait.errors import PlaitError
from plait.run.checkpoint import store
from plait.run.config import RunConfig

SIGTERM_GRACE_S = 25.0  # torchrun SIGKILLs its workers 30 s after SIGTERM


def config_digest(config: RunConfig) -> str:
    """Hash of what defines the run (not where it logs or what the planner predicted)."""
    data = config.to_dict()
    for key in ("log", "prediction", "log_every"):
        data.pop(key, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


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


def candidates(config: RunConfig) -> list[str]:
    """Checkpoints to try, newest first: the checkpoint directory's newer ones, then ``resume_from``
    and the older ones beside it (the fallback when it fails verification)."""
    start = int(store.read_manifest(Path(config.resume_from))["step"]) if config.resume_from else -1
    out: list[Path] = []
    if config.checkpoint_dir:
        out += [p for p in reversed(store.complete_dirs(Path(config.checkpoint_dir)))
                if store.step_of(p) > start]
    if config.resume_from:
        origin = Path(config.resume_from)
        out.append(origin)
        out += [p for p in reversed(store.complete_dirs(origin.parent)) if store.step_of(p) < start]
    unique = dict.fromkeys(str(p.resolve()) for p in out)
    return list(unique)


def startup_config(config: RunConfig, say) -> tuple[RunConfig, bool]:
    """(the config this attempt trains, whether training is already complete); a collective."""
    from plait.run.checkpoint.dcp import choose_checkpoint

    check_same_config(config)
    world = dist.get_world_size()
    if world != config.layout.world_size:
        from plait.run.checkpoint.select import replan

        config, why = replan(config, world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        say(why)
    if not (config.checkpoint_dir or config.resume_from):
        return config, False
    listing = [candidates(config) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(listing, src=0)
    if not listing[0]:
        return config, False
    chosen, refused = choose_checkpoint(listing[0], config.checkpoint_dir, say)
    if chosen is None:
        if config.resume_from:
            raise PlaitError(f"no valid checkpoint to resume from ({'; '.join(refused)})")
        return config, False  # nothing saved yet: start over
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if chosen != (str(Path(config.resume_from).resolve()) if config.resume_from else None):
        say(f"{f'restart {restart}: ' if restart else ''}resuming from {chosen}")
    step = int(store.read_manifest(Path(chosen))["step"])
    if step >= config.steps:
        say(f"checkpoint {Path(chosen).name} already holds all {config.steps} steps: nothing left to train")
        return dataclasses.replace(config, resume_from=chosen), True
    return dataclasses.replace(config, resume_from=chosen), False


class StopRequest:
    """Set by SIGTERM; the training loop polls it once per step (which also serves as a heartbeat)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.last_poll = time.monotonic()
        self.poll_interval = 0.0  # seconds between the loop's polls, smoothed

    def is_set(self) -> bool:
        now = time.monotonic()
        self.poll_interval = 0.7 * self.poll_interval + 0.3 * (now - self.last_poll)
        self.last_poll = now
        return self.event.is_set()


def arm_sigterm(say) -> StopRequest:
    """Route SIGTERM to a watcher thread; call before any other thread exists (threads inherit the mask)."""
    request = StopRequest()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def watch() -> None:
        signal.sigwait({signal.SIGTERM})
        received = time.monotonic()
        request.event.set()
        say("SIGTERM: finishing the step, then saving and stopping")
        # a loop that polls again has seen the request; one that does not is stuck (e.g. a dead peer)
        patience = min(SIGTERM_GRACE_S, max(10.0, 3.0 * request.poll_interval))
        while time.monotonic() - received < SIGTERM_GRACE_S:
            if request.last_poll < received and time.monotonic() - received > patience:
                break
            time.sleep(0.2)
        say("SIGTERM: the training loop did not stop in time; exiting")
        os._exit(143)

    threading.Thread(target=watch, name="plait-sigterm", daemon=True).start()
    return request
