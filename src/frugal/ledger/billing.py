"""A provider's billing export on the books: each row of a FOCUS CSV becomes a cost entry,
matched to the run it paid for.

Column IDs and their meaning are FOCUS's (the FinOps Open Cost and Usage Specification,
https://focus.finops.org; the columns read here are the same from 1.0 to 1.2):
`BilledCost`, `EffectiveCost`, `BillingCurrency`, `ChargePeriodStart` (inclusive),
`ChargePeriodEnd` (exclusive), `ProviderName`, `ResourceId`, `ServiceName`,
`ServiceCategory`, `ChargeDescription`, `ConsumedQuantity`, `ConsumedUnit`, `Tags` (a JSON
object).

Each row becomes a cost entry: its `BilledCost` (the invoiced amount; `EffectiveCost` when
there is no BilledCost column) at its `ChargePeriodStart`, until `ChargePeriodEnd`, with its
provider, resource, description (`ChargeDescription`, else `ServiceName`), kind
(`ServiceCategory` in lower case, else `ChargeCategory`), tags, and `source` the file's
name. GPU-hours come from `ConsumedQuantity` when `ConsumedUnit` counts hours: `GPU-Hours`
as they are; `Hours`, `Instance-Hours`, `Node-Hours`, `VM-Hours` times the GPUs of the run
the row is matched to (one when none); other units (`GB-Hours`, `Core-Hours`) none. Every
row must be in USD (`BillingCurrency`); one that is not fails the whole file, naming its
line.

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
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from frugal.csvrows import CsvError, Rows
from frugal.errors import FrugalError
from frugal.ledger.schema import CostEntry, RunRecord, Tag
from frugal.ledger.store import Ledger, aware
from frugal.times import parse_time, utc

CURRENCY = "USD"
RUN_ID_TAG = "frugal_run_id"
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


# -- reading a CSV's cells, each error naming the file and line -------------------------------


def read_csv(p: Path, content: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """The header and rows of a billing CSV (frugal.csvrows: strict), names and cells
    stripped of surrounding spaces; one line naming the file and line where it is not CSV."""
    try:
        reader = Rows(content.splitlines(keepends=True))
        rows = [(n, {k.strip(): v.strip() for k, v in row.items()}) for n, row in reader]
    except CsvError as e:
        raise FrugalError(f"{p} line {e.line}: not CSV ({e.why}): export it again") from None
    return [h.strip() for h in reader.header], rows


def err(p: Path | str, line: int, what: str) -> FrugalError:
    return FrugalError(f"{p} line {line}: {what}")


def _time(value: str, p: Path, line: int, column: str) -> datetime:
    try:
        return parse_time(value)
    except ValueError as e:
        raise err(p, line, f"{column} {e}") from None


def _number(value: str, p: Path, line: int, column: str) -> float:
    try:
        v = float(value)
    except ValueError:
        v = math.nan
    if not math.isfinite(v):
        raise err(p, line, f"{column} {value!r} is not a number: write a decimal such as 12.34")
    return v


def check_usd(row: Mapping[str, str], p: Path, line: int) -> None:
    currency = row.get("BillingCurrency", "")
    if currency.upper() != CURRENCY:
        raise err(
            p,
            line,
            f"BillingCurrency is {currency or 'empty'}, and the books are in USD: "
            "export the bill in USD, or convert its costs, and import it again",
        )


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
        return (
            self.at,
            self.end,
            self.amount_usd,
            self.description,
            self.resource_id,
            self.provider,
            self.kind,
        )


def _parse_charge(row: Mapping[str, str], cost_column: str, p: Path, line: int) -> _Charge:
    check_usd(row, p, line)
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
        line=line,
        at=at,
        end=end,
        amount_usd=amount,
        kind=kind.lower()[:50],
        description=(row.get("ChargeDescription") or row.get("ServiceName") or "")[:500],
        resource_id=row.get("ResourceId", "")[:300],
        provider=(row.get("ProviderName") or row.get("ServiceProviderName") or "")[:50],
        hours=hours,
        per_gpu=per_gpu,
        tags=parse_tags(row.get("Tags", ""), p, line),
    )


def parse_tags(value: str, p: Path, line: int) -> dict[str, str]:
    if not value:
        return {}
    try:
        obj = json.loads(value)
    except json.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        raise err(p, line, 'Tags is not a JSON object: write {"team": "nlp"} (quoted in CSV)')
    out = {}
    for k, v in obj.items():
        if v is None or len(str(k)) > 100:
            continue
        out[str(k)] = (json.dumps(v) if isinstance(v, bool) else str(v))[:300]
    return out


def import_billing(
    led: Ledger, p: Path, header: list[str], rows: list[tuple[int, dict[str, str]]]
) -> ImportResult:
    """Add a provider's FOCUS rows as cost entries, matched to runs (module docstring)."""
    cost_column = next((c for c in ("BilledCost", "EffectiveCost") if c in header), None)
    for need in ("ChargePeriodStart", "BillingCurrency", cost_column):
        if need is None or need not in header:
            raise err(
                p,
                1,
                f"no {need or 'BilledCost'} column: export the bill as FOCUS 1.0 or "
                "later (BilledCost, BillingCurrency, ChargePeriodStart, ...)",
            )
    assert cost_column is not None
    charges = [_parse_charge(row, cost_column, p, line) for line, row in rows]
    result = ImportResult(p.name, "billing", rows=len(charges))
    with led.exclusive() as s:  # twice at once: the second sees the first's rows
        new = _not_imported(s, p.name, charges)
        result.skipped["costs"] = len(charges) - len(new)
        gpus, runs_usd = _match(s, new, result)
        entries = [
            CostEntry(
                at=ch.at,
                kind=ch.kind,
                amount_usd=ch.amount_usd,
                description=ch.description,
                resource_id=ch.resource_id,
                source=p.name,
                run_id=ch.run_id,
                provider=ch.provider,
                period_end=ch.end,
                gpu_hours=ch.hours * (1 if ch.per_gpu else gpus.get(ch.run_id or "", 1)),
            )
            for ch in new
        ]
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


def _not_imported(s: Any, source: str, charges: list[_Charge]) -> list[_Charge]:
    """The charges not on the books yet from the file `source` (each as many times as the
    file holds it, less the times an earlier import of it added it)."""
    have = Counter(
        (
            utc(c.at),
            c.period_end and utc(c.period_end),
            c.amount_usd,
            c.description,
            c.resource_id,
            c.provider,
            c.kind,
        )
        for c in s.scalars(select(CostEntry).where(CostEntry.source == source))
    )
    new = []
    for ch in charges:
        if have[ch.identity()] > 0:
            have[ch.identity()] -= 1
        else:
            new.append(ch)
    return new


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
    q = select(
        RunRecord.id,
        RunRecord.started_at,
        RunRecord.ended_at,
        RunRecord.heartbeat_at,
        RunRecord.gpus,
        RunRecord.cost_usd,
        RunRecord.resource_id,
    ).where(*where)
    return [
        _Span(rid, aware(a).astimezone(UTC), aware(b or hb).astimezone(UTC), g, usd, res)
        for rid, a, b, hb, g, usd, res in s.execute(q)
    ]


def chunks(values: Iterable[Any]) -> Iterable[list[Any]]:
    items = sorted(set(values))
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def _match(
    s: Session, charges: list[_Charge], result: ImportResult
) -> tuple[dict[str, int], float]:
    """Set each charge's run (module docstring); the matched runs' GPUs and their dollars."""
    named = {ch.tags[RUN_ID_TAG] for ch in charges if ch.tags.get(RUN_ID_TAG)}
    by_id = {sp.id: sp for ids in chunks(named) for sp in _spans(s, RunRecord.id.in_(ids))}
    by_resource: dict[str, list[_Span]] = defaultdict(list)
    for ids in chunks(ch.resource_id for ch in charges if ch.resource_id):
        for sp in _spans(s, RunRecord.resource_id.in_(ids)):
            by_resource[sp.resource_id].append(sp)
    tagged: list[_Span] = []
    rest = [ch for ch in charges if ch.tags and ch.tags.get(RUN_ID_TAG) not in by_id]
    if rest:
        lo = min(ch.at for ch in rest)
        hi = max(ch.end or ch.at for ch in rest)
        tagged = _spans(
            s,
            RunRecord.started_at <= hi,
            or_(RunRecord.ended_at >= lo, RunRecord.ended_at.is_(None)),
        )
        found = {sp.id: sp for sp in tagged}
        for ids in chunks(found):
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


def _match_one(
    ch: _Charge, by_id: dict[str, _Span], same_resource: list[_Span], tagged: list[_Span]
) -> tuple[str, _Span | None]:
    named = by_id.get(ch.tags.get(RUN_ID_TAG, ""))
    if named is not None:
        return "run_id_tag", named
    best = max(
        ((ov, sp.id, sp) for sp in same_resource if (ov := sp.overlap_s(ch)) is not None),
        default=None,
    )
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
