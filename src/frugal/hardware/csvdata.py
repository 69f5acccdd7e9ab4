"""Reading frugal's data files and the price files users give: CSV (frugal.csvrows, strict)
whose '#' lines carry the source and date."""

from __future__ import annotations

from collections.abc import Iterator

from frugal.csvrows import CsvError, Rows
from frugal.errors import FrugalError


def _rows(text: str, where: str) -> Rows:
    try:
        return Rows(text.splitlines(keepends=True), comments=True)
    except CsvError as e:
        raise FrugalError(f"{where}:{e.line}: not CSV ({e.why})") from None


def header(text: str, where: str = "data file") -> list[str]:
    """The column names (the first row that is not a comment), stripped."""
    return [c.strip() for c in _rows(text, where).header]


def data_rows(text: str, where: str = "data file") -> Iterator[tuple[int, dict[str, str]]]:
    """Rows with the line each starts on in `text`; comments and blank lines skipped; a row
    that is not CSV is one line naming `where` (the file) and the line."""
    rows = _rows(text, where)
    try:
        for line, row in rows:
            yield line, {k.strip(): v for k, v in row.items()}
    except CsvError as e:
        raise FrugalError(f"{where}:{e.line}: not CSV ({e.why})") from None
