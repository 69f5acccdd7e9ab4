"""Billing data in and out of the books: FOCUS imports, chargeback exports, and the ledger's
lossless export and import.

Column IDs and their meaning are those of FOCUS 1.1 (the FinOps Open Cost and Usage
Specification, https://focus.finops.org, ratified November 2024; the columns read here
are 1.0's too): `BilledCost`, `EffectiveCost`, `BillingCurrency`, `ChargePeriodStart`
(inclusive), `ChargePeriodEnd` (exclusive), `ProviderName`, `ResourceId`, `ServiceName`,
`ServiceCategory`, `ChargeDescription`, `ConsumedQuantity`, `ConsumedUnit`, `Tags` (a JSON
object), and custom columns prefixed `x_`, after the FOCUS ones, as the spec asks.

**Importing a provider's export** (`import_file`): each row becomes a cost entry: its
`BilledCost` (the invoiced amount; `EffectiveCost` when there is no BilledCost column) at
its `ChargePeriodStart`, until `ChargePeriodEnd`, with its provider, resource, description
(`ChargeDescription`, else `ServiceName`), kind (`ServiceCategory` in lower case, else
`ChargeCategory`), tags, and `source` the file's name. GPU-hours come from
`ConsumedQuantity` when `ConsumedUnit` counts hours: `GPU-Hours` as they are; `Hours`,
`Instance-Hours`, `Node-Hours`, `VM-Hours` times the GPUs of the run the row is matched to
(one when none); other units (`GB-Hours`, `Core-Hours`) none. Every row must be in USD
(`BillingCurrency`); one that is not fails the whole file, naming its line.

A row is **matched to a run**, the first rule that finds one:
  1. its `Tags` hold `frugal_run_id` naming a run on the books;
  2. its `ResourceId` is a run's `resource_id` (what `frugal train` records: the machine)
     and the charge period overlaps the run (start to end, or last heartbeat): of several,
     the one it overlaps longest;
A matched cost is the run's own compute, in its dollars already: reports and budgets do
not add it again (the import says what was billed against what the runs metered). A row
that only *overlaps* runs whose tags agree with every tag it shares with them (at least
one) is counted as attributed by tags (the run sharing the most; a tie, none), and stays a
cost of its own: a bucket or a volume tagged like a run is not in the run's dollars.
Overlapping means sharing more than an instant.

**Importing twice** adds nothing: a row whose (start, end, amount, description, resource,
provider, kind) is already on the books from the same file name is skipped; a file that
grew adds only its new rows (identical rows are counted, not collapsed).

**Exports** (`write_export`):
- `focus`: the chargeback, one FOCUS row per run and per cost entry (`ChargeCategory`
  Usage, the run's GPU-hours as `ConsumedQuantity` in `GPU-Hours`, its tags in `Tags`; a
  cost matched to a run bills 0 there, its amount named in the description, so that the
  costs add up to the reports' spend),
  then `x_` columns for people (model, GPU, outcome, tokens, estimate) and
  `x_FrugalRecords`, the rows behind it (a run's plan with the plan's tags, the run, its
  heartbeats; a cost), which is what importing the file restores. Budgets, alerts and
  plans that never ran are not spend: they are in `jsonl` only.
- `jsonl`: every table, one row a line (`{"table": ..., "row": {...}}`) after a header line.
Both import into any ledger and export again byte for byte; records already on the books
(the same run id; a plan, cost, heartbeat, budget, alert or tag with the same identity) are
skipped, and an integer id taken by another record gets a new one (its references follow).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy import DateTime, Integer, Table, insert, or_, select, text
from sqlalchemy.orm import Session

from frugal.errors import FrugalError
from frugal.ledger.budgets import period_end, period_start
from frugal.ledger.db import HEAD
from frugal.ledger.schema import Base, CostEntry, RunRecord, Tag
from frugal.ledger.store import Ledger, aware
from frugal.times import parse_time

FOCUS_VERSION = "1.1"
CURRENCY = "USD"
RUN_ID_TAG = "frugal_run_id"
RECORDS = "x_FrugalRecords"
FORMAT, FORMAT_VERSION = "frugal-ledger", 1
FORMATS = ("jsonl", "focus")
SERVICE_CATEGORIES = (
    "AI and Machine Learning", "Analytics", "Business Applications", "Compute", "Databases",
    "Developer Tools", "Multicloud", "Identity", "Integration", "Internet of Things",
    "Management and Governance", "Media", "Migration", "Mobile", "Networking", "Security",
    "Storage", "Web", "Other",
)  # fmt: skip
FOCUS_COLUMNS = (
    "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency",
    "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory", "ChargeClass",
    "ChargeDescription", "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart",
    "ConsumedQuantity", "ConsumedUnit", "ContractedCost", "EffectiveCost", "InvoiceIssuerName",
    "ListCost", "PricingQuantity", "PricingUnit", "ProviderName", "PublisherName", "RegionId",
    "ResourceId", "ResourceType", "ServiceCategory", "ServiceName", "Tags",
)  # fmt: skip
X_COLUMNS = (
    "x_FrugalKind", "x_FrugalId", "x_RunId", "x_Outcome", "x_Model", "x_Method", "x_Gpu",
    "x_GpuCount", "x_Spot", "x_DryRun", "x_PricePerHourUsd", "x_Tokens", "x_EstimatedCostUsd",
    RECORDS,
)  # fmt: skip
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
GPU_HOUR_UNITS = {"gpu", "gpus", "accelerator", "accelerators"}  # already per GPU
INSTANCE_HOUR_UNITS = {"", "instance", "instances", "node", "nodes", "vm", "vms", "machine"}
_HOURS = re.compile(r"^(?:([a-z]+)-)?(?:hours?|hrs?)$")
_CHUNK = 500  # values per IN (...) list


@dataclass
class ImportResult:
    file: str
    format: str  # billing (a provider's FOCUS export), focus or jsonl (frugal's own)
    rows: int = 0
    added: dict[str, int] = field(default_factory=dict)  # table -> rows added
    skipped: dict[str, int] = field(default_factory=dict)  # table -> rows already there
    matched: dict[str, int] = field(default_factory=dict)  # rule -> billing rows matched
    unmatched: int = 0
    added_usd: float = 0.0  # billing: the dollars of the rows added
    matched_billed_usd: float = 0.0  # billing: rows matched to runs, as billed ...
    matched_runs_usd: float = 0.0  # ... and those runs' metered dollars

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "format": self.format,
            "rows": self.rows,
            "added": self.added,
            "skipped": self.skipped,
            "matched": self.matched,
            "unmatched": self.unmatched,
            "added_usd": round(self.added_usd, 4),
            "matched_billed_usd": round(self.matched_billed_usd, 4),
            "matched_runs_usd": round(self.matched_runs_usd, 4),
        }


# -- reading files ---------------------------------------------------------------------------


def import_file(led: Ledger, path: str | Path) -> ImportResult:
    """Import a provider's FOCUS CSV, or a `frugal costs export` file (FOCUS or JSON lines)."""
    p = Path(path)
    try:
        content = p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise FrugalError(
            f"{p}: no such file: give a FOCUS CSV export or a frugal export"
        ) from None
    except UnicodeDecodeError:
        raise FrugalError(f"{p}: not UTF-8 text: export the bill again as UTF-8 CSV") from None
    except OSError as e:
        raise FrugalError(f"{p}: cannot read it ({e.strerror}): check the path") from None
    if not content.strip():
        raise FrugalError(f"{p}: the file is empty: export the bill again")
    if content.lstrip().startswith("{"):
        return restore(led, _jsonl_records(p, content), "jsonl", p.name)
    header, rows = _read_csv(p, content)
    if RECORDS in header:
        return restore(led, _focus_records(p, rows), "focus", p.name)
    return import_billing(led, p, header, rows)


def _read_csv(p: Path, content: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    csv.field_size_limit(2**31 - 1)  # a run's records (heartbeats) make one long cell
    reader = csv.DictReader(io.StringIO(content, newline=""))
    try:
        header = [h.strip() for h in reader.fieldnames or []]
        reader.fieldnames = header
        rows = []
        for row in reader:
            if None in row:
                raise FrugalError(f"{p} line {reader.line_num}: more cells than the header has "
                                  "columns: quote cells that hold commas")  # fmt: skip
            rows.append((reader.line_num, {k: (v or "").strip() for k, v in row.items()}))
    except csv.Error as e:
        raise FrugalError(f"{p} line {reader.line_num}: not CSV ({e}): export it again") from None
    return header, rows


def _err(p: Path | str, line: int, what: str) -> FrugalError:
    return FrugalError(f"{p} line {line}: {what}")


def _time(value: str, p: Path, line: int, column: str) -> datetime:
    try:
        return parse_time(value)
    except ValueError as e:
        raise _err(p, line, f"{column} {e}") from None


def _number(value: str, p: Path, line: int, column: str) -> float:
    try:
        v = float(value)
    except ValueError:
        v = math.nan
    if not math.isfinite(v):
        raise _err(p, line, f"{column} {value!r} is not a number: write a decimal such as 12.34")
    return v


def _check_usd(row: Mapping[str, str], p: Path, line: int) -> None:
    currency = row.get("BillingCurrency", "")
    if currency.upper() != CURRENCY:
        raise _err(
            p, line, f"BillingCurrency is {currency or 'empty'}, and the books are in USD: "
            "export the bill in USD, or convert its costs, and import it again"
        )  # fmt: skip


# -- a provider's billing export -------------------------------------------------------------


@dataclass
class _Charge:
    line: int
    at: datetime
    end: datetime | None
    amount_usd: float
    kind: str
    description: str
    resource_id: str
    provider: str
    hours: float  # ConsumedQuantity in hours ...
    per_gpu: bool  # ... of one GPU (else of a machine: x its GPUs)
    tags: dict[str, str]
    run_id: str | None = None

    def identity(self) -> tuple[Any, ...]:
        return (self.at, self.end, self.amount_usd, self.description, self.resource_id,
                self.provider, self.kind)  # fmt: skip


def _parse_charge(row: Mapping[str, str], cost_column: str, p: Path, line: int) -> _Charge:
    _check_usd(row, p, line)
    amount = _number(row.get(cost_column, ""), p, line, cost_column)
    start = row.get("ChargePeriodStart", "")
    at = _time(start, p, line, "ChargePeriodStart")
    end_text = row.get("ChargePeriodEnd", "")
    end = _time(end_text, p, line, "ChargePeriodEnd") if end_text else None
    hours, per_gpu = 0.0, False
    m = _HOURS.match(row.get("ConsumedUnit", "").strip().lower())
    quantity = row.get("ConsumedQuantity", "")
    if m and quantity and (m[1] or "") in GPU_HOUR_UNITS | INSTANCE_HOUR_UNITS:
        hours = _number(quantity, p, line, "ConsumedQuantity")
        per_gpu = (m[1] or "") in GPU_HOUR_UNITS
    kind = row.get("ServiceCategory") or row.get("ChargeCategory") or "cloud"
    return _Charge(
        line=line, at=at, end=end, amount_usd=amount, kind=kind.lower()[:50],
        description=(row.get("ChargeDescription") or row.get("ServiceName") or "")[:500],
        resource_id=row.get("ResourceId", "")[:300],
        provider=(row.get("ProviderName") or row.get("ServiceProviderName") or "")[:50],
        hours=hours, per_gpu=per_gpu, tags=_parse_tags(row.get("Tags", ""), p, line),
    )  # fmt: skip


def _parse_tags(value: str, p: Path, line: int) -> dict[str, str]:
    if not value:
        return {}
    try:
        obj = json.loads(value)
    except json.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        raise _err(p, line, 'Tags is not a JSON object: write {"team": "nlp"} (quoted in CSV)')
    out = {}
    for k, v in obj.items():
        if v is None or len(str(k)) > 100:
            continue
        out[str(k)] = (json.dumps(v) if isinstance(v, bool) else str(v))[:300]
    return out


def import_billing(led: Ledger, p: Path, header: list[str],
                   rows: list[tuple[int, dict[str, str]]]) -> ImportResult:  # fmt: skip
    """Add a provider's FOCUS rows as cost entries, matched to runs (module docstring)."""
    cost_column = next((c for c in ("BilledCost", "EffectiveCost") if c in header), None)
    for need in ("ChargePeriodStart", "BillingCurrency", cost_column):
        if need is None or need not in header:
            raise _err(p, 1, f"no {need or 'BilledCost'} column: export the bill as FOCUS 1.0 or "
                       "later (BilledCost, BillingCurrency, ChargePeriodStart, ...)")  # fmt: skip
    assert cost_column is not None
    charges = [_parse_charge(row, cost_column, p, line) for line, row in rows]
    result = ImportResult(p.name, "billing", rows=len(charges))
    with led.session() as s:
        have = Counter(
            (aware(c.at).astimezone(UTC), _utc(c.period_end), c.amount_usd, c.description,
             c.resource_id, c.provider, c.kind)
            for c in s.scalars(select(CostEntry).where(CostEntry.source == p.name))
        )  # fmt: skip
        new = []
        for ch in charges:
            if have[ch.identity()] > 0:
                have[ch.identity()] -= 1
            else:
                new.append(ch)
        result.skipped["costs"] = len(charges) - len(new)
        gpus, runs_usd = _match(s, new, result)
        entries = [
            CostEntry(
                at=ch.at, kind=ch.kind, amount_usd=ch.amount_usd, description=ch.description,
                resource_id=ch.resource_id, source=p.name, run_id=ch.run_id,
                provider=ch.provider, period_end=ch.end,
                gpu_hours=ch.hours * (1 if ch.per_gpu else gpus.get(ch.run_id or "", 1)),
            )
            for ch in new
        ]  # fmt: skip
        s.add_all(entries)
        s.flush()
        s.add_all(
            Tag(kind="cost", ref=str(e.id), key=k, value=v)
            for e, ch in zip(entries, new, strict=True)
            for k, v in ch.tags.items()
        )
    result.added["costs"] = len(new)
    result.added_usd = sum(ch.amount_usd for ch in new)
    result.matched_billed_usd = sum(ch.amount_usd for ch in new if ch.run_id)
    result.matched_runs_usd = runs_usd
    result.unmatched = len(new) - sum(result.matched.values())
    return result


@dataclass
class _Span:
    id: str
    start: datetime
    end: datetime
    gpus: int
    cost_usd: float
    resource_id: str
    tags: dict[str, str] = field(default_factory=dict)

    def overlap_s(self, ch: _Charge) -> float | None:
        """Seconds the run and the charge period share; None when they do not meet."""
        end = ch.end or ch.at
        if self.start >= end or self.end <= ch.at:
            return None
        return (min(self.end, end) - max(self.start, ch.at)).total_seconds()


def _spans(s: Session, *where: Any) -> list[_Span]:
    q = select(RunRecord.id, RunRecord.started_at, RunRecord.ended_at, RunRecord.heartbeat_at,
               RunRecord.gpus, RunRecord.cost_usd, RunRecord.resource_id).where(*where)  # fmt: skip
    return [
        _Span(rid, aware(a).astimezone(UTC), aware(b or hb).astimezone(UTC), g, usd, res)
        for rid, a, b, hb, g, usd, res in s.execute(q)
    ]


def _chunks(values: Iterable[Any]) -> Iterable[list[Any]]:
    items = sorted(set(values))
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def _match(s: Session, charges: list[_Charge],
           result: ImportResult) -> tuple[dict[str, int], float]:  # fmt: skip
    """Set each charge's run (module docstring); the matched runs' GPUs and their dollars."""
    named = {ch.tags[RUN_ID_TAG] for ch in charges if ch.tags.get(RUN_ID_TAG)}
    by_id = {sp.id: sp for ids in _chunks(named) for sp in _spans(s, RunRecord.id.in_(ids))}
    by_resource: dict[str, list[_Span]] = defaultdict(list)
    for ids in _chunks(ch.resource_id for ch in charges if ch.resource_id):
        for sp in _spans(s, RunRecord.resource_id.in_(ids)):
            by_resource[sp.resource_id].append(sp)
    tagged: list[_Span] = []
    rest = [ch for ch in charges if ch.tags and ch.tags.get(RUN_ID_TAG) not in by_id]
    if rest:
        lo = min(ch.at for ch in rest)
        hi = max(ch.end or ch.at for ch in rest)
        tagged = _spans(s, RunRecord.started_at <= hi,
                        or_(RunRecord.ended_at >= lo, RunRecord.ended_at.is_(None)))  # fmt: skip
        found = {sp.id: sp for sp in tagged}
        for ids in _chunks(found):
            for ref, k, v in s.execute(
                select(Tag.ref, Tag.key, Tag.value).where(Tag.kind == "run", Tag.ref.in_(ids))
            ):
                found[ref].tags[k] = v
    matched: dict[str, _Span] = {}
    for ch in charges:
        rule, run = _match_one(ch, by_id, by_resource.get(ch.resource_id, []), tagged)
        if run is not None:
            result.matched[rule] = result.matched.get(rule, 0) + 1
            if rule != "tags":  # the run's own machine: its dollars are the run's
                ch.run_id = run.id
                matched[run.id] = run
    return {r.id: r.gpus for r in matched.values()}, sum(r.cost_usd for r in matched.values())


def _match_one(ch: _Charge, by_id: dict[str, _Span], same_resource: list[_Span],
               tagged: list[_Span]) -> tuple[str, _Span | None]:  # fmt: skip
    named = by_id.get(ch.tags.get(RUN_ID_TAG, ""))
    if named is not None:
        return "run_id_tag", named
    best = max(((ov, sp.id, sp) for sp in same_resource if (ov := sp.overlap_s(ch)) is not None),
               default=None)  # fmt: skip
    if best is not None:
        return "resource_id", best[2]
    scored = []
    for sp in tagged:
        if sp.overlap_s(ch) is None:
            continue
        shared = [k for k in ch.tags if k in sp.tags]
        if shared and all(ch.tags[k] == sp.tags[k] for k in shared):
            scored.append((len(shared), sp))
    scored.sort(key=lambda x: -x[0])
    if scored and (len(scored) == 1 or scored[0][0] > scored[1][0]):
        return "tags", scored[0][1]
    return "", None


# -- frugal's own records: the lossless export and import ------------------------------------


def _tables() -> list[Table]:
    """Every table, parents before children, tags (which point at several) last."""
    tables = [t for t in Base.metadata.sorted_tables if t.name != "tags"]
    return [*tables, Base.metadata.tables["tags"]]


def _utc(t: datetime | None) -> datetime | None:
    return None if t is None else aware(t).astimezone(UTC)


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
        raise FrugalError(f"{where}: {table.name} has no column {unknown[0]} in this frugal "
                          f"(schema {HEAD}): upgrade frugal, or export with this one")  # fmt: skip
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


def _jsonl_records(p: Path, content: str) -> list[Record]:
    records: list[Record] = []
    for n, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise _err(p, n, "not a JSON object: give a file `frugal costs export` wrote") from None
        if n == 1 and isinstance(obj, dict) and "format" in obj:
            if obj.get("format") != FORMAT or obj.get("version", 0) > FORMAT_VERSION:
                raise _err(p, n, f"not a {FORMAT} v{FORMAT_VERSION} export: export it again "
                           "with this frugal, or upgrade frugal")  # fmt: skip
            continue
        if not isinstance(obj, dict) or "table" not in obj or "row" not in obj:
            raise _err(p, n, 'expected {"table": ..., "row": {...}}: give a file `frugal costs '
                       "export --format jsonl` wrote")  # fmt: skip
        records.append((f"{p} line {n}", str(obj["table"]), obj["row"]))
    return records


def _focus_records(p: Path, rows: list[tuple[int, dict[str, str]]]) -> list[Record]:
    records: list[Record] = []
    for line, row in rows:
        _check_usd(row, p, line)
        where = f"{p} line {line}"
        try:
            recs = json.loads(row.get(RECORDS) or "[]")
        except json.JSONDecodeError:
            recs = None
        if not isinstance(recs, list):
            raise _err(p, line, f"{RECORDS} is not a JSON list: export the ledger again")
        for rec in recs:
            if not isinstance(rec, dict) or "table" not in rec or "row" not in rec:
                raise _err(p, line, f"{RECORDS} holds a record without table and row: export "
                           "the ledger again")  # fmt: skip
            records.append((where, str(rec["table"]), rec["row"]))
        kind, ref = row.get("x_FrugalKind", ""), row.get("x_FrugalId", "")
        tags = _parse_tags(row.get("Tags", ""), p, line)
        records += [(where, "tags", {"kind": kind, "ref": ref, "key": k, "value": v})
                    for k, v in sorted(tags.items())]  # fmt: skip
    return records


def restore(led: Ledger, records: list[Record], fmt: str, name: str) -> ImportResult:
    """Put exported records on the books: those already there are skipped, and integer ids
    taken by other records are renumbered, with the references to them."""
    tables = {t.name: t for t in _tables()}
    by_table: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for where, name_, row in records:
        if name_ not in tables:
            raise FrugalError(f"{where}: no table {name_!r} in this frugal (schema {HEAD}): "
                              "upgrade frugal, or export with this version")  # fmt: skip
        by_table[name_].append((where, row))
    result = ImportResult(name, fmt, rows=len(records))
    maps: dict[str, dict[Any, Any]] = {}  # table -> old id -> id on the books
    known: dict[str, set[Any]] = {}  # table -> ids on the books (now)
    with led.session() as s:
        for table in tables.values():
            rows = [_decode(table, row, where) for where, row in by_table.get(table.name, [])]
            added, skipped = _restore_table(s, table, rows, maps, known)
            if added or skipped:
                result.added[table.name], result.skipped[table.name] = added, skipped
        if s.get_bind().dialect.name == "postgresql":  # explicit ids leave sequences behind
            for table in tables.values():
                if _int_pk(table):
                    pk = _pk(table)
                    s.execute(text(
                        f"SELECT setval(pg_get_serial_sequence('{table.name}', '{pk}'), "
                        f"(SELECT COALESCE(MAX({pk}), 0) + 1 FROM {table.name}), false)"
                    ))  # fmt: skip
    return result


def _ids(s: Session, table: Table, known: dict[str, set[Any]]) -> set[Any]:
    """The primary keys on the books of a table with a one-column key (and those added)."""
    if table.name not in known:
        pk = _pk(table)
        known[table.name] = set(s.scalars(select(table.c[pk]))) if pk else set()
    return known[table.name]


def _restore_table(s: Session, table: Table, rows: list[dict[str, Any]],
                   maps: dict[str, dict[Any, Any]],
                   known: dict[str, set[Any]]) -> tuple[int, int]:  # fmt: skip
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


def _relink(s: Session, table: Table, row: dict[str, Any], maps: dict[str, dict[Any, Any]],
            known: dict[str, set[Any]]) -> bool:  # fmt: skip
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


def _identities(s: Session, table: Table, cols: tuple[str, ...],
                rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], Any]:  # fmt: skip
    """Identity -> primary key of the rows on the books that `rows` could be (heartbeats:
    of their runs only)."""
    pk = _pk(table)
    q = select(*(table.c[c] for c in cols), *([table.c[pk]] if pk else []))
    batches: Iterable[Any] = [q]
    if table.name == "heartbeats":
        runs = {r["run_id"] for r in rows}
        batches = [q.where(table.c.run_id.in_(ids)) for ids in _chunks(runs)]
    out = {}
    n = len(cols)
    for batch in batches:
        for row in s.execute(batch):
            ident = tuple(_utc(v) if isinstance(v, datetime) else v for v in row[:n])
            out[ident] = row[n] if pk else None
    return out


# -- exports ---------------------------------------------------------------------------------


def write_export(led: Ledger, fmt: str, out: TextIO) -> int:
    """Write the books to `out` as `fmt` (jsonl or focus); the number of rows written."""
    if fmt == "jsonl":
        return _write_jsonl(led, out)
    if fmt == "focus":
        return _write_focus(led, out)
    raise FrugalError(f"--format {fmt!r}: use jsonl (the whole ledger) or focus (a FOCUS CSV)")


def _rows(s: Session, table: Table, *order: Any) -> Iterable[Any]:
    for row in s.execute(select(table).order_by(*(order or table.primary_key.columns))):
        yield row._mapping


def _write_jsonl(led: Ledger, out: TextIO) -> int:
    out.write(_dumps({"format": FORMAT, "version": FORMAT_VERSION, "schema": HEAD}) + "\n")
    n = 0
    with led.session() as s:
        for table in _tables():
            for row in _rows(s, table):
                out.write(_dumps(_encode(table, row)) + "\n")
                n += 1
    return n


def _focus_time(t: datetime, up: bool = False) -> str:
    t = aware(t).astimezone(UTC)
    if up and t.microsecond:
        t += timedelta(seconds=1)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _num(v: float | int | None) -> str:
    return "" if v is None else repr(float(v)) if isinstance(v, float) else str(v)


def _charge(cost: float, start: datetime, end: datetime, tags: dict[str, str],
            **cols: Any) -> dict[str, Any]:  # fmt: skip
    """The FOCUS columns every row has, in USD, billed as metered (no discounts known)."""
    month = period_start("month", start)
    next_month = period_end("month", month)
    assert next_month is not None
    return {
        "BilledCost": _num(cost), "EffectiveCost": _num(cost), "ListCost": _num(cost),
        "ContractedCost": _num(cost), "BillingCurrency": CURRENCY,
        "BillingAccountId": "frugal", "BillingAccountName": "frugal ledger",
        "BillingPeriodStart": _focus_time(month), "BillingPeriodEnd": _focus_time(next_month),
        "ChargeCategory": "Usage", "ChargeClass": "", "ChargeFrequency": "Usage-Based",
        "ChargePeriodStart": _focus_time(start), "ChargePeriodEnd": _focus_time(end, up=True),
        "Tags": _dumps(tags) if tags else "",
    } | cols  # fmt: skip


def _write_focus(led: Ledger, out: TextIO) -> int:
    w = csv.writer(out, lineterminator="\n")
    w.writerow((*FOCUS_COLUMNS, *X_COLUMNS))
    t = Base.metadata.tables
    n = 0
    with led.session() as s:
        tags: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
        tag_rows: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for row in _rows(s, t["tags"]):
            tags[row["kind"], row["ref"]][row["key"]] = row["value"]
            tag_rows[row["kind"], row["ref"]].append(_encode(t["tags"], row))
        plans = {row["id"]: _encode(t["plans"], row) for row in _rows(s, t["plans"])}
        beats: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in _rows(s, t["heartbeats"]):
            beats[row["run_id"]].append(_encode(t["heartbeats"], row))
        runs = t["runs"]
        for r in _rows(s, runs, runs.c.started_at, runs.c.id):
            plan = r["plan_id"]
            recs = [plans[plan], *tag_rows["plan", str(plan)]] if plan in plans else []
            recs += [_encode(runs, r), *beats[r["id"]]]
            gpu_hours = r["hours"] * r["gpus"]
            cols = _charge(
                r["cost_usd"], r["started_at"], r["ended_at"] or r["heartbeat_at"],
                tags["run", r["id"]],
                ChargeDescription=f"{r['method']} of {r['model']} on {r['gpus']}x "
                f"{r['gpu'] or 'unknown GPU'} ({r['outcome'] or 'running'})",
                ConsumedQuantity=_num(gpu_hours) if gpu_hours else "",
                ConsumedUnit="GPU-Hours" if gpu_hours else "",
                PricingQuantity=_num(r["hours"]), PricingUnit="Hours",
                InvoiceIssuerName=r["provider"], ProviderName=r["provider"],
                PublisherName=r["provider"], RegionId=r["region"], ResourceId=r["resource_id"],
                ResourceType=r["instance"], ServiceCategory="AI and Machine Learning",
                ServiceName="GPU compute", x_FrugalKind="run", x_FrugalId=r["id"],
                x_RunId=r["id"], x_Outcome=r["outcome"] or "", x_Model=r["model"],
                x_Method=r["method"], x_Gpu=r["gpu"], x_GpuCount=str(r["gpus"]),
                x_Spot=json.dumps(r["spot"]), x_DryRun=json.dumps(r["dry_run"]),
                x_PricePerHourUsd=_num(r["price_per_hour_usd"]), x_Tokens=_num(r["tokens"]),
                x_EstimatedCostUsd=_num(r["est_cost_usd"]), **{RECORDS: _dumps(recs)},
            )  # fmt: skip
            w.writerow(cols.get(c, "") for c in (*FOCUS_COLUMNS, *X_COLUMNS))
            n += 1
        categories = {c.lower(): c for c in SERVICE_CATEGORIES}
        costs = t["costs"]
        for c in _rows(s, costs, costs.c.at, costs.c.id):
            what = c["description"] or c["kind"]
            if c["run_id"]:  # the run's row has the dollars: a sum must not count them twice
                what += f" (billed {_num(c['amount_usd'])} USD, in run {c['run_id']})"
            cols = _charge(
                0.0 if c["run_id"] else c["amount_usd"], c["at"], c["period_end"] or c["at"],
                tags["cost", str(c["id"])], ChargeDescription=what,
                ConsumedQuantity=_num(c["gpu_hours"]) if c["gpu_hours"] else "",
                ConsumedUnit="GPU-Hours" if c["gpu_hours"] else "",
                PricingQuantity="1", PricingUnit="Units", InvoiceIssuerName=c["provider"],
                ProviderName=c["provider"], PublisherName=c["provider"],
                ResourceId=c["resource_id"],
                ServiceCategory=categories.get(c["kind"].lower(), "Other"),
                ServiceName=c["kind"], x_FrugalKind="cost", x_FrugalId=str(c["id"]),
                x_RunId=c["run_id"] or "", **{RECORDS: _dumps([_encode(costs, c)])},
            )  # fmt: skip
            w.writerow(cols.get(col, "") for col in (*FOCUS_COLUMNS, *X_COLUMNS))
            n += 1
    return n
