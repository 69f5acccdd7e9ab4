"""Reading CSV, one way for every CSV frugal reads (training data, billing exports, price
files, frugal's own data files): strict, as RFC 4180 has it, so a file that would be
misread is refused instead.

- A quote that opens a cell and never closes, or text after a closing quote, is an error
  (a lenient reader runs every following row into one cell: a three-row bill read as one).
- A row with more or fewer cells than the header is an error (an unquoted comma splits a
  cell; a short row leaves columns empty without a word).
- Each row comes with the line it starts on, counting blank lines and, where asked,
  comment lines; an error names that line.
- A cell may be as long as a row of long-context training text (no 128 KiB limit); a
  UTF-8 byte-order mark (Excel's "CSV UTF-8") is dropped.
"""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Iterable, Iterator

from frugal.errors import FrugalError

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # the stdlib's 128 KiB would refuse long rows


class CsvError(ValueError):
    """A CSV that cannot be read as written: `line` is where the bad row starts."""

    def __init__(self, line: int, why: str) -> None:
        super().__init__(f"line {line}: {why}")
        self.line, self.why = line, why


class Rows:
    """The rows of CSV `lines` (each with its line end) under the header, the first row that
    is not blank (or a '#' comment, with `comments`): `header`, then iterate for (line, row)
    pairs, each row a dict of the header's columns."""

    def __init__(self, lines: Iterable[str], comments: bool = False) -> None:
        self._numbers: list[int] = []  # the file's line number of each line given to csv

        def kept() -> Iterator[str]:
            for n, line in enumerate(lines, 1):
                if n == 1:
                    line = line.removeprefix("\ufeff")
                if comments and line.lstrip().startswith("#"):
                    continue
                self._numbers.append(n)
                yield line

        self._reader = csv.reader(kept(), strict=True)
        self._done = 0  # lines csv has consumed
        self.header: list[str] = []
        for _, cells in self._records():
            if cells:
                self.header = cells
                break

    def _records(self) -> Iterator[tuple[int, list[str]]]:
        while True:
            start = self._done  # the next record starts on the line after the last one
            try:
                cells = next(self._reader)
            except StopIteration:
                return
            except csv.Error as e:
                why = "a quoted cell is never closed" if "end of data" in str(e) else str(e)
                raise CsvError(self._line(start), why) from None
            self._done = self._reader.line_num
            yield self._line(start), cells

    def _line(self, index: int) -> int:
        """The file's line number of the `index`-th line csv was given (0-based)."""
        if index < len(self._numbers):
            return self._numbers[index]
        return (self._numbers[-1] + 1) if self._numbers else 1

    def __iter__(self) -> Iterator[tuple[int, dict[str, str]]]:
        width = len(self.header)
        for line, cells in self._records():
            if not cells:  # a blank line
                continue
            if len(cells) != width:
                raise CsvError(
                    line,
                    f"{len(cells)} cells where the header has {width}: quote a cell that "
                    "holds a comma, and give each row every column",
                )
            yield line, dict(zip(self.header, cells, strict=True))


class Cells:
    """One row of a data file and where it is: typed values, each bad one a one-line
    FrugalError naming the file, line and column (price files, catalogs, reference data)."""

    def __init__(self, file: str, line: int, row: dict[str, str]) -> None:
        self.file, self.line, self.row = file, line, row

    def fail(self, column: str, msg: str) -> FrugalError:
        return FrugalError(f"{self.file}:{self.line}: column {column!r}: {msg}")

    def text(self, column: str, required: bool = True) -> str:
        value = (self.row.get(column) or "").strip()
        if required and not value:
            raise self.fail(column, "missing: every row needs it")
        return value

    def number(
        self, column: str, hi: float = math.inf, required: bool = True, unit: str = ""
    ) -> float | None:
        """A number from 0 to `hi` (a leading $ allowed), None where empty and not
        `required`; `unit` says what the number counts, in the messages."""
        raw = (self.row.get(column) or "").strip()
        if not raw:
            if required:
                raise self.fail(
                    column, f"missing: every row needs it{f' ({unit})' if unit else ''}"
                )
            return None
        try:
            value = float(raw.lstrip("$"))
        except ValueError:
            raise self.fail(
                column, f"{raw!r} is not a number{f' of {unit}' if unit else ''}"
            ) from None
        if not math.isfinite(value) or not 0 <= value <= hi:
            span = f"from 0 to {hi:g}" if math.isfinite(hi) else ">= 0"
            raise self.fail(column, f"{raw!r}: give a number {span}")
        return value

    def whole(self, column: str) -> int:
        raw = self.text(column)
        if not raw.isdigit() or int(raw) < 1:
            raise self.fail(column, f"{raw!r}: give a whole number >= 1")
        return int(raw)
