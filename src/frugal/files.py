"""Writing files: checked before any work, whole or not at all, and never over a user's file.

Every file a command writes for the user (a run config, an emitted script or task, a chart,
an export) goes through `check_target` before the command does its work, then through
`replacing`: the new content is written to a temporary file beside the target and renamed
over it, so a crash leaves the old file or the new one, never half of either. A file that
already exists is replaced only with --force.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from frugal.errors import FrugalError

NAME_MAX = 255  # bytes in one file name on Linux, macOS and Windows file systems


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _bad(flag: str, path: str | Path, why: str) -> FrugalError:
    return FrugalError(f"{flag} {path}: {why}")


def check_dir(path: str | Path, flag: str) -> Path:
    """A directory a command will write in (created if missing): refused, before any work,
    where it cannot be (a file in the way, a name too long, a place nobody may write)."""
    p = Path(path)
    for part in p.parts:
        if len(part.encode()) > NAME_MAX:
            raise _bad(flag, path, f"a name in it is over {NAME_MAX} bytes: shorten it")
    existing = p
    while not existing.exists():
        if existing.is_symlink():
            raise _bad(flag, path, f"{existing} is a broken link: remove it or choose another")
        existing = existing.parent
    if not existing.is_dir():
        where = "it" if existing == p else str(existing)
        raise _bad(flag, path, f"{where} is a file, not a directory: choose another path")
    _probe(existing, flag, path)
    return p


def check_target(path: str | Path, flag: str, *, force: bool = False) -> Path:
    """A file a command will write: refused, before any work, with one line naming the path
    and the reason, where it cannot be written (missing or read-only directory, a directory
    or a device in its place, a name over 255 bytes) or where it exists and `force` is off."""
    p = Path(path)
    if not p.name or p.name in (".", ".."):
        raise _bad(flag, path, "name a file, not a directory")
    if len(p.name.encode()) > NAME_MAX:
        raise _bad(flag, path, f"the name is over {NAME_MAX} bytes: shorten it")
    parent = p.parent
    if not parent.is_dir():
        why = "is a file" if parent.exists() else "does not exist"
        raise _bad(flag, path, f"the directory {parent} {why}: create it, or choose another")
    if p.is_dir():
        raise _bad(flag, path, "is a directory: name a file in it")
    if p.exists() or p.is_symlink():
        if p.exists() and not stat.S_ISREG(p.stat().st_mode):
            raise _bad(flag, path, "is not a regular file (a device, pipe or socket)")
        if not force:
            raise _bad(flag, path, "exists: add --force to replace it, or choose another name")
    _probe(parent, flag, path)
    return p


def _probe(directory: Path, flag: str, path: str | Path) -> None:
    """Create and remove a file in `directory`: the one test that a read-only file system,
    an immutable directory or /proc fails the way the real write would."""
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".frugal-probe-")
    except OSError as e:
        raise _bad(flag, path, f"cannot write in {directory} ({e.strerror})") from None
    os.close(fd)
    os.unlink(name)


@contextmanager
def replacing(path: str | Path, durable: bool = False) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix, so a chart library picks the format) to
    write to; renamed over `path` when the block ends, removed if it raises. `durable` also
    fsyncs the file before the rename and the directory after it, so the new content
    survives a power loss, not only a crash."""
    path = Path(path)
    # a name within the 255 bytes a file name may have, whatever the target's length in bytes
    stem = path.name.encode()[:100].decode(errors="ignore")
    suffix = path.suffix if len(path.suffix.encode()) <= 16 else ""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{stem}.", suffix=suffix)
    os.close(fd)
    tmp = Path(name)
    # mkstemp makes the file private (0600): give it the mode the file had, or a new file's
    os.chmod(tmp, stat.S_IMODE(path.stat().st_mode) if path.is_file() else 0o666 & ~_umask())
    try:
        yield tmp
        if durable:
            fsync_file(tmp)
        tmp.replace(path)
        if durable:
            fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def write_text_atomic(path: str | Path, text: str, durable: bool = False) -> None:
    """Write `text` to `path` whole or not at all (see `replacing`)."""
    with replacing(path, durable) as tmp:
        tmp.write_text(text)
