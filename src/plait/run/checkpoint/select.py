"""Which checkpoint a run resumes from, and whether it may (the launcher's and the workers' rules, in one place).

The checkpoint's manifest holds the RunConfig of the run that wrote it. A resumed run keeps
everything that defines the training trajectory - model, global batch, sequence length, seed,
data, optimizer and schedule (``check_same_run``) - and may change how it runs: the layout and
the number of processes (``plait.run.replan``). It must have steps left to train
(``nothing_to_train``).

The launcher (``plait train --resume``) checks sizes and prepares the checkpoint directory
(``prepare_checkpoint_root``); the workers list the ``candidates``, newest first, and take the
first one that verifies on all ranks (``choose_checkpoint``: the files split between the ranks,
each checked for size and CRC-32); refused ones where the run writes are set aside.
Importing this module does not import torch (the collectives import it when called).
"""

from __future__ import annotations

import os
from pathlib import Path

from plait.errors import PlaitError
from plait.run.checkpoint import store
from plait.run.config import CheckpointConfig, RunConfig


def check_same_run(saved: RunConfig, model=None, global_batch: int | None = None, seq_len: int | None = None,
                   path: str = "") -> None:
    """Refuse to resume a checkpoint as a different run (another model, batch or sequence length)."""
    job = saved.job
    if model is not None and model != job.model:
        raise PlaitError(f"checkpoint {path} holds model {job.model.name}, not {model.name}")
    if global_batch is not None and global_batch != job.global_batch:
        raise PlaitError(f"checkpoint {path} was trained with global batch {job.global_batch}; a resumed run "
                         f"keeps it (asked: {global_batch}). Drop --global-batch")
    if seq_len is not None and seq_len != job.seq_len:
        raise PlaitError(f"checkpoint {path} was trained with seq_len {job.seq_len}; a resumed run keeps it "
                         f"(asked: {seq_len}). Drop --seq-len")


def data_of(data: str, model, seed: int, seq_len: int, tokenizer: str = "bytes",
            text_key: str = "text") -> tuple[str, str | None]:
    """(the absolute path, the fingerprint) of a run's token file, opened and checked against the
    model (a PlaitError naming the file when it cannot be used); ("synthetic", None) for synthetic data.
    The absolute path lets a resume from any working directory find it. A mixture
    (``plait.run.data.mixture``): its spec with absolute paths, and every source's fingerprint."""
    if data == "synthetic":
        return data, None
    from plait.run.data.mixture import open_data
    from plait.run.data.mixture_spec import canonical, is_mixture

    tokens = open_data(data, model.vocab, seed, seq_len=seq_len, model_name=model.name, tokenizer=tokenizer,
                       text_key=text_key)
    if not is_mixture(data):
        return os.path.abspath(data), tokens.fingerprint
    tokens.close()
    return canonical(data), tokens.fingerprint


def check_same_data(saved_id: str | None, data: str, data_id: str | None, allow_change: bool,
                    path: str = "") -> str | None:
    """Refuse to resume checkpoint ``path`` (whose run read tokens fingerprinted ``saved_id``) on the
    token file ``data`` (fingerprint ``data_id``) when they differ, unless ``allow_change`` (then a
    note). Manifests of earlier plait versions have no fingerprint: nothing to check."""
    if saved_id is None or data_id is None or saved_id == data_id:
        return None
    if not allow_change:
        raise PlaitError(f"token file {data} is not the one checkpoint {path} was trained on ({data_id}; the "
                         f"checkpoint's: {saved_id}); pass --allow-data-change to train on it")
    return f"--allow-data-change: training on {data} ({data_id}), not the checkpoint's data ({saved_id})"


def saved_run(manifest: dict, path: str | Path = "") -> RunConfig:
    """The RunConfig recorded in a checkpoint's manifest; PlaitError (the checkpoint is refused) when it does
    not load."""
    try:
        return RunConfig.from_dict(manifest["run"])
    except PlaitError as exc:
        raise PlaitError(f"checkpoint {Path(path).name} has a malformed run config: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlaitError(f"checkpoint {Path(path).name} has a malformed run config "
                         f"({type(exc).__name__}: {exc})") from None


def check_given(saved: RunConfig, given: dict[str, object], path: str = "") -> None:
    """Refuse flags whose value differs from the saved run's: ``given`` maps a flag (``--lr``) to
    (its value, the saved value); a value of None was not given. Equal values are accepted."""
    for flag, (value, was) in given.items():
        if value is not None and value != was:
            raise PlaitError(f"{flag} {value} differs from the checkpoint's {was} ({path}): a resumed run keeps "
                             f"the run's {flag[2:]}; drop {flag} or pass the saved value, or start a new run "
                             "with --fresh and another --checkpoint-dir")


def set_aside(paths: list[Path]) -> list[Path]:
    """Rename refused (corrupt) checkpoint directories to ``<name>.corrupt-<n>``: kept, never reused."""
    moved = []
    for path in paths:
        n = 0
        while (target := path.with_name(f"{path.name}.corrupt-{n}")).exists():
            n += 1
        try:
            os.rename(path, target)
        except OSError:
            continue
        moved.append(target)
    return moved


def nothing_to_train(checkpoint: str | Path, step: int, steps: int) -> str | None:
    """Why resuming ``checkpoint`` (saved after ``step`` optimizer steps) leaves nothing for a run of
    ``steps`` steps to train, or None when steps remain."""
    if step < steps:
        return None
    return f"checkpoint {Path(checkpoint).name} is at step {step} and the run has {steps} steps: nothing to train"


def newer_than(checkpoint: store.Checkpoint, root: Path) -> list[Path]:
    """Complete checkpoints in ``root`` with a later step than ``checkpoint``."""
    return [p for p in store.complete_dirs(root) if store.step_of(p) > checkpoint.step]


def prepare_checkpoint_root(checkpoint: store.Checkpoint, root: Path, refused: list[Path]) -> list[str]:
    """Make ``root`` safe to write the resumed run's checkpoints into; returns notes.

    Newer checkpoints that failed verification (``refused``) are set aside; newer valid ones
    mean the user resumes from an older step into the same directory, which would collide.
    """
    refused_paths = {p.resolve() for p in refused}
    newer = newer_than(checkpoint, root)
    valid = [p for p in newer if p.resolve() not in refused_paths]
    if valid:
        raise PlaitError(f"{root} holds newer checkpoints ({', '.join(p.name for p in valid)}) than "
                         f"{checkpoint.path.name}; resuming there would collide with them. Resume from the newest, "
                         "or pass a new --checkpoint-dir")
    return [f"set aside the refused checkpoint as {moved.name}"
            for moved in set_aside([p for p in newer if p.resolve() in refused_paths])]


def candidates(saving: CheckpointConfig) -> list[str]:
    """Checkpoints to try, newest first: the checkpoint directory's newer ones, then ``resume_from``
    and the older ones beside it (the fallback when it fails verification)."""
    start = int(store.read_manifest(Path(saving.resume_from))["step"]) if saving.resume_from else -1
    out: list[Path] = []
    if saving.dir:
        out += [p for p in reversed(store.complete_dirs(Path(saving.dir)))
                if store.step_of(p) > start]
    if saving.resume_from:
        origin = Path(saving.resume_from)
        out.append(origin)
        out += [p for p in reversed(store.complete_dirs(origin.parent)) if store.step_of(p) < start]
    unique = dict.fromkeys(str(p.resolve()) for p in out)
    return list(unique)


def verify_in_parallel(path: Path) -> str | None:
    """Check checkpoint ``path`` against its manifest, its files split over the ranks (a collective).

    Returns the first problem found (the same on every rank), or None when every file is present
    with its recorded size and CRC-32.
    """
    import torch.distributed as dist

    problem = None
    try:
        manifest = store.read_manifest(path)
        saved_run(manifest, path)
        names = sorted(manifest["files"])
        for name in names[dist.get_rank()::dist.get_world_size()]:
            store.check_file(path, name, manifest["files"][name])
    except PlaitError as exc:
        problem = str(exc)
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    return next((p for p in problems if p), None)


def choose_checkpoint(candidates: list[str], writable_root: str | None, say) -> tuple[str | None, list[str]]:
    """The first of ``candidates`` (newest first) that verifies on all ranks (a collective), and what was refused.

    Refused candidates inside ``writable_root`` (where this run will write) are set aside by rank 0
    as ``<name>.corrupt-<n>``, so that a later save cannot collide with them.
    """
    import torch.distributed as dist

    refused = []
    for candidate in candidates:
        problem = verify_in_parallel(Path(candidate))
        if problem is None:
            return candidate, refused
        refused.append(problem)
        say(f"refused {problem}")
        if dist.get_rank() == 0 and writable_root and Path(candidate).parent.resolve() == Path(writable_root).resolve():
            for moved in set_aside([Path(candidate)]):
                say(f"set aside the refused checkpoint as {moved.name}")
        dist.barrier()
    return None, refused
