"""How a ``plait train`` run ended, as a file: ``RUN_DIR/outcome.json`` (format ``plait-outcome/1``).

The launcher writes it on every exit of a launched run (``plait.run.launcher.launch.launch``),
and ``plait train`` writes it for a run refused before launch when ``--run-dir`` is given; ``plait
sweep`` reads it instead of parsing the command's stderr. No torch.

Schema (one JSON object)::

    {"format": "plait-outcome/1",
     "status": "ok" | "refused" | "failed" | "oom" | "stopped",
     "reason": str,            # one line, "" when ok: the error plait train printed (without the traceback)
     "failed_rank": int|null,  # the global rank whose failure ended the run (failed, oom)
     "exit_code": int|null,    # the status plait train exits with: 0 ok, 2 refused/failed/oom, 143 stopped
     "signal": str|null}       # "SIGTERM" (stopped), or the signal that killed the failed rank ("SIGKILL")

Statuses: ``ok`` the workers finished; ``refused`` plait train would not start it (a bad flag, a
layout rule, a predicted out-of-memory, a multi-node setup torchrun cannot take); ``failed`` a
worker raised or died, or torchrun could not start the workers; ``oom`` a worker ran out of
(device) memory; ``stopped`` a signal (SIGTERM, SIGINT) stopped the run after the workers saved
what they could. A run killed outright (SIGKILL to plait train) writes nothing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from plait.atomic import atomic_write_text
from plait.errors import PlaitError

FORMAT = "plait-outcome/1"
FILE_NAME = "outcome.json"
STATUSES = ("ok", "refused", "failed", "oom", "stopped")
EXIT_OK, EXIT_ERROR, EXIT_STOPPED = 0, 2, 143  # plait's CLI: 2 for any PlaitError, 128 + the signal when stopped (SIGTERM 143)


@dataclass(frozen=True)
class Outcome:
    """How one run ended (see the module docstring for each field)."""

    status: str
    reason: str = ""
    failed_rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None

    def __post_init__(self):
        if self.status not in STATUSES:
            raise PlaitError(f"outcome status {self.status!r} is not one of {', '.join(STATUSES)}")

    def to_dict(self) -> dict:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> Outcome:
        """The outcome of a parsed ``outcome.json``; PlaitError for another format or a bad field."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise PlaitError(f"not a {FORMAT} outcome (format {found!r})")
        rank, code, signal = data.get("failed_rank"), data.get("exit_code"), data.get("signal")
        if not isinstance(data.get("reason", ""), str) or any(
                v is not None and (not isinstance(v, int) or isinstance(v, bool)) for v in (rank, code)) \
                or not (signal is None or isinstance(signal, str)):
            raise PlaitError(f"{FORMAT} outcome with a field of the wrong type: {data}")
        return cls(status=data.get("status"), reason=data.get("reason", ""), failed_rank=rank, exit_code=code,
                   signal=signal)


def outcome_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FILE_NAME


def write_outcome(run_dir: str | Path, outcome: Outcome) -> Path:
    """Write ``RUN_DIR/outcome.json`` atomically (a reader never sees half a file); returns its path."""
    path = outcome_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(outcome.to_dict(), indent=2) + "\n", "outcome file")
    return path


def read_outcome(run_dir: str | Path) -> Outcome | None:
    """The outcome written in ``run_dir``, or None when there is none (the run died before writing it).

    PlaitError when the file is there but unreadable or not a ``plait-outcome/1`` object.
    """
    path = outcome_path(run_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PlaitError(f"cannot read {path}: {exc}") from None
    try:
        return Outcome.from_dict(json.loads(text))
    except (json.JSONDecodeError, PlaitError) as exc:
        raise PlaitError(f"{path}: {exc}") from None


def first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def refused(exc: BaseException) -> Outcome:
    """The outcome of a run that plait train refused to start with ``exc`` (a PlaitError)."""
    return Outcome("refused", first_line(str(exc)), exit_code=EXIT_ERROR)


def rank_errors(run_dir: str | Path) -> list[dict]:
    """The ``error-rank<R>.json`` records the failed workers wrote, the root cause first.

    The rank that failed first is the root cause; the others then fail in collectives with their
    dead peer. Unreadable files are skipped.
    """
    errors = []
    for path in sorted(Path(run_dir).glob("error-rank*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            errors.append(record)
    errors.sort(key=lambda e: (e.get("time", 0.0), e["rank"]))
    return errors


def is_out_of_memory(record: dict) -> bool:
    """Whether a worker's error record is an out-of-memory error (torch.OutOfMemoryError, or its message)."""
    return record.get("type") == "OutOfMemoryError" or "out of memory" in str(record.get("message", "")).lower()


def failed_run(run_dir: str | Path, what: str = "training", died: str = "", dead_rank: int | None = None,
               signal: str | None = None, exits: dict[int, int] | None = None,
               memory_note: str | None = None) -> tuple[Outcome, str]:
    """(outcome, full message) of a run whose workers failed, from the error files in ``run_dir``.

    ``died`` is torchrun's one-line account, used when nothing else says what happened;
    ``dead_rank`` and ``signal`` are torchrun's first failed rank and the signal that ended it, if
    any; ``exits`` maps every rank torchrun saw fail to its exit code (negative: killed by that
    signal). The message names the root cause (``plait.run.launcher.deaths``): a rank out of
    memory, else a rank that died without a message and how (``rank 1 was killed by SIGKILL (exit
    -9): ...``), else the first error that is not a collective's, with its traceback; the ranks
    that stopped after it are summarized in one line. The outcome's reason is its first line.
    ``memory_note`` (a CPU run: the planner's host memory against what the host had available)
    makes a rank killed by SIGKILL ``killed by the OS (SIGKILL, exit -9; out of memory?) — NOTE``:
    on the CPU the kernel's OOM killer is what ends a process that runs out of memory.
    """
    from plait.run.launcher.deaths import how_it_died, is_collective, root_error, signal_of, silent_deaths

    errors = rank_errors(run_dir)
    exits = dict(exits or {})
    if dead_rank is not None and signal and dead_rank not in exits:
        exits[dead_rank] = _signal_exit(signal)
    silent = silent_deaths(exits, {e["rank"] for e in errors})
    if any(not is_collective(e) for e in errors):  # a rank failed with its own error: torchrun then
        # SIGTERMs the others, and a peer it reaches before that peer writes a file is no root cause
        silent = [rank for rank in silent if signal_of(exits[rank]) != "SIGTERM"]
    memory = [e for e in errors if is_out_of_memory(e)]
    if silent and not memory:
        root = silent[0]
        message = f"{what} failed: {how_it_died(root, exits[root])}"
        if memory_note and signal_of(exits[root]) == "SIGKILL":
            message = (f"{what} failed: rank {root} was killed by the OS (SIGKILL, exit {exits[root]}; out of "
                       f"memory?) — {memory_note}")
        others = [*silent[1:], *(e["rank"] for e in errors)]
        if others:
            after = f"; rank {errors[0]['rank']}: {first_line(errors[0].get('message', ''))[:200]}" if errors else ""
            message += f"\n(ranks {', '.join(map(str, others))} also stopped{after})"
        return Outcome("failed", first_line(message), failed_rank=root, exit_code=EXIT_ERROR,
                       signal=signal_of(exits[root])), message
    if not errors:
        message = f"{what} failed: a worker died without a message ({died or 'no detail from torchrun'})"
        return Outcome("failed", message, failed_rank=dead_rank, exit_code=EXIT_ERROR, signal=signal), message
    first = memory[0] if memory else root_error(errors)
    message = f"{what} failed on rank {first['rank']}: {first.get('message', '')}"
    reason = first_line(message)
    if "traceback" in first:
        message += "\n" + str(first["traceback"]).rstrip()
    others = [e["rank"] for e in errors if e is not first]
    if others:
        message += f"\n(ranks {', '.join(map(str, others))} also stopped)"
    status = "oom" if memory else "failed"
    own_signal = signal if dead_rank == first["rank"] else None
    return Outcome(status, reason, failed_rank=first["rank"], exit_code=EXIT_ERROR, signal=own_signal), message


def _signal_exit(name: str) -> int:
    """The exit code torchrun reports for a process killed by signal ``name`` (``SIGKILL`` → -9)."""
    import signal as signals

    try:
        return -signals.Signals[name].value
    except KeyError:
        return -1
