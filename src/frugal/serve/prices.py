"""Serving prices as data: hosted APIs for open models, managed platforms, commitment
discounts and the purchase price of GPUs you own.

Four bundled files in serve/data (apis.csv, platforms.csv, commitments.csv, hardware.csv),
each row with its source and the date it was read; `#` lines say where the figures come from
and what they mean. Every bad value names the file, line and column to fix.

- `api_prices(model)`: the APIs that serve an open model, matched by its architecture id
  (case-insensitive, org and -Instruct/-hf/-chat ignored): `meta-llama/Llama-3.1-8B-Instruct`
  finds the Llama-3.1-8B rows.
- `platform_rates(gpu, gpus, ondemand_usd_h, instance)`: SageMaker = the EC2 on-demand price
  of the instance x its family's markup; Hugging Face Endpoints = the listed $/hour of the
  smallest replica with at least `gpus` of that GPU.
- `commitments(provider)` and `conservative_commitment(provider, term_months)`.
- `purchase_price(gpu)`: a sourced price to amortize when the user gives none.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from functools import cache
from importlib import resources

from frugal.csvrows import Cells
from frugal.errors import FrugalError
from frugal.hardware.csvdata import data_rows, header
from frugal.hardware.gpus import lookup_gpu
from frugal.names import norm

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_VARIANT_WORDS = frozenset({"instruct", "hf", "chat", "it", "base"})


class _Row(Cells):
    """A row of the serving reference data: GPUs, yes/no columns, and where each figure
    came from."""

    def price(self, column: str) -> float:
        value = self.number(column)
        assert value is not None
        return value

    def gpu(self, column: str) -> str:
        g = lookup_gpu(self.text(column))
        if g is None:
            raise self.fail(
                column, f"unknown GPU {self.row[column]!r}: use a name from `frugal gpus`"
            )
        return g.name

    def yes_no(self, column: str) -> bool:
        raw = self.text(column).lower()
        if raw not in ("yes", "no"):
            raise self.fail(column, f"{raw!r}: write yes or no")
        return raw == "yes"

    def provenance(self) -> tuple[str, str]:
        """(source, retrieved): every bundled figure says where it came from and when."""
        retrieved = self.text("retrieved")
        if not _DATE.fullmatch(retrieved):
            raise self.fail("retrieved", f"{retrieved!r}: write the date read as YYYY-MM-DD")
        return self.text("source"), retrieved


def _rows(text: str, file: str, record: type) -> list[_Row]:
    """The data rows of a file whose columns are the fields of `record`."""
    columns = [f.name for f in fields(record)]
    missing = [c for c in columns if c not in header(text, file)]
    if missing:
        raise FrugalError(
            f"{file}: missing column(s) {', '.join(missing)}; need {','.join(columns)}"
        )
    return [_Row(file, line, row) for line, row in data_rows(text, file)]


def _bundled(name: str) -> str:
    return (resources.files("frugal.serve") / "data" / name).read_text()


# ---- hosted APIs -------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiPrice:
    provider: str
    model: str  # the Hugging Face id of the open model served
    api_model: str  # the provider's own name for it
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    batch_discount: float | None  # fraction off with the batch API; None = none known
    cached_input_factor: float | None  # cached input price / input price; None = unknown
    retrieved: str
    source: str

    def cost_usd(self, input_mtok: float, output_mtok: float, batch: bool = False) -> float:
        """Dollars for millions of input and output tokens (batch: with the batch discount)."""
        usd = input_mtok * self.input_usd_per_mtok + output_mtok * self.output_usd_per_mtok
        return usd * (1 - (self.batch_discount or 0.0)) if batch else usd

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def parse_api_prices(text: str, file: str) -> tuple[ApiPrice, ...]:
    out = []
    for r in _rows(text, file, ApiPrice):
        source, retrieved = r.provenance()
        out.append(
            ApiPrice(
                provider=r.text("provider").lower(),
                model=r.text("model"),
                api_model=r.text("api_model", required=False),
                input_usd_per_mtok=r.price("input_usd_per_mtok"),
                output_usd_per_mtok=r.price("output_usd_per_mtok"),
                batch_discount=r.number("batch_discount", hi=1.0, required=False),
                cached_input_factor=r.number("cached_input_factor", hi=1.0, required=False),
                retrieved=retrieved,
                source=source,
            )
        )
    return tuple(out)


def model_key(model_id: str) -> str:
    """The architecture id: `meta-llama/Meta-Llama-3.1-8B-Instruct` -> `llama318b`."""
    name = model_id.strip().rstrip("/").split("/")[-1].lower()
    words = [w for w in name.split("-") if w and w not in _VARIANT_WORDS]
    if len(words) > 1 and words[0] == "meta":  # the old `Meta-Llama-3.1-...` spelling
        words = words[1:]
    return norm("-".join(words))


@cache
def _apis() -> tuple[ApiPrice, ...]:
    return parse_api_prices(_bundled("apis.csv"), "apis.csv")


def api_prices(model_id: str) -> list[ApiPrice]:
    """Every bundled API price for the model; [] when no provider serves it."""
    key = model_key(model_id)
    return [a for a in _apis() if key and model_key(a.model) == key]


# ---- managed platforms -------------------------------------------------------------------


@dataclass(frozen=True)
class PlatformRate:
    platform: str  # sagemaker | hf-endpoints
    provider: str  # the cloud underneath
    instance: str
    gpu: str
    gpus: int
    usd_h: float  # $/hour for one replica of `gpus` GPUs
    scales_to_zero: bool
    basis: str  # how usd_h was found
    notes: str
    retrieved: str
    source: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class PlatformRow:
    """One row of platforms.csv (a markup row prices nothing until given an on-demand price)."""

    platform: str
    provider: str
    kind: str  # markup | rate
    instance: str
    gpu: str
    gpus: int
    usd_h: float
    markup: float
    scales_to_zero: bool
    notes: str
    retrieved: str
    source: str


def _platform(r: _Row) -> PlatformRow:
    source, retrieved = r.provenance()
    kind = r.text("kind")
    if kind not in ("markup", "rate"):
        raise r.fail("kind", f"{kind!r}: write markup (x on-demand) or rate ($/hour per replica)")
    markup = kind == "markup"
    return PlatformRow(
        platform=r.text("platform").lower(),
        provider=r.text("provider").lower(),
        kind=kind,
        instance=r.text("instance").lower(),
        gpu=r.gpu("gpu"),
        gpus=0 if markup else r.whole("gpus"),
        usd_h=0.0 if markup else r.price("usd_h"),
        markup=r.price("markup") if markup else 1.0,
        scales_to_zero=r.yes_no("scales_to_zero"),
        notes=r.text("notes", required=False),
        retrieved=retrieved,
        source=source,
    )


def parse_platforms(text: str, file: str) -> tuple[PlatformRow, ...]:
    return tuple(_platform(r) for r in _rows(text, file, PlatformRow))


@cache
def _platforms() -> tuple[PlatformRow, ...]:
    return parse_platforms(_bundled("platforms.csv"), "platforms.csv")


def instance_family(instance: str) -> str:
    """`ml.p5.48xlarge` or `p5.48xlarge` -> `p5`."""
    name = instance.strip().lower().removeprefix("ml.")
    return name.split(".")[0]


def _marked_up(p: PlatformRow, instance: str, gpus: int, ondemand_usd_h: float) -> PlatformRate:
    name = instance.strip().lower()
    return PlatformRate(
        platform=p.platform,
        provider=p.provider,
        instance=name if name.startswith("ml.") else f"ml.{name}",
        gpu=p.gpu,
        gpus=gpus,
        usd_h=round(ondemand_usd_h * p.markup, 6),
        scales_to_zero=p.scales_to_zero,
        basis=f"on-demand ${ondemand_usd_h:g}/h x {p.markup:g} ({p.platform} on {p.instance})",
        notes=p.notes,
        retrieved=p.retrieved,
        source=p.source,
    )


def _listed(p: PlatformRow, gpus: int) -> PlatformRate:
    spare = f"; {p.gpus - gpus} GPU(s) more than asked (the smallest size)" if p.gpus > gpus else ""
    return PlatformRate(
        platform=p.platform,
        provider=p.provider,
        instance=p.instance,
        gpu=p.gpu,
        gpus=p.gpus,
        usd_h=p.usd_h,
        scales_to_zero=p.scales_to_zero,
        basis=f"listed ${p.usd_h:g}/h per replica of {p.gpus}x {p.gpu}{spare}",
        notes=p.notes,
        retrieved=p.retrieved,
        source=p.source,
    )


def platform_rates(
    gpu_name: str, gpus: int, ondemand_usd_h: float | None = None, instance: str | None = None
) -> list[PlatformRate]:
    """Managed-platform prices for one replica of `gpus` x `gpu_name`.

    Markup platforms (SageMaker) need the instance (its family picks the markup) and its
    on-demand $/hour; listed platforms (HF Endpoints) give the smallest size with at least
    `gpus` GPUs, one per provider. Unknown GPUs and families give no rows, never a guess.
    """
    if gpus < 1:
        raise FrugalError(f"gpus = {gpus}: a replica needs at least one GPU")
    if ondemand_usd_h is not None and not (math.isfinite(ondemand_usd_h) and ondemand_usd_h >= 0):
        raise FrugalError(f"on-demand price {ondemand_usd_h!r}: give $/hour >= 0")
    out = []
    family = instance_family(instance) if instance else ""
    for p in _platforms():
        if p.kind == "markup" and family == p.instance and ondemand_usd_h is not None:
            assert instance is not None
            out.append(_marked_up(p, instance, gpus, ondemand_usd_h))
    g = lookup_gpu(gpu_name)
    smallest: dict[tuple[str, str], PlatformRow] = {}
    for p in _platforms():
        if p.kind == "rate" and g is not None and p.gpu == g.name and p.gpus >= gpus:
            key = (p.platform, p.provider)
            if key not in smallest or p.gpus < smallest[key].gpus:
                smallest[key] = p
    return out + [_listed(p, gpus) for p in smallest.values()]


# ---- commitments -------------------------------------------------------------------------


@dataclass(frozen=True)
class Commitment:
    provider: str
    plan: str
    term_months: int
    discount: float  # fraction off on-demand
    payment: str
    applies_to: str
    range_end: str  # point | upper
    retrieved: str
    source: str

    def usd_h(self, ondemand_usd_h: float) -> float:
        """The committed $/hour for an on-demand $/hour."""
        return ondemand_usd_h * (1 - self.discount)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _commitment(r: _Row) -> Commitment:
    source, retrieved = r.provenance()
    end = r.text("range_end")
    if end not in ("point", "upper"):
        raise r.fail("range_end", f"{end!r}: write point (two listed prices) or upper (up to)")
    discount = r.price("discount")
    if discount >= 1:
        raise r.fail("discount", f"{discount:g}: a fraction off on-demand, below 1 (0.37 = 37%)")
    return Commitment(
        provider=r.text("provider").lower(),
        plan=r.text("plan"),
        term_months=r.whole("term_months"),
        discount=discount,
        payment=r.text("payment"),
        applies_to=r.text("applies_to"),
        range_end=end,
        retrieved=retrieved,
        source=source,
    )


def parse_commitments(text: str, file: str) -> tuple[Commitment, ...]:
    return tuple(_commitment(r) for r in _rows(text, file, Commitment))


@cache
def _commitments() -> tuple[Commitment, ...]:
    return parse_commitments(_bundled("commitments.csv"), "commitments.csv")


def commitments(provider: str) -> list[Commitment]:
    """The provider's bundled commitment terms (any case); [] for a provider without any."""
    key = provider.strip().lower()
    return [c for c in _commitments() if c.provider == key]


def conservative_commitment(provider: str, term_months: int) -> Commitment | None:
    """The discount to plan with: a listed-price row if there is one, else the smallest
    published ceiling (an "up to" figure is a best case, not a quote)."""
    rows = [c for c in commitments(provider) if c.term_months == term_months]
    points = [c for c in rows if c.range_end == "point"]
    pool = points or rows
    return min(pool, key=lambda c: c.discount) if pool else None


# ---- owning GPUs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Purchase:
    gpu: str
    form: str  # card | server (a server price includes its host)
    gpus: int
    price_usd: float
    price_kind: str
    range_end: str
    price_date: str  # "" when the source is undated
    retrieved: str
    source: str

    @property
    def per_gpu_usd(self) -> float:
        return self.price_usd / self.gpus

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "per_gpu_usd": round(self.per_gpu_usd, 2)}


def parse_hardware(text: str, file: str) -> tuple[Purchase, ...]:
    out: dict[str, Purchase] = {}
    for r in _rows(text, file, Purchase):
        source, retrieved = r.provenance()
        gpu = r.gpu("gpu")
        if gpu in out:
            raise r.fail("gpu", f"{gpu} is priced twice: keep one row per GPU")
        out[gpu] = Purchase(
            gpu=gpu,
            form=r.text("form"),
            gpus=r.whole("gpus"),
            price_usd=r.price("price_usd"),
            price_kind=r.text("price_kind"),
            range_end=r.text("range_end"),
            price_date=r.text("price_date", required=False),
            retrieved=retrieved,
            source=source,
        )
    return tuple(out.values())


@cache
def _hardware() -> tuple[Purchase, ...]:
    return parse_hardware(_bundled("hardware.csv"), "hardware.csv")


def purchase_price(gpu_name: str) -> Purchase | None:
    """A sourced purchase price for the GPU; None for an unknown GPU or one not priced."""
    g = lookup_gpu(gpu_name)
    return next((p for p in _hardware() if g is not None and p.gpu == g.name), None)
