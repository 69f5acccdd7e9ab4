"""The chargeback in FOCUS 1.2 (`frugal costs export --format focus`): one row per run and
per cost entry, in the columns and formats of the FinOps Open Cost and Usage Specification
1.2 (https://focus.finops.org; FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec, tag v1.2), so a
FinOps tool takes it as it takes a cloud provider's bill.

What each row says:
- a **run**: what it cost (BilledCost = EffectiveCost = ListCost = ContractedCost: the
  metered dollars; no discounts are known), the machine's price per hour as ListUnitPrice
  and ContractedUnitPrice, the hours it was billed as PricingQuantity (so price x quantity
  is the cost, as the spec requires), its GPU-hours as ConsumedQuantity in `GPU-Hours`,
  PricingCategory `Dynamic` on spot and `Standard` on demand, the provider, region, machine
  (ResourceId, ResourceType), the instance type as SkuId (the price: SkuPriceId, with its
  region and spot or on-demand; SkuPriceDetails with FOCUS's InstanceType and GpuCount),
  ServiceCategory `AI and Machine Learning` / `Machine Learning`;
- a **cost entry** (`costs add`, a provider's bill): its amount, one unit of it, its kind as
  ServiceName and, where the kind names one, its ServiceCategory (else `Other`). A cost
  matched to a run bills 0 here, its amount named in the description: the run's row holds
  those dollars, so the file adds up to the reports' spend.

Every row is ChargeCategory `Usage`, ChargeFrequency `Usage-Based`, in USD, in the calendar
month of its start (BillingPeriodStart/End); the `project` tag is the sub-account (a GCP
project, an AWS member account: FOCUS's SubAccount), and all tags are in Tags (a JSON
object). Custom columns follow, prefixed `x_`: model, method, GPU, outcome, tokens, the
estimate. Nulls are empty cells; times are `YYYY-MM-DDTHH:mm:ssZ`; decimals carry a point
and no exponent. Columns the books have nothing for (commitment discounts, capacity
reservations, pricing in another currency, invoices, availability zones) are left out
where the spec makes them conditional on the provider supporting them; of those it
recommends, InvoiceId and AvailabilityZone are null (the books hold no invoices, and no
zone is known).
The prices are in the currency they are billed in, so the PricingCurrency columns (which
the spec allows here) repeat BillingCurrency and the prices.

`write_metadata` writes the FOCUS metadata beside the file: FocusVersion 1.2, the schema
(each column and its data type) and the data generator (frugal and its version), which the
spec asks to be retrievable without reading the data. The backup of frugal's own records is
the jsonl export (frugal.ledger.backup), not this file.
"""

from __future__ import annotations

import csv
import json
import uuid
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from frugal.ledger.backup import table_rows
from frugal.ledger.billing import CURRENCY
from frugal.ledger.periods import period_end, period_start
from frugal.ledger.schema import Base
from frugal.ledger.store import Ledger, aware

FOCUS_VERSION = "1.2"
SERVICE_CATEGORIES = (
    "AI and Machine Learning",
    "Analytics",
    "Business Applications",
    "Compute",
    "Databases",
    "Developer Tools",
    "Multicloud",
    "Identity",
    "Integration",
    "Internet of Things",
    "Management and Governance",
    "Media",
    "Migration",
    "Mobile",
    "Networking",
    "Security",
    "Storage",
    "Web",
    "Other",
)
# the FOCUS 1.2 columns written, with their data types (ColumnDefinition's DataType)
COLUMNS: dict[str, str] = {
    "AvailabilityZone": "STRING",
    "BilledCost": "DECIMAL",
    "BillingAccountId": "STRING",
    "BillingAccountName": "STRING",
    "BillingCurrency": "STRING",
    "BillingPeriodEnd": "DATETIME",
    "BillingPeriodStart": "DATETIME",
    "ChargeCategory": "STRING",
    "ChargeClass": "STRING",
    "ChargeDescription": "STRING",
    "ChargeFrequency": "STRING",
    "ChargePeriodEnd": "DATETIME",
    "ChargePeriodStart": "DATETIME",
    "ConsumedQuantity": "DECIMAL",
    "ConsumedUnit": "STRING",
    "ContractedCost": "DECIMAL",
    "ContractedUnitPrice": "DECIMAL",
    "EffectiveCost": "DECIMAL",
    "InvoiceId": "STRING",
    "InvoiceIssuerName": "STRING",
    "ListCost": "DECIMAL",
    "ListUnitPrice": "DECIMAL",
    "PricingCategory": "STRING",
    "PricingCurrency": "STRING",
    "PricingCurrencyContractedUnitPrice": "DECIMAL",
    "PricingCurrencyEffectiveCost": "DECIMAL",
    "PricingCurrencyListUnitPrice": "DECIMAL",
    "PricingQuantity": "DECIMAL",
    "PricingUnit": "STRING",
    "ProviderName": "STRING",
    "PublisherName": "STRING",
    "RegionId": "STRING",
    "RegionName": "STRING",
    "ResourceId": "STRING",
    "ResourceName": "STRING",
    "ResourceType": "STRING",
    "ServiceCategory": "STRING",
    "ServiceName": "STRING",
    "ServiceSubcategory": "STRING",
    "SkuId": "STRING",
    "SkuMeter": "STRING",
    "SkuPriceDetails": "JSON",
    "SkuPriceId": "STRING",
    "SubAccountId": "STRING",
    "SubAccountName": "STRING",
    "Tags": "JSON",
}
X_COLUMNS: dict[str, str] = {
    "x_FrugalKind": "STRING",
    "x_FrugalId": "STRING",
    "x_RunId": "STRING",
    "x_Outcome": "STRING",
    "x_Model": "STRING",
    "x_Method": "STRING",
    "x_Gpu": "STRING",
    "x_GpuCount": "DECIMAL",
    "x_Spot": "STRING",
    "x_DryRun": "STRING",
    "x_PricePerHourUsd": "DECIMAL",
    "x_Tokens": "DECIMAL",
    "x_EstimatedCostUsd": "DECIMAL",
}
ACCOUNT = ("frugal-ledger", "frugal ledger")  # BillingAccountId, BillingAccountName
SUB_ACCOUNT_TAG = "project"
UNKNOWN_PROVIDER = "Other"  # a cost put on the books without one: the column is never null


def _time(t: datetime, up: bool = False) -> str:
    """FOCUS's date/time: UTC, `YYYY-MM-DDTHH:mm:ssZ`; `up` rounds a fraction of a second
    up (an exclusive end bound)."""
    t = aware(t).astimezone(UTC)
    if up and t.microsecond:
        t += timedelta(seconds=1)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def decimal(v: float | int | None) -> str:
    """FOCUS's numeric format, as every tool reads a decimal: a point, no exponent, no
    thousands separator, no plus sign; null (an empty cell) for None."""
    if v is None:
        return ""
    text = f"{float(v):.10f}".rstrip("0")
    text = text + "0" if text.endswith(".") else text
    return "0.0" if text in ("-0.0", "-0.") else text


def _json(obj: dict[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False) if obj else ""


def _row(
    cost: float,
    start: datetime,
    end: datetime,
    tags: dict[str, str],
    provider: str,
    unit_price: float,
    quantity: float,
    **cols: Any,
) -> dict[str, Any]:
    """The columns every row has: USD, billed as metered (no discounts known), price x
    quantity = cost, the calendar month of the start as the billing period."""
    month = period_start("month", start)
    next_month = period_end("month", month)
    assert next_month is not None
    provider = provider or UNKNOWN_PROVIDER
    project = tags.get(SUB_ACCOUNT_TAG)
    return {
        "BilledCost": decimal(cost),
        "EffectiveCost": decimal(cost),
        "ListCost": decimal(cost),
        "ContractedCost": decimal(cost),
        "ListUnitPrice": decimal(unit_price),
        "ContractedUnitPrice": decimal(unit_price),
        "PricingQuantity": decimal(quantity),
        # priced in the currency it is billed in: the pricing-currency columns repeat them
        "PricingCurrency": CURRENCY,
        "PricingCurrencyEffectiveCost": decimal(cost),
        "PricingCurrencyListUnitPrice": decimal(unit_price),
        "PricingCurrencyContractedUnitPrice": decimal(unit_price),
        "BillingCurrency": CURRENCY,
        "BillingAccountId": ACCOUNT[0],
        "BillingAccountName": ACCOUNT[1],
        "BillingPeriodStart": _time(month),
        "BillingPeriodEnd": _time(next_month),
        "ChargeCategory": "Usage",
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodStart": _time(start),
        "ChargePeriodEnd": _time(max(end, start), up=True),
        "InvoiceIssuerName": provider,
        "ProviderName": provider,
        "PublisherName": provider,
        "SubAccountId": f"{SUB_ACCOUNT_TAG}/{project}" if project else "",
        "SubAccountName": project or "",
        "Tags": _json(tags),
    } | cols


def write_focus(led: Ledger, out: TextIO) -> int:
    """The chargeback as FOCUS 1.2 CSV (module docstring); the number of rows."""
    w = csv.writer(out, lineterminator="\n")
    header = (*COLUMNS, *X_COLUMNS)
    w.writerow(header)
    t = Base.metadata.tables
    n = 0
    with led.session() as s:
        tags: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
        for row in table_rows(s, t["tags"]):
            tags[row["kind"], row["ref"]][row["key"]] = row["value"]
        runs, costs = t["runs"], t["costs"]
        for r in table_rows(s, runs, runs.c.started_at, runs.c.id):
            cols = _run_row(r, tags["run", r["id"]])
            w.writerow(cols.get(c, "") for c in header)
            n += 1
        for c in table_rows(s, costs, costs.c.at, costs.c.id):
            cols = _cost_row(c, tags["cost", str(c["id"])])
            w.writerow(cols.get(col, "") for col in header)
            n += 1
    return n


def _run_row(r: Mapping[str, Any], tags: dict[str, str]) -> dict[str, Any]:
    """A run's charge: its GPU machine's hours at its price."""
    cost, price = r["cost_usd"], r["price_per_hour_usd"] or 0.0
    hours = cost / price if price > 0 else (r["hours"] or 1.0)  # billed: price x hours
    unit = price if price > 0 else cost / hours
    sku = f"{r['provider'] or UNKNOWN_PROVIDER}/{r['instance'] or r['gpu'] or 'GPU'}"
    region, resource = r["region"] or "", r["resource_id"] or ""
    return _row(
        cost,
        r["started_at"],
        r["ended_at"] or r["heartbeat_at"] or r["started_at"],
        tags,
        r["provider"],
        unit,
        hours,
        ChargeDescription=f"{r['method']} of {r['model']} on {r['gpus']}x "
        f"{r['gpu'] or 'unknown GPU'} ({r['outcome'] or 'running'})",
        ConsumedQuantity=decimal(r["hours"] * r["gpus"]),
        ConsumedUnit="GPU-Hours",
        PricingUnit="Hours",
        PricingCategory="Dynamic" if r["spot"] else "Standard",
        RegionId=region,
        RegionName=region,
        ResourceId=resource,
        ResourceType=r["instance"]
        if resource and r["instance"]
        else ("GPU machine" if resource else ""),
        ServiceCategory="AI and Machine Learning",
        ServiceSubcategory="Machine Learning",
        ServiceName="GPU compute",
        SkuId=sku,
        SkuPriceId=f"{sku}/{region or 'any region'}/{'spot' if r['spot'] else 'on-demand'}",
        SkuMeter="GPU machine hours",
        SkuPriceDetails=_json(
            {"GpuCount": r["gpus"], "InstanceType": r["instance"]}
            if r["instance"]
            else {"GpuCount": r["gpus"]}
        ),
        x_FrugalKind="run",
        x_FrugalId=r["id"],
        x_RunId=r["id"],
        x_Outcome=r["outcome"] or "",
        x_Model=r["model"],
        x_Method=r["method"],
        x_Gpu=r["gpu"],
        x_GpuCount=decimal(r["gpus"]),
        x_Spot=json.dumps(r["spot"]),
        x_DryRun=json.dumps(r["dry_run"]),
        x_PricePerHourUsd=decimal(r["price_per_hour_usd"]),
        x_Tokens=decimal(r["tokens"]),
        x_EstimatedCostUsd=decimal(r["est_cost_usd"]),
    )


CATEGORIES = {c.lower(): c for c in SERVICE_CATEGORIES}


def _cost_row(c: Mapping[str, Any], tags: dict[str, str]) -> dict[str, Any]:
    """A cost put on the books: its own row, or a line that names the run holding its
    dollars (a sum must not count them twice)."""
    what = c["description"] or c["kind"]
    billed = 0.0 if c["run_id"] else c["amount_usd"]
    if c["run_id"]:  # the run's row has the dollars: a sum must not count them twice
        what += f" (billed {decimal(c['amount_usd'])} USD, in run {c['run_id']})"
    category = CATEGORIES.get(c["kind"].lower(), "Other")
    sku = f"{c['provider'] or UNKNOWN_PROVIDER}/{c['kind']}"
    gpu_hours = c["gpu_hours"] or 0.0
    return _row(
        billed,
        c["at"],
        c["period_end"] or c["at"],
        tags,
        c["provider"],
        billed,
        1.0,
        ChargeDescription=what,
        ConsumedQuantity=decimal(gpu_hours or 1.0),
        ConsumedUnit="GPU-Hours" if gpu_hours else "Units",
        PricingUnit="Units",
        PricingCategory="Standard",
        ResourceId=c["resource_id"] or "",
        ResourceType=c["kind"] if c["resource_id"] else "",
        ServiceCategory=category,
        ServiceSubcategory=f"Other ({category})",
        ServiceName=c["kind"],
        SkuId=sku,
        SkuPriceId=sku,
        SkuMeter=c["kind"],
        x_FrugalKind="cost",
        x_FrugalId=str(c["id"]),
        x_RunId=c["run_id"] or "",
    )


def metadata(created: datetime, version: str) -> dict[str, Any]:
    """FOCUS metadata of the export: the data generator and the schema (its id is the same
    for the same columns, as the spec asks of an unchanged schema)."""
    columns = [
        {
            "ColumnName": name,
            "DataType": kind,
            **({"ProviderTagPrefixes": []} if name == "Tags" else {}),
        }
        for name, kind in (COLUMNS | X_COLUMNS).items()
    ]
    schema_id = uuid.uuid5(uuid.NAMESPACE_URL, json.dumps([FOCUS_VERSION, columns]))
    return {
        "DataGenerator": "frugal",
        "DataGeneratorVersion": version,
        "Schema": {
            "SchemaId": str(schema_id),
            "FocusVersion": FOCUS_VERSION,
            "CreationDate": _time(created),
            "ColumnDefinition": columns,
        },
    }
