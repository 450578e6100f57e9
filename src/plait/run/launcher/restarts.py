"""Restart notes: when torchrun (``--max-restarts``) restarts the workers, say which rank died and how.

torchrun's agent runs in the ``plait train`` process and restarts the workers without saying
why. ``restart_notes`` watches the agent for the duration of one launch: after each failed
attempt it prints the root cause (``plait.run.launcher.outcome.failed_run``: ``rank 1 was killed
by SIGKILL (exit -9): ...``) and the restart number, then clears that attempt's error files so
that a later failure is not blamed on it. Torch is imported when it is used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from plait.run.launcher.outcome import failed_run, first_line


def restart_note(run_dir: Path, what: str, exits: dict[int, int], restart: int, max_restarts: int) -> str:
    """The line printed before torchrun's restart ``restart`` (of ``max_restarts``) after ranks failed with ``exits``."""
    _, message = failed_run(run_dir, what, exits=exits)
    return f"{first_line(message)}; torchrun restarts the workers (restart {restart} of {max_restarts})"


@contextlib.contextmanager
def restart_notes(run_dir: Path, what: str, say: Callable[[str], None]):
    """Within the block, every torchrun restart after a failure is announced with ``say(note)``."""
    try:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    except ImportError:  # another torch: no notes, the run itself is unaffected
        yield
        return
    names = ("_monitor_workers", "_restart_workers")
    if not all(hasattr(LocalElasticAgent, name) for name in names):
        yield
        return
    own = {name: LocalElasticAgent.__dict__.get(name) for name in names}
    monitor, restart = LocalElasticAgent._monitor_workers, LocalElasticAgent._restart_workers

    def watched_monitor(agent, group):
        result = monitor(agent, group)
        agent.plait_failures = {rank: failure.exitcode for rank, failure in (result.failures or {}).items()}
        return result

    def noted_restart(agent, group):
        exits = getattr(agent, "plait_failures", None)
        if exits:
            try:
                total = group.spec.max_restarts
                say(restart_note(run_dir, what, exits, total - agent._remaining_restarts, total))
                for stale in run_dir.glob("error-rank*.json"):
                    stale.unlink(missing_ok=True)
            except Exception:  # noqa: BLE001 - a note must never stop a restart
                pass
            agent.plait_failures = {}
        return restart(agent, group)

    LocalElasticAgent._monitor_workers, LocalElasticAgent._restart_workers = watched_monitor, noted_restart
    try:
        yield
    finally:
        for name, method in own.items():
            if method is None:
                delattr(LocalElasticAgent, name)
            else:
                setattr(LocalElasticAgent, name, method)
