"""Where the prices come from: the catalog bundled with frugal, or the last `frugal offers
update`, kept in frugal's cache.

A snapshot is an offers CSV (the columns of data/offers.csv) whose first comment lines say
what it is:

    # frugal offers snapshot
    # retrieved: 2026-11-25T23:10:00Z
    # source: skypilot https://raw.githubusercontent.com/skypilot-org/skypilot-catalog/...

`install` writes a new one beside the old and renames it into place, so a reader sees the
old snapshot or the new one, never half of either; the one it replaces is kept as
`offers.previous.csv`. A snapshot that cannot be read is reported once and passed over for
the previous one, then for the bundled catalog.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

from frugal.files import replacing
from frugal.paths import cache_dir
from frugal.times import parse_time

MAGIC = "# frugal offers snapshot"
CURRENT = "offers.csv"
PREVIOUS = "offers.previous.csv"


@dataclass(frozen=True)
class Snapshot:
    """What a set of prices is: its name, when it was read, where from."""

    label: str  # "bundled catalog" or "offers update"
    retrieved: datetime
    source: str
    path: str | None = None  # None: the bundled catalog

    def describe(self) -> str:
        when = self.retrieved.strftime("%Y-%m-%d %H:%M UTC").replace(" 00:00 UTC", "")
        return f"{self.label} of {when}"


def offers_dir() -> Path:
    """frugal's price cache: the current snapshot and the one before it (`offers/` in
    frugal's cache, or `FRUGAL_OFFERS_DIR`)."""
    env = os.environ.get("FRUGAL_OFFERS_DIR")
    return Path(env) if env else cache_dir("offers")


def header(retrieved: datetime, source: str) -> str:
    stamp = retrieved.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{MAGIC}\n# retrieved: {stamp}\n# source: {source}\n"


def meta(text: str, label: str, path: str | None) -> Snapshot | None:
    """The snapshot a text says it is (None when its first lines are not a snapshot's)."""
    lines = text.splitlines()[:3]
    if len(lines) < 3 or lines[0].strip() != MAGIC:
        return None
    fields = dict(ln.lstrip("# ").partition(": ")[::2] for ln in lines[1:])
    try:
        retrieved = parse_time(fields.get("retrieved", ""))
    except ValueError:
        return None
    return Snapshot(label, retrieved, fields.get("source", "").strip(), path)


def bundled_text() -> str:
    return (resources.files("frugal.hardware") / "data" / "offers.csv").read_text()


def install(text: str) -> Path:
    """Make `text` (a snapshot) the current one; the current one becomes the previous."""
    d = offers_dir()
    d.mkdir(parents=True, exist_ok=True)
    current, previous = d / CURRENT, d / PREVIOUS
    if current.exists():  # keep it: a hard link renamed over the previous, in one step
        keep = d / f".{PREVIOUS}.{os.getpid()}"
        keep.unlink(missing_ok=True)
        os.link(current, keep)
        os.replace(keep, previous)
    with replacing(current, durable=True) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return current


def stored() -> list[Path]:
    """The cached snapshots, newest first (the current one, then the one before it)."""
    return [p for p in (offers_dir() / CURRENT, offers_dir() / PREVIOUS) if p.exists()]


def read(path: Path) -> str:
    """A snapshot's text; "" when it cannot be read (the reader reports it, passes over it)."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
