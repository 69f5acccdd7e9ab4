"""Writing files so that a crash leaves the old file or the new one, never half of either."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: str | Path, text: str, durable: bool = False) -> None:
    """Write `text` beside `path`, then rename it over `path`. `durable` also fsyncs the
    file before the rename, so the new content survives a power loss, not only a crash."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    if durable:
        fsync_file(tmp)
    tmp.replace(path)
