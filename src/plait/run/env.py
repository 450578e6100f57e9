"""The environment torchrun gives each worker process, read once (no torch import), and the
worker's tie to its launcher (``die_with_launcher``).

``RankEnv.from_environ()`` is called once in a worker's entry (``plait.run.worker``, the
profiler's worker) and the value is passed to whatever needs the rank, the restart count or
the rendezvous address; nothing else reads these variables.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass

LAUNCHER_PID = "PLAIT_LAUNCHER_PID"  # set by plait's launcher for its workers: the process they die with
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class RankEnv:
    """Where this process sits in the job (torchrun's variables; the defaults are a lone process)."""

    rank: int = 0  # RANK: global rank
    local_rank: int = 0  # LOCAL_RANK: rank on this node (the GPU index)
    world_size: int = 1  # WORLD_SIZE: processes in the job
    local_world_size: int = 1  # LOCAL_WORLD_SIZE: processes on this node
    group_world_size: int = 1  # GROUP_WORLD_SIZE: nodes (torchrun's worker groups)
    restart_count: int = 0  # TORCHELASTIC_RESTART_COUNT: 0 in the first attempt, +1 per elastic restart
    master_addr: str = "127.0.0.1"  # MASTER_ADDR: host of the rendezvous store
    master_port: int = 29500  # MASTER_PORT: its TCP port
    agent_store: bool = False  # TORCHELASTIC_USE_AGENT_STORE: torchrun's agent hosts the store (no rank does)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> RankEnv:
        """The variables of ``environ`` (default: this process's environment); missing ones take the defaults."""
        env = os.environ if environ is None else environ
        default = cls()
        world = int(env.get("WORLD_SIZE", default.world_size))

        def number(name: str, fallback: int) -> int:
            return int(env.get(name, fallback))

        return cls(rank=number("RANK", default.rank), local_rank=number("LOCAL_RANK", default.local_rank),
                   world_size=world, local_world_size=number("LOCAL_WORLD_SIZE", world),
                   group_world_size=number("GROUP_WORLD_SIZE", default.group_world_size),
                   restart_count=number("TORCHELASTIC_RESTART_COUNT", default.restart_count),
                   master_addr=env.get("MASTER_ADDR", default.master_addr),
                   master_port=number("MASTER_PORT", default.master_port),
                   agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")


def die_with_launcher(environ: Mapping[str, str] | None = None, poll_s: float = 0.5) -> None:
    """End this worker (SIGKILL) as soon as the process that started it ends.

    torchrun starts every worker in a session of its own, so a ``kill -9`` of ``plait train`` or
    of its process group (what a scheduler does) would leave the workers training, saving and
    pruning checkpoints beside the requeued run. On Linux the kernel sends the parent-death
    signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``); a thread also watches the parent's pid (other
    systems, and a parent that died before the prctl). The parent is the launcher's pid when
    ``PLAIT_LAUNCHER_PID`` names one (``plait train``), else the process that started this one.
    """
    env = os.environ if environ is None else environ
    try:
        expected = int(env.get(LAUNCHER_PID, "0")) or os.getppid()
    except ValueError:
        expected = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no prctl: the watcher thread alone
    if os.getppid() != expected:
        if not _alive(expected):  # the launcher died before the prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
        expected = os.getppid()  # started through another process (a wrapper): watch that one

    def watch() -> None:
        while True:
            threading.Event().wait(poll_s)
            if os.getppid() != expected:
                os.kill(os.getpid(), signal.SIGKILL)

    # the watcher must not take the signals the worker routes to its own threads (SIGTERM, ...)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
    try:
        threading.Thread(target=watch, name="plait-parent-watch", daemon=True).start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return True
