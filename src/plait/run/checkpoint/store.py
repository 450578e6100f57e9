"""Checkpoint directories on disk: naming, manifest, verification, pruning (no torch).

A checkpoint directory ``--checkpoint-dir DIR`` holds one sub-directory per saved step::

    DIR/step_00000040/            complete: the DCP files + manifest.json
    DIR/step_00000060.tmp-<id>/   being written (or left by a crash): never read, removed later

A save writes everything into the ``.tmp-`` directory, checksums the files, writes
``manifest.json`` (sizes and CRC-32 of every file, the run config with the job file of the
``plait train`` command line (``job_file``), the step) last, and only
then renames the directory to its final name. A directory without a valid manifest is
therefore never mistaken for a checkpoint, and nothing is ever written in place: a final
name that already exists is an error, not an overwrite.

The step in a name is the number of optimizer steps completed: ``step_00000040`` resumes at
step 40 (0-based), the 41st step.

The manifest is verified, not trusted: it carries ``checksum``, the SHA-256 of its own body
(canonical JSON without that field), its ``step`` must be the directory's, and a manifest of the
wrong shape (missing keys, wrong types) refuses its checkpoint like a corrupt file does, so that
the previous checkpoint is used. Manifests of earlier plait versions have no checksum and still
load (``has_checksum`` tells).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from plait.atomic import atomic_output
from plait.errors import PlaitError

MANIFEST = "manifest.json"
FORMAT = "plait-checkpoint"
VERSION = 1
_FINAL = re.compile(r"^step_(\d{8})$")
_CHUNK = 8 << 20  # bytes read at a time when checksumming


def final_name(step: int) -> str:
    return f"step_{step:08d}"


def temp_name(step: int, token: str) -> str:
    return f"{final_name(step)}.tmp-{token}"


def crc32_file(path: Path) -> str:
    """CRC-32 of a file's bytes, as 8 hex digits."""
    crc = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc & 0xFFFFFFFF:08x}"


def data_files(directory: Path) -> list[str]:
    """The files of a checkpoint other than its manifest, sorted (the order ranks split them in)."""
    return sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != MANIFEST)


def file_records(directory: Path, names: list[str]) -> dict[str, dict]:
    """{name: {"bytes", "crc32"}} for ``names`` inside ``directory``."""
    return {name: {"bytes": (directory / name).stat().st_size, "crc32": crc32_file(directory / name)}
            for name in names}


def write_manifest(directory: Path, step: int, files: dict[str, dict], run: dict, extra: dict) -> None:
    """Write ``manifest.json`` atomically (temporary file, fsync, rename: ``plait.atomic``) inside ``directory``."""
    body = {"format": FORMAT, "version": VERSION, "step": step, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": files, "run": run, **extra}
    body["checksum"] = manifest_checksum(body)
    with atomic_output(directory / MANIFEST, "w") as handle:  # fsync'ed; never renamed over a device
        json.dump(body, handle, indent=1)


def commit(temporary: Path, final: Path) -> None:
    """Rename a finished temporary checkpoint directory to its final name (never over one)."""
    if final.exists():
        raise PlaitError(f"checkpoint {final} already exists; plait never overwrites a checkpoint")
    _fsync_dir(temporary)
    os.rename(temporary, final)
    _fsync_dir(final.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint directory and its manifest."""

    path: Path
    step: int
    manifest: dict

    @property
    def run(self) -> dict:
        """The RunConfig (as a dict) of the run that saved it: ``RunConfig.to_dict``'s nested form, or
        the flat form of checkpoints written by earlier plait versions (``RunConfig.from_dict`` reads both)."""
        return self.manifest["run"]


def job_file(manifest: dict) -> str | None:
    """The resolved ``plait train`` job file (TOML text; ``plait train --config`` reads it) of the run
    that saved a checkpoint: ``run.job_file`` in its manifest. None for a manifest of an earlier plait
    version, or of a run started without one (a program calling the launcher itself)."""
    run = manifest.get("run")
    text = run.get("job_file") if isinstance(run, dict) else None
    return text if isinstance(text, str) else None


def manifest_checksum(body: dict) -> str:
    """SHA-256 (hex) of a manifest's canonical JSON (sorted keys, no spaces), its ``checksum`` field left out."""
    rest = {key: value for key, value in body.items() if key != "checksum"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def has_checksum(manifest: dict) -> bool:
    """Whether a manifest carries its own checksum (those of earlier plait versions do not)."""
    return "checksum" in manifest


def read_manifest(path: Path) -> dict:
    """The manifest of checkpoint directory ``path``, checked (format, checksum, shape, step); PlaitError if
    missing, unreadable, edited or malformed."""
    file = path / MANIFEST
    if not file.is_file():
        raise PlaitError(f"{path} has no {MANIFEST}: not a complete plait checkpoint")
    try:
        manifest = json.loads(file.read_text())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise PlaitError(f"{file} is unreadable ({str(exc)[:200]})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PlaitError(f"{file} is not a plait checkpoint manifest")
    if manifest.get("version") != VERSION:
        raise PlaitError(f"{file} has format version {manifest.get('version')}; this plait reads {VERSION}")
    if has_checksum(manifest) and manifest["checksum"] != manifest_checksum(manifest):
        raise PlaitError(f"checkpoint {path.name} is corrupt: {MANIFEST} fails its checksum (edited or damaged)")
    _check_shape(file, manifest)
    match = _FINAL.match(path.name)
    if match and int(match.group(1)) != manifest["step"]:
        raise PlaitError(f"checkpoint {path.name} is corrupt: its {MANIFEST} says step {manifest['step']}")
    return manifest


def _check_shape(file: Path, manifest: dict) -> None:
    """PlaitError unless the manifest has the keys and types a checkpoint needs."""
    for key in ("step", "files", "run"):
        if key not in manifest:
            raise PlaitError(f"{file} lacks {key!r}")
    step, files = manifest["step"], manifest["files"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise PlaitError(f"{file}: 'step' is {step!r}, not a step count")
    if not isinstance(manifest["run"], dict):
        raise PlaitError(f"{file}: 'run' is not an object")
    if not isinstance(files, dict):
        raise PlaitError(f"{file}: 'files' is not an object")
    for name, record in files.items():
        if not (isinstance(record, dict) and isinstance(record.get("bytes"), int)
                and isinstance(record.get("crc32"), str)) or "/" in name or name in ("", ".", ".."):
            raise PlaitError(f"{file}: the record of file {name!r} is malformed")


def verify(path: Path, checksums: bool = True, check=None) -> Checkpoint:
    """Check every file against the manifest (present, size, CRC-32); PlaitError naming the first problem.

    ``check(path, manifest)``, when given, is a further test of the manifest (e.g. that its run
    config loads) that raises PlaitError to refuse the checkpoint."""
    manifest = read_manifest(path)
    if check is not None:
        check(path, manifest)
    for name, record in sorted(manifest["files"].items()):
        check_file(path, name, record, checksums)
    return Checkpoint(path=path, step=int(manifest["step"]), manifest=manifest)


def check_file(path: Path, name: str, record: dict, checksum: bool = True) -> None:
    """One file of checkpoint ``path`` against its manifest record; PlaitError if missing, resized or changed."""
    file = path / name
    if not file.is_file():
        raise PlaitError(f"checkpoint {path.name} is incomplete: {name} is missing")
    size = file.stat().st_size
    if size != record["bytes"]:
        raise PlaitError(f"checkpoint {path.name} is corrupt: {name} has {size} bytes, "
                         f"the manifest says {record['bytes']} (truncated?)")
    if checksum and crc32_file(file) != record["crc32"]:
        raise PlaitError(f"checkpoint {path.name} is corrupt: {name} fails its CRC-32 check")


def step_of(path: Path) -> int:
    """The step in a ``step_NNNNNNNN`` checkpoint directory's name."""
    return int(_FINAL.match(path.name).group(1))


def complete_dirs(root: Path) -> list[Path]:
    """Final-named checkpoint directories under ``root``, oldest step first (not yet verified)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _FINAL.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_valid(root: Path, checksums: bool = True, check=None) -> tuple[Checkpoint | None, list[tuple[Path, str]]]:
    """The newest checkpoint under ``root`` that verifies (``verify``'s ``check`` too), and (path, why) of
    each newer one refused."""
    refused = []
    for path in reversed(complete_dirs(root)):
        try:
            return verify(path, checksums, check), refused
        except PlaitError as exc:
            refused.append((path, str(exc)))
    return None, refused


def resolve(target: str | Path, checksums: bool = True, check=None) -> tuple[Checkpoint, list[tuple[Path, str]]]:
    """The checkpoint that ``--resume target`` means: a checkpoint directory itself, or the newest
    valid one in a checkpoint root (``verify``'s ``check`` too). Returns it and (path, why) of each
    refused newer one."""
    path = Path(target)
    if not path.exists():
        raise PlaitError(f"--resume {target}: no such directory")
    if not path.is_dir():
        raise PlaitError(f"--resume {target}: not a directory")
    if (path / MANIFEST).exists():
        return verify(path, checksums, check), []
    found, refused = latest_valid(path, checksums, check)
    if found is None:
        why = "; ".join(text for _, text in refused) if refused else "it holds no step_NNNNNNNN checkpoint"
        raise PlaitError(f"--resume {target}: no valid checkpoint ({why})")
    return found, refused


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints, and stale temporary directories
    (left by crashed saves) older than the newest complete one. Returns what was removed."""
    removed = []
    finals = complete_dirs(root)
    if keep > 0:
        for path in finals[:-keep]:
            doomed = path.with_name(path.name + ".deleting")  # a crash mid-delete leaves no broken step_N
            os.rename(path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            removed.append(path)
    newest = step_of(finals[-1]) if finals else None
    for path in root.iterdir() if root.is_dir() else []:
        match = re.match(r"^step_(\d{8})\.(tmp-|deleting)", path.name)
        if match and path.is_dir() and newest is not None and int(match.group(1)) <= newest:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def leftovers(root: Path) -> list[tuple[Path, int]]:
    """(path, bytes) of each directory a failed save or prune left in ``root`` (``.tmp-``, ``.deleting``)."""
    found = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.is_dir() and re.match(r"^step_\d{8}\.(tmp-|deleting)", path.name):
            found.append((path, sum(f.stat().st_size for f in path.rglob("*") if f.is_file())))
    return found


def remove_leftovers(root: Path) -> list[str]:
    """Remove what failed saves left in ``root`` (call only while no run writes there); returns notes."""
    notes = []
    for path, size in leftovers(root):
        shutil.rmtree(path, ignore_errors=True)
        notes.append(f"removed {path.name}, left by a failed save ({size / 2**20:.1f} MiB)")
    return notes


def check_writable(root: Path) -> None:
    """Create ``root`` if needed and make sure a file can be written there (before training)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".plait-write-test-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise PlaitError(f"--checkpoint-dir {root} is not writable ({exc.strerror or exc})") from None
