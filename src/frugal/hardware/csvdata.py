"""Reading frugal's data files: CSV whose '#' lines carry the source and date."""

from __future__ import annotations

import csv
from collections.abc import Iterator


def _kept(text: str) -> list[tuple[int, str]]:
    return [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip() and ln[0] != "#"]


def header(text: str) -> list[str]:
    """The column names (the first line that is not a comment)."""
    kept = _kept(text)
    return [c.strip() for c in kept[0][1].split(",")] if kept else []


def data_rows(text: str) -> Iterator[tuple[int, dict[str, str]]]:
    """Rows with their 1-based line numbers in `text`; comments and blank lines skipped."""
    kept = _kept(text)
    if not kept:
        return
    reader = csv.DictReader(line for _, line in kept)
    for (lineno, _), row in zip(kept[1:], reader, strict=False):
        yield lineno, row
