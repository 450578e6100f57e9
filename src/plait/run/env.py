"""The environment torchrun gives each worker process, read once (no torch import).

``RankEnv.from_environ()`` is called once in a worker's entry (``plait.run.worker``, the
profiler's worker) and the value is passed to whatever needs the rank, the restart count or
the rendezvous address; nothing else reads these variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


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
