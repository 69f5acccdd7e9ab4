"""The books, whole: a lossless export of every record (`frugal costs export --format
jsonl`) and its import into any ledger.

One JSON object a line: a header (`{"format": "frugal-ledger", "version": 1, "schema":
...}`), then every table's rows, parents before children (`{"table": ..., "row": {...}}`).
An export imports into any ledger and exports again byte for byte; records already on the
books (the same run id; a plan, cost, heartbeat, budget, alert or tag with the same
identity) are skipped, and an integer id taken by another record gets a new one (its
references follow). Chargeback files that earlier frugal versions wrote as FOCUS CSV with
an `x_FrugalRecords` column still import: that column held the same records.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy import DateTime, Integer, Table, insert, select, text
from sqlalchemy.orm import Session

from frugal.errors import FrugalError
from frugal.ledger.billing import ImportResult, check_usd, chunks, err, parse_tags
from frugal.ledger.db import HEAD
from frugal.ledger.schema import Base
from frugal.ledger.store import Ledger, aware
from frugal.times import parse_time, utc

FORMAT, FORMAT_VERSION = "frugal-ledger", 1
RECORDS = "x_FrugalRecords"  # earlier versions' FOCUS exports: the records behind each row
# what makes two rows the same record (integer ids differ between ledgers)
IDENTITY = {
    "plans": ("created_at", "model", "provider", "instance", "gpu", "gpus", "est_cost_usd"),
    "runs": ("id",),
    "heartbeats": ("run_id", "at"),
    "costs": ("at", "kind", "amount_usd", "description", "resource_id", "source"),
    "tags": ("kind", "ref", "key"),
    "budgets": ("name",),
    "alerts": ("budget_id", "period_start", "threshold"),
}
TAG_TARGETS = {"plan": "plans", "run": "runs", "cost": "costs"}


def _tables() -> list[Table]:
    """Every table, parents before children, tags (which point at several) last."""
    tables = [t for t in Base.metadata.sorted_tables if t.name != "tags"]
    return [*tables, Base.metadata.tables["tags"]]


def _encode(table: Table, row: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for c in table.columns:
        v = row[c.name]
        out[c.name] = aware(v).astimezone(UTC).isoformat() if isinstance(v, datetime) else v
    return {"table": table.name, "row": out}


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _pk(table: Table) -> str | None:
    """The primary key column's name, when it is one column."""
    pk = list(table.primary_key.columns)
    return pk[0].name if len(pk) == 1 else None


def _int_pk(table: Table) -> bool:
    pk = _pk(table)
    return pk is not None and isinstance(table.c[pk].type, Integer)


def _decode(table: Table, row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise FrugalError(f"{where}: a {table.name} row is not a JSON object: export it again")
    unknown = sorted(set(row) - set(table.columns.keys()))
    if unknown:
        raise FrugalError(
            f"{where}: {table.name} has no column {unknown[0]} in this frugal "
            f"(schema {HEAD}): upgrade frugal, or export with this one"
        )
    out = {}
    for c in table.columns:
        if c.name not in row:
            if c.nullable or c.server_default is not None or (c.primary_key and _int_pk(table)):
                continue
            raise FrugalError(f"{where}: a {table.name} row lacks {c.name}: export it again")
        v = row[c.name]
        if v is not None and isinstance(c.type, DateTime):
            try:
                v = parse_time(str(v))
            except ValueError as e:
                raise FrugalError(f"{where}: {table.name}.{c.name} {e}: export it again") from None
        out[c.name] = v
    return out


Record = tuple[str, str, Any]  # where (file and line), table, row


def jsonl_records(p: Path, content: str) -> list[Record]:
    records: list[Record] = []
    for n, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise err(p, n, "not a JSON object: give a file `frugal costs export` wrote") from None
        if n == 1 and isinstance(obj, dict) and "format" in obj:
            if obj.get("format") != FORMAT or obj.get("version", 0) > FORMAT_VERSION:
                raise err(
                    p,
                    n,
                    f"not a {FORMAT} v{FORMAT_VERSION} export: export it again "
                    "with this frugal, or upgrade frugal",
                )
            continue
        if not isinstance(obj, dict) or "table" not in obj or "row" not in obj:
            raise err(
                p,
                n,
                'expected {"table": ..., "row": {...}}: give a file `frugal costs '
                "export --format jsonl` wrote",
            )
        records.append((f"{p} line {n}", str(obj["table"]), obj["row"]))
    return records


def legacy_records(p: Path, rows: list[tuple[int, dict[str, str]]]) -> list[Record]:
    records: list[Record] = []
    for line, row in rows:
        check_usd(row, p, line)
        where = f"{p} line {line}"
        try:
            recs = json.loads(row.get(RECORDS) or "[]")
        except json.JSONDecodeError:
            recs = None
        if not isinstance(recs, list):
            raise err(p, line, f"{RECORDS} is not a JSON list: export the ledger again")
        for rec in recs:
            if not isinstance(rec, dict) or "table" not in rec or "row" not in rec:
                raise err(
                    p,
                    line,
                    f"{RECORDS} holds a record without table and row: export the ledger again",
                )
            records.append((where, str(rec["table"]), rec["row"]))
        kind, ref = row.get("x_FrugalKind", ""), row.get("x_FrugalId", "")
        tags = parse_tags(row.get("Tags", ""), p, line)
        records += [
            (where, "tags", {"kind": kind, "ref": ref, "key": k, "value": v})
            for k, v in sorted(tags.items())
        ]
    return records


def restore(led: Ledger, records: list[Record], fmt: str, name: str) -> ImportResult:
    """Put exported records on the books: those already there are skipped, and integer ids
    taken by other records are renumbered, with the references to them."""
    tables = {t.name: t for t in _tables()}
    by_table: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for where, name_, row in records:
        if name_ not in tables:
            raise FrugalError(
                f"{where}: no table {name_!r} in this frugal (schema {HEAD}): "
                "upgrade frugal, or export with this version"
            )
        by_table[name_].append((where, row))
    result = ImportResult(name, fmt, rows=len(records))
    maps: dict[str, dict[Any, Any]] = {}  # table -> old id -> id on the books
    known: dict[str, set[Any]] = {}  # table -> ids on the books (now)
    with led.exclusive() as s:  # twice at once: the second sees the first's records
        for table in tables.values():
            rows = [_decode(table, row, where) for where, row in by_table.get(table.name, [])]
            added, skipped = _restore_table(s, table, rows, maps, known)
            if added or skipped:
                result.added[table.name], result.skipped[table.name] = added, skipped
        if s.get_bind().dialect.name == "postgresql":  # explicit ids leave sequences behind
            for table in tables.values():
                if _int_pk(table):
                    pk = _pk(table)
                    s.execute(
                        text(
                            f"SELECT setval(pg_get_serial_sequence('{table.name}', '{pk}'), "
                            f"(SELECT COALESCE(MAX({pk}), 0) + 1 FROM {table.name}), false)"
                        )
                    )
    return result


def _ids(s: Session, table: Table, known: dict[str, set[Any]]) -> set[Any]:
    """The primary keys on the books of a table with a one-column key (and those added)."""
    if table.name not in known:
        pk = _pk(table)
        known[table.name] = set(s.scalars(select(table.c[pk]))) if pk else set()
    return known[table.name]


def _restore_table(
    s: Session,
    table: Table,
    rows: list[dict[str, Any]],
    maps: dict[str, dict[Any, Any]],
    known: dict[str, set[Any]],
) -> tuple[int, int]:
    """Insert the `rows` of `table` not on the books yet; (added, skipped)."""
    if not rows:
        return 0, 0
    kept = [row for row in rows if _relink(s, table, row, maps, known)]
    ident_cols = IDENTITY.get(table.name) or tuple(c.name for c in table.primary_key.columns)
    have = _identities(s, table, ident_cols, kept)
    pk, int_pk = _pk(table), _int_pk(table)
    ids = _ids(s, table, known)
    next_id = max((i for i in ids if isinstance(i, int)), default=0) + 1
    renumbered = maps.setdefault(table.name, {})
    new = []
    for row in kept:
        ident = tuple(row.get(c) for c in ident_cols)
        if ident in have:
            if int_pk and pk is not None:
                renumbered[row.get(pk)] = have[ident]
            continue
        if pk is not None and int_pk:
            old = row.get(pk)
            if old is None or old in ids:
                while next_id in ids:
                    next_id += 1
                row[pk] = next_id
            renumbered[old] = row[pk]
        if pk is not None:
            ids.add(row[pk])
        have[ident] = row.get(pk) if pk is not None else None
        new.append(row)
    if new:
        s.execute(insert(table), new)
    return len(new), len(rows) - len(new)


def _relink(
    s: Session,
    table: Table,
    row: dict[str, Any],
    maps: dict[str, dict[Any, Any]],
    known: dict[str, set[Any]],
) -> bool:
    """Point the row's references at the records' ids on the books; False when a record it
    needs is neither there nor in the file (a nullable reference is cleared instead)."""
    for c in table.columns:
        for fk in c.foreign_keys:
            target, v = fk.column.table, row.get(c.name)
            if v is None:
                continue
            v = maps.get(target.name, {}).get(v, v)
            if v not in _ids(s, target, known):
                if not c.nullable:
                    return False
                v = None
            row[c.name] = v
    if table.name != "tags":
        return True
    owner = Base.metadata.tables.get(TAG_TARGETS.get(row["kind"], ""))
    if owner is None:
        return False
    ref: Any = str(row["ref"])
    if _int_pk(owner):
        if not ref.isdigit():
            return False
        ref = maps.get(owner.name, {}).get(int(ref), int(ref))
    row["ref"] = str(ref)
    return ref in _ids(s, owner, known)


def _identities(
    s: Session, table: Table, cols: tuple[str, ...], rows: list[dict[str, Any]]
) -> dict[tuple[Any, ...], Any]:
    """Identity -> primary key of the rows on the books that `rows` could be (heartbeats:
    of their runs only)."""
    pk = _pk(table)
    q = select(*(table.c[c] for c in cols), *([table.c[pk]] if pk else []))
    batches: Iterable[Any] = [q]
    if table.name == "heartbeats":
        runs = {r["run_id"] for r in rows}
        batches = [q.where(table.c.run_id.in_(ids)) for ids in chunks(runs)]
    out = {}
    n = len(cols)
    for batch in batches:
        for row in s.execute(batch):
            ident = tuple(utc(v) if isinstance(v, datetime) else v for v in row[:n])
            out[ident] = row[n] if pk else None
    return out


def table_rows(s: Session, table: Table, *order: Any) -> Iterable[Any]:
    for row in s.execute(select(table).order_by(*(order or table.primary_key.columns))):
        yield row._mapping


def write_jsonl(led: Ledger, out: TextIO) -> int:
    out.write(_dumps({"format": FORMAT, "version": FORMAT_VERSION, "schema": HEAD}) + "\n")
    n = 0
    with led.session() as s:
        for table in _tables():
            for row in table_rows(s, table):
                out.write(_dumps(_encode(table, row)) + "\n")
                n += 1
    return n
