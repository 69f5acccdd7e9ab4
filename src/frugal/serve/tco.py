"""Total cost of ownership over N months: rent by the hour, commit, use a managed platform or
an API, or buy the GPUs. Pure arithmetic on dataclasses (no I/O, no catalogs): the CLI fills a
`Workload` and the options, `tco()` returns every option's cost month by month.

Formulas, for months m = 1..N:

- A month is 730 hours (8,760 / 12; the AWS pricing calculator bills "730 hours in a month",
  as do Hugging Face Endpoints' pricing examples).
- `Hourly` (on-demand, spot, reserved, managed platform): replicas x $/replica-hour x billed
  hours x (1 + overhead). Billed hours = the workload's serving hours, or all 730 when
  `always_on`: a commitment bills every hour of its term, used or not (AWS whitepaper "Cost
  optimization: reservation models", usage billing; GCP CUDs are "billed monthly ... whether or
  not you use the services"). `upfront_usd` is paid in month 1; a term longer than N months
  leaves `commitment_left_usd` owed. HF Endpoints bill rate x (hours x min replicas + scale-up
  hours x extra replicas): give the average replicas.
- `Api`: input Mtok x $/Mtok + output Mtok x $/Mtok, times (1 - batch discount).
- `Owned`: GPUs = ceil(replicas) x GPUs per replica (you buy for the peak). Purchase x (1 -
  resale) / (12 x years) a month for the amortization period, straight line; or, `upfront`,
  the purchase in month 1 and the resale back in the month the period ends. Power = GPUs x
  watts / 1000 x $/kWh x serving hours x utilization (busy share of those hours).
- Every option: its engineering hours a month x the team's $/hour (self-hosting needs people;
  an API little).
- Training, if any: GPU-hours x $/GPU-hour in month 1 and every K months after, charged to every
  option (an API option is only real if the provider serves your fine-tuned weights); an
  `Owned` option with `trains_here` pays only its power for those GPU-hours.

Crossover: the first month in which one option's cumulative cost falls below another's after
being above it (each change of lead is one crossover). Break-even with the cheapest API, per
self-hosted option, in a month without training: self-hosting costs F + V u, where u is the
fleet's utilization and V its power at u = 1 (0 for hourly rent); the API costs E + P C u, where
P is $ per M output tokens (input priced in at the workload's input:output ratio) and C the
fleet's capacity = replicas x output tokens/s x 3600 x hours / 1e6 M tokens a month. So
u* = (F - E) / (P C - V) and tokens* = u* C; without tokens/s, tokens* = (F + V u - E) / P.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from frugal.errors import FrugalError
from frugal.hardware.offers import HOURS_PER_MONTH

MAX_HOURS_PER_MONTH = 744.0  # 31 days


def _need(ok: bool, where: str, field: str, value: object, fix: str) -> None:
    if not ok:
        raise FrugalError(f"{where}: {field} = {value!r}; {fix}")


def _amount(where: str, field: str, value: float) -> None:
    _need(math.isfinite(value) and value >= 0, where, field, value, "give a number >= 0")


def _fraction(where: str, field: str, value: float, what: str) -> None:
    _need(math.isfinite(value) and 0 <= value <= 1, where, field, value, f"give {what} from 0 to 1")


@dataclass(frozen=True)
class Training:
    gpu_hours: float  # one run
    usd_per_gpu_h: float
    every_months: int = 0  # 0 = once, in month 1; K = months 1, 1+K, 1+2K, ...

    def __post_init__(self) -> None:
        _amount("training", "gpu_hours", self.gpu_hours)
        _amount("training", "usd_per_gpu_h", self.usd_per_gpu_h)
        k = self.every_months
        _need(k >= 0, "training", "every_months", k, "give 0 (once) or the months between runs")

    def due(self, month: int) -> bool:
        return month == 1 or (self.every_months > 0 and (month - 1) % self.every_months == 0)


@dataclass(frozen=True)
class Workload:
    months: int = 12
    replicas: float = 1.0  # replicas serving, on average (Owned buys the ceiling)
    gpus_per_replica: int = 1
    hours_per_month: float = HOURS_PER_MONTH  # hours the replicas serve (730 = always)
    input_mtok_per_month: float = 0.0  # millions of tokens
    output_mtok_per_month: float = 0.0
    output_tokens_per_s: float | None = None  # one replica's capacity (break-even utilization)
    engineering_usd_h: float = 0.0
    training: Training | None = None

    def __post_init__(self) -> None:
        w, gpus, hours = "workload", self.gpus_per_replica, self.hours_per_month
        _need(self.months >= 1, w, "months", self.months, "give 1 or more months")
        _need(gpus >= 1, w, "gpus_per_replica", gpus, "a replica needs at least one GPU")
        ok = math.isfinite(hours) and 0 <= hours <= MAX_HOURS_PER_MONTH
        _need(
            ok, w, "hours_per_month", hours, "give the hours served a month, 0 to 744 (730 = all)"
        )
        for field in ("replicas", "input_mtok_per_month", "output_mtok_per_month"):
            _amount(w, field, getattr(self, field))
        _amount(w, "engineering_usd_h", self.engineering_usd_h)
        tps = self.output_tokens_per_s
        ok = tps is None or (math.isfinite(tps) and tps > 0)
        _need(ok, w, "output_tokens_per_s", tps, "give a replica's output tokens/s (> 0) or none")

    @property
    def gpus_owned(self) -> int:
        return math.ceil(self.replicas) * self.gpus_per_replica

    def capacity_mtok(self) -> float | None:
        """The fleet's output capacity in M tokens a month (None without tokens/s)."""
        tps = self.output_tokens_per_s
        return None if tps is None else self.replicas * tps * 3600 * self.hours_per_month / 1e6


@dataclass(frozen=True)
class Hourly:
    name: str
    usd_per_replica_h: float
    always_on: bool = False  # a commitment: billed every hour of the month
    overhead: float = 0.0  # extra billed hours, as a fraction (spot restarts, scale-up lag)
    upfront_usd: float = 0.0
    term_months: int = 0
    engineering_h_month: float = 0.0

    def __post_init__(self) -> None:
        where, term = f"option {self.name!r}", self.term_months
        for field in ("usd_per_replica_h", "overhead", "upfront_usd", "engineering_h_month"):
            _amount(where, field, getattr(self, field))
        _need(term >= 0, where, "term_months", term, "give the commitment's months (12, 36) or 0")


@dataclass(frozen=True)
class Api:
    name: str
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    batch_discount: float = 0.0  # fraction off, if the workload can use the batch API
    engineering_h_month: float = 0.0

    def __post_init__(self) -> None:
        for field in ("input_usd_per_mtok", "output_usd_per_mtok", "engineering_h_month"):
            _amount(f"option {self.name!r}", field, getattr(self, field))
        _fraction(f"option {self.name!r}", "batch_discount", self.batch_discount, "the share off")

    def usd_per_output_mtok(self, input_per_output: float) -> float:
        """$ per M output tokens with the input that comes with them."""
        rate = self.output_usd_per_mtok + self.input_usd_per_mtok * input_per_output
        return rate * (1 - self.batch_discount)


@dataclass(frozen=True)
class Owned:
    name: str
    purchase_usd_per_gpu: float  # a server's price / its GPUs, host included
    watts_per_gpu: float  # board power plus a share of the host's
    kwh_usd: float
    amortize_years: float = 3.0
    utilization: float = 1.0
    resale_fraction: float = 0.0
    upfront: bool = False  # cash view: pay in month 1, resale back when the period ends
    trains_here: bool = False
    engineering_h_month: float = 0.0

    def __post_init__(self) -> None:
        where = f"option {self.name!r}"
        for field in ("purchase_usd_per_gpu", "watts_per_gpu", "kwh_usd", "engineering_h_month"):
            _amount(where, field, getattr(self, field))
        years = self.amortize_years
        ok = math.isfinite(years) and years > 0
        _need(ok, where, "amortize_years", years, "give the years to spread the purchase over")
        busy = "the share of serving hours the GPUs are busy"
        _fraction(where, "utilization", self.utilization, busy)
        _fraction(where, "resale_fraction", self.resale_fraction, "the share of the price back")

    @property
    def amortize_months(self) -> int:
        return max(1, round(self.amortize_years * 12))


Option = Hourly | Api | Owned


def _engineering(opt: Option, w: Workload) -> float:
    return opt.engineering_h_month * w.engineering_usd_h


def _hourly_serving(opt: Hourly, w: Workload) -> float:
    hours = HOURS_PER_MONTH if opt.always_on else w.hours_per_month
    return w.replicas * opt.usd_per_replica_h * hours * (1 + opt.overhead)


def _api_tokens(opt: Api, w: Workload) -> float:
    usd = w.input_mtok_per_month * opt.input_usd_per_mtok
    return (usd + w.output_mtok_per_month * opt.output_usd_per_mtok) * (1 - opt.batch_discount)


def _owned_power(opt: Owned, w: Workload, utilization: float) -> float:
    return w.gpus_owned * opt.watts_per_gpu / 1000 * opt.kwh_usd * w.hours_per_month * utilization


def _owned_capital(opt: Owned, w: Workload, month: int) -> float:
    price = opt.purchase_usd_per_gpu * w.gpus_owned
    if opt.upfront:
        resale = opt.resale_fraction * price if month == opt.amortize_months else 0.0
        return (price if month == 1 else 0.0) - resale
    return (
        price * (1 - opt.resale_fraction) / opt.amortize_months
        if month <= opt.amortize_months
        else 0.0
    )


def _training(opt: Option, w: Workload, month: int) -> float:
    t = w.training
    if t is None or not t.due(month):
        return 0.0
    if isinstance(opt, Owned) and opt.trains_here:
        return t.gpu_hours * opt.watts_per_gpu / 1000 * opt.kwh_usd
    return t.gpu_hours * t.usd_per_gpu_h


def month_usd(opt: Option, w: Workload, month: int) -> float:
    """What the option costs in month `month` (1-based)."""
    if isinstance(opt, Hourly):
        base = _hourly_serving(opt, w) + (opt.upfront_usd if month == 1 else 0.0)
    elif isinstance(opt, Api):
        base = _api_tokens(opt, w)
    else:
        base = _owned_capital(opt, w, month) + _owned_power(opt, w, opt.utilization)
    return base + _engineering(opt, w) + _training(opt, w, month)


def _json(obj: OptionCost | Crossover | BreakEven | Tco) -> dict[str, object]:
    """A result as JSON-ready data: floats to 4 decimals, tuples as lists."""

    def plain(v: object) -> object:
        if isinstance(v, float):
            return round(v, 4)
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return [plain(x) for x in v] if isinstance(v, list | tuple) else v

    out = plain(asdict(obj))
    assert isinstance(out, dict)
    return out


@dataclass(frozen=True)
class OptionCost:
    name: str
    kind: str  # hourly | api | owned
    monthly_usd: tuple[float, ...]
    cumulative_usd: tuple[float, ...]
    commitment_left_usd: float = 0.0  # owed after the horizon for a longer term

    def to_json(self) -> dict[str, object]:
        return {**_json(self), "total_usd": round(self.cumulative_usd[-1], 4)}


@dataclass(frozen=True)
class Crossover:
    month: int  # from this month on, `cheaper` has cost less in total than `dearer`
    cheaper: str
    dearer: str

    def to_json(self) -> dict[str, object]:
        return _json(self)


@dataclass(frozen=True)
class BreakEven:
    option: str
    api: str
    utilization: float | None  # of the option's fleet; None without tokens/s or if never
    output_mtok_per_month: float | None  # None = never breaks even
    input_mtok_per_month: float | None
    reason: str

    def to_json(self) -> dict[str, object]:
        return _json(self)


def _cost(opt: Option, w: Workload) -> OptionCost:
    monthly = tuple(month_usd(opt, w, m) for m in range(1, w.months + 1))
    left = 0.0
    if isinstance(opt, Hourly) and opt.term_months > w.months:
        left = (opt.term_months - w.months) * _hourly_serving(opt, w)
    kind = {Hourly: "hourly", Api: "api", Owned: "owned"}[type(opt)]
    return OptionCost(opt.name, kind, monthly, _running_sum(monthly), left)


def _running_sum(xs: tuple[float, ...]) -> tuple[float, ...]:
    out, total = [], 0.0
    for x in xs:
        total += x
        out.append(total)
    return tuple(out)


def crossovers(costs: list[OptionCost]) -> list[Crossover]:
    """Every month in which one option's cumulative cost passes below another's."""
    out = []
    for i, a in enumerate(costs):
        for b in costs[i + 1 :]:
            lead = 0  # sign of a - b at the last month they differed
            for m, (x, y) in enumerate(zip(a.cumulative_usd, b.cumulative_usd, strict=True), 1):
                sign = (x > y) - (x < y) if not math.isclose(x, y, abs_tol=1e-9) else 0
                if sign and lead and sign != lead:
                    out.append(
                        Crossover(m, a.name if x < y else b.name, b.name if x < y else a.name)
                    )
                lead = sign or lead
    return sorted(out, key=lambda c: (c.month, c.cheaper, c.dearer))


def _fixed_and_power(opt: Hourly | Owned, w: Workload) -> tuple[float, float]:
    """(F, V) of a training-free month: cost at zero utilization and the power at full use."""
    if isinstance(opt, Hourly):
        return _hourly_serving(opt, w) + _engineering(opt, w), 0.0
    capital = opt.purchase_usd_per_gpu * w.gpus_owned * (1 - opt.resale_fraction)
    return capital / opt.amortize_months + _engineering(opt, w), _owned_power(opt, w, 1.0)


def breakeven(opt: Hourly | Owned, api: Api, w: Workload) -> BreakEven:
    """Where self-hosting `opt` costs the same as sending the same tokens to `api`."""
    if w.output_mtok_per_month <= 0:
        return BreakEven(
            opt.name, api.name, None, None, None, "the workload has no output tokens to price"
        )
    ratio = w.input_mtok_per_month / w.output_mtok_per_month
    fixed, power = _fixed_and_power(opt, w)
    price, api_fixed = api.usd_per_output_mtok(ratio), _engineering(api, w)
    capacity = w.capacity_mtok()
    if capacity is None:
        used = opt.utilization if isinstance(opt, Owned) else 0.0
        if price <= 0:
            return BreakEven(opt.name, api.name, None, None, None, f"{api.name} is free")
        tokens = max(0.0, (fixed + power * used - api_fixed) / price)
        why = f"breaks even with {api.name} at {tokens:,.1f} M output tokens a month"
        return BreakEven(opt.name, api.name, None, tokens, tokens * ratio, why)
    slope = price * capacity - power
    if slope <= 0:
        why = f"never: even at full use {api.name} costs less than this option's power"
        return BreakEven(opt.name, api.name, None, None, None, why)
    u = max(0.0, (fixed - api_fixed) / slope)
    if u == 0:
        why = f"cheaper than {api.name} at any load"
    elif u > 1:
        why = f"needs {u:.0%} of the fleet's capacity: at this fleet size {api.name} stays cheaper"
    else:
        why = f"breaks even with {api.name} at {u:.0%} utilization"
    return BreakEven(opt.name, api.name, u, u * capacity, u * capacity * ratio, why)


@dataclass(frozen=True)
class Tco:
    months: int
    options: tuple[OptionCost, ...]
    cheapest_by_month: tuple[str, ...]  # the option with the lowest cost in each month
    crossovers: tuple[Crossover, ...]
    breakeven: tuple[BreakEven, ...]

    @property
    def cheapest_total(self) -> str:
        return min(self.options, key=lambda o: o.cumulative_usd[-1]).name

    def to_json(self) -> dict[str, object]:
        options = [o.to_json() for o in self.options]
        return {**_json(self), "options": options, "cheapest_total": self.cheapest_total}


def tco(w: Workload, options: list[Option]) -> Tco:
    """Every option's monthly and cumulative cost over `w.months`, who is cheapest when,
    where the totals cross, and where each self-hosted option breaks even with the API."""
    if not options:
        raise FrugalError("no options to compare: give at least one price (on-demand, API, ...)")
    names = [o.name for o in options]
    dup = next((n for n in names if names.count(n) > 1), None)
    _need(dup is None, "options", "name", dup, "give every option its own name")
    costs = [_cost(o, w) for o in options]
    cheapest = tuple(min(costs, key=lambda c: c.monthly_usd[m]).name for m in range(w.months))
    apis = [o for o in options if isinstance(o, Api)]
    even: list[BreakEven] = []
    if apis:
        best = min(apis, key=lambda a: _api_tokens(a, w) + _engineering(a, w))
        even = [breakeven(o, best, w) for o in options if not isinstance(o, Api)]
    return Tco(w.months, tuple(costs), cheapest, tuple(crossovers(costs)), tuple(even))
