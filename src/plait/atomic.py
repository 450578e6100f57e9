"""Writing an output file so that a reader never sees half of it - and never replacing what is not a file.

A regular file (or a new path) is written to a temporary file beside it, flushed to disk and renamed
over it. Anything else that can be opened for writing - a character or block device such as
``/dev/null``, a FIFO, ``/dev/stdout`` (a link into ``/proc``) - is written *through*: the finished
temporary file (kept in the system's temporary directory) is copied into it, and it stays what it
was. A renaming writer would have replaced ``/dev/null`` with a regular file for every program on the
machine. A directory is refused with a one-line PlaitError. The file gets the mode ``open()`` would
give it (a new one 0666 less the umask, 0644 under the usual 022; a replaced one keeps its mode),
not ``mkstemp``'s 0600, so a teammate can read a shared checkpoint directory. Torch-free; used by every writer of plait
(plans, calibration files, token files, outcome and manifest files, predictions and reports).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from plait.errors import PlaitError


def replaced_in_place(path: str | Path) -> Path | None:
    """The regular file that writing ``path`` atomically renames over (``path`` itself, or the file a
    symbolic link points to), or None when ``path`` is to be written through (a device, a FIFO, a
    socket, a link into ``/proc`` such as ``/dev/stdout``). PlaitError when ``path`` is a directory."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode  # follows links
    except FileNotFoundError:
        return path  # a new file
    except OSError as exc:
        raise PlaitError(f"cannot write {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise PlaitError(f"cannot write {path}: it is a directory; give a file name inside it")
    if not stat.S_ISREG(mode):
        return None
    if not path.is_symlink():
        return path
    return None if _links_through_proc(path) else Path(os.path.realpath(path))


def _links_through_proc(path: Path) -> Path | None:
    """The ``/proc`` path that a chain of symbolic links from ``path`` passes through (``/dev/stdout``
    -> ``/proc/self/fd/1``: a descriptor, which a rename would not reach), or None."""
    for _ in range(40):  # the kernel's own limit on links followed
        if not path.is_symlink():
            return None
        path = Path(os.path.abspath(path.parent / os.readlink(path)))
        if path.parts[1:2] == ("proc",):
            return path
    return None


def _own_descriptor(path: Path) -> int | None:
    """N when ``path`` leads to ``/proc/self/fd/N`` (or this process's own pid): one of our descriptors."""
    proc = _links_through_proc(path) if path.is_symlink() else path
    if proc is None or len(proc.parts) != 5 or proc.parts[1] != "proc" or proc.parts[3] != "fd":
        return None
    if proc.parts[2] not in ("self", str(os.getpid())) or not proc.parts[4].isdigit():
        return None
    return int(proc.parts[4])


@contextlib.contextmanager
def atomic_output(path: str | Path, mode: str = "w", **open_args) -> Iterator[IO]:
    """``with atomic_output(path, "w" | "wb", encoding=...) as handle:`` - write ``handle``; on a clean
    exit the content lands at ``path`` (renamed over a regular file, copied through into a device or
    FIFO); on an exception nothing at ``path`` changes and the temporary file is removed. The parent
    directory of a new file must exist. OSError is left to the caller (who names what it writes)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_output writes whole files: mode 'w' or 'wb', not {mode!r}")
    target = replaced_in_place(path)
    name = Path(path).name or "output"
    fd, temporary = tempfile.mkstemp(dir=None if target is None else target.parent, prefix=f".{name}.",
                                     suffix=".tmp")
    try:
        if target is not None:  # mkstemp makes 0600; the output gets what a plain open() would give it
            os.fchmod(fd, _kept_mode(target))
        with os.fdopen(fd, mode, **open_args) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if target is None:
            _copy_through(Path(temporary), Path(path))
        else:
            os.replace(temporary, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def umask() -> int:
    """This process's umask, read without changing it where the system says it (``/proc``; a
    temporary ``os.umask`` call elsewhere)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def new_file_mode() -> int:
    """The mode a new file gets from ``open()``: 0666 less the umask (0644 under the usual 022)."""
    return 0o666 & ~umask()


def honour_umask(*paths: str | Path) -> None:
    """Give files written by a library that makes them 0600 (a temporary file renamed into place)
    the mode ``open()`` would have given them."""
    mode = new_file_mode()
    for path in paths:
        os.chmod(path, mode)


def _kept_mode(target: Path) -> int:
    """The mode of the regular file an atomic write replaces (kept, as writing it in place would), or
    ``new_file_mode()`` for a new file."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        return new_file_mode()


def _copy_through(source: Path, special: Path) -> None:
    """Copy ``source`` into the device or FIFO ``special`` (opened for writing, never created or renamed).

    ``/dev/stdout`` (any ``/proc/self/fd/N``) is written through descriptor N itself, after what Python
    has buffered for it, so that the output lands where the process's own output goes, in order."""
    fd = _own_descriptor(special)
    if fd is not None:
        sys.stdout.flush()
        sys.stderr.flush()
    writer = os.fdopen(os.dup(fd), "wb") if fd is not None else open(special, "wb")  # noqa: SIM115
    with open(source, "rb") as reader, writer:
        shutil.copyfileobj(reader, writer, 1 << 20)


def atomic_write_text(path: str | Path, text: str, what: str = "file") -> None:
    """Write ``text`` (UTF-8) to ``path`` with ``atomic_output``; OSError becomes a one-line PlaitError
    naming ``what`` (e.g. "plan", "calibration file")."""
    try:
        with atomic_output(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise PlaitError(f"cannot write the {what} {path}: {exc.strerror or exc}") from None
