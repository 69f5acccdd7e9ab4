"""Files in and out of the books (`frugal costs import|export`): which kind a file is, and
where it goes.

In: a provider's FOCUS bill (frugal.ledger.billing: cost entries matched to runs), or a
backup of frugal's books (frugal.ledger.backup: the jsonl export, or an earlier frugal's
FOCUS export with its `x_FrugalRecords`). frugal's own chargeback is refused: its runs and
costs are on the books it came from, and importing it as a bill would count them twice.
Out: the backup (`jsonl`), or the chargeback in FOCUS 1.2 (`focus`, frugal.ledger.focus).
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from frugal.errors import FrugalError
from frugal.ledger import backup, focus
from frugal.ledger.billing import ImportResult, import_billing, read_csv
from frugal.ledger.store import Ledger

FORMATS = ("jsonl", "focus")


def import_file(led: Ledger, path: str | Path) -> ImportResult:
    """Import a provider's FOCUS CSV, or a backup of frugal's books."""
    p = Path(path)
    try:
        content = p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise FrugalError(
            f"{p}: no such file: give a FOCUS CSV export or a frugal backup (jsonl)"
        ) from None
    except UnicodeDecodeError:
        raise FrugalError(f"{p}: not UTF-8 text: export the bill again as UTF-8 CSV") from None
    except OSError as e:
        raise FrugalError(f"{p}: cannot read it ({e.strerror}): check the path") from None
    if not content.strip():
        raise FrugalError(f"{p}: the file is empty: export the bill again")
    if content.lstrip().startswith("{"):
        return backup.restore(led, backup.jsonl_records(p, content), "jsonl", p.name)
    header, rows = read_csv(p, content)
    if backup.RECORDS in header:
        return backup.restore(led, backup.legacy_records(p, rows), "focus", p.name)
    if "x_FrugalKind" in header:
        raise FrugalError(
            f"{p} is frugal's own chargeback: its runs and costs are on the books it came "
            "from (as a bill they would count twice); to move the books, import a backup "
            "written by frugal costs export --format jsonl"
        )
    return import_billing(led, p, header, rows)


def write_export(led: Ledger, fmt: str, out: TextIO) -> int:
    """Write the books to `out` as `fmt` (jsonl or focus); the number of rows written."""
    if fmt == "jsonl":
        return backup.write_jsonl(led, out)
    if fmt == "focus":
        return focus.write_focus(led, out)
    raise FrugalError(f"--format {fmt!r}: use jsonl (the whole ledger) or focus (a FOCUS CSV)")
