"""The serving plan API: a `ServeRequest` in (the model, the load and its latency targets,
the weight formats and engines to try, the offers), a `ServeOutcome` out (the cheapest
deployment that carries the load, beside the other formats, the hosted APIs and the
managed platforms, with its reasons and JSON), through `make_serve_plan`.

`frugal serve plan` parses its options into the request, whose fields are named as the
options are and hold each number's range once; `frugal tco` asks the same request for the
serving half of its months, and `frugal serve estimate` takes its load's options from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from frugal.errors import FrugalError
from frugal.hardware.catalog import PriceBasis, price_basis, select_offers
from frugal.models.specs import load_spec
from frugal.serve import compare
from frugal.serve.engines import find_engine
from frugal.serve.estimate import check_request
from frugal.serve.plan import ServeAsk, ServePlan, plan
from frugal.serve.weights import find_format
from frugal.validation import Listed, Number, listed

MAX_TOKENS = 16_777_216  # of a request: prompt or output
MAX_MS = 3.6e6  # a latency target: up to an hour
TERM = Number(ge=1, le=120, whole=True)  # the longest commitment sold: 10 years


def _terms(value: Any) -> Any:
    """Commitment terms in months, as a list or as "12,36"; one line for a bad one."""
    try:
        return tuple(int(TERM(m)) for m in listed(value) or ())
    except ValueError as e:
        raise ValueError(f"{e}, e.g. 12,36") from None


Months = Annotated[tuple[int, ...], BeforeValidator(_terms)]


class ServeRequest(BaseModel):
    """What `frugal serve plan MODEL` is asked, named as its options are."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model: str = Field(min_length=1, description="a bundled hub id, a local dir or config.json")
    rate: float | None = Field(
        None, gt=0, le=1e6, description="requests per second to carry (at peak)"
    )
    requests_per_day: float | None = Field(None, gt=0, le=1e11, description="or: requests per day")
    peak_factor: float = Field(
        1.0,
        ge=1,
        le=1e4,
        description="with --requests-per-day: peak rate / mean rate; servers carry the peak",
    )
    input_len: int = Field(ge=1, le=MAX_TOKENS, description="prompt tokens per request")
    output_len: int = Field(ge=1, le=MAX_TOKENS, description="output tokens per request")
    ttft_ms: float | None = Field(
        None, gt=0, le=MAX_MS, description="mean time-to-first-token target, ms"
    )
    itl_ms: float | None = Field(
        None, gt=0, le=MAX_MS, description="mean inter-token latency target, ms"
    )
    quant: Listed = Field(
        ("bf16", "fp8", "awq"), description="weight formats to consider, comma-separated"
    )
    engine: Listed = Field(("vllm",), description="engines to consider, comma-separated")
    kv_dtype: str = Field("auto", description="KV cache dtype: auto (the model's 16 bit) or fp8")
    prefix_hit: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of prompt tokens found in the prefix cache (0-1): less prefill work",
    )
    response_cache_hit: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of requests answered by a response cache (0-1): they never arrive",
    )
    offline: bool = Field(
        False,
        description="batch work: priced at maximum throughput, spot allowed, no latency targets",
    )
    commitment_months: Months = Field(
        (12,), description="commitment terms to price, months, comma-separated ('' for none)"
    )
    providers: Listed | None = Field(
        None, min_length=1, description="providers to consider [default: all]"
    )
    offers: tuple[str, ...] = Field((), description="offers CSVs that add to the catalog")
    discount: tuple[str, ...] = Field((), description="PROVIDER=PERCENT off, e.g. aws=15")

    def ask(self) -> ServeAsk:
        """The load and its targets, checked once before any deployment is tried."""
        if (self.rate is None) == (self.requests_per_day is None):
            raise FrugalError("give the load: --rate R or --requests-per-day N")
        if self.offline and (self.ttft_ms or self.itl_ms):
            raise FrugalError("--offline has no latency targets: drop --ttft-ms / --itl-ms")
        spec = load_spec(self.model)
        kv = self.kv_dtype.lower()
        check_request(spec, self.input_len, self.output_len, self.prefix_hit, kv)
        if not self.quant or not self.engine:
            raise FrugalError("--quant and --engine need at least one value, e.g. --quant bf16,fp8")
        for q in self.quant:
            find_format(q)
        for name in self.engine:
            find_engine(name)
        if self.rate is not None:
            mean = peak = self.rate
        else:
            mean = (self.requests_per_day or 0) / 86400
            peak = mean * self.peak_factor
        kept = 1 - self.response_cache_hit
        return ServeAsk(
            spec=spec,
            rate=peak * kept,
            input_len=self.input_len,
            output_len=self.output_len,
            ttft_s=self.ttft_ms / 1e3 if self.ttft_ms else None,
            itl_s=self.itl_ms / 1e3 if self.itl_ms else None,
            quants=self.quant,
            engines=self.engine,
            kv_dtype=kv,
            prefix_hit=self.prefix_hit,
            offline=self.offline,
            commitments=self.commitment_months,
            mean_rate=mean * kept,
        )


@dataclass
class ServeOutcome:
    """The serving plan and the prices it came from."""

    request: ServeRequest
    plan: ServePlan
    basis: PriceBasis

    def to_json(self) -> dict[str, Any]:
        """What `frugal serve plan --json` prints."""
        p, q = self.plan, self.request
        ask, api_rows = p.ask, compare.apis(p)
        out: dict[str, Any] = {
            "model": ask.spec.id,
            "rate_requests_per_s": ask.rate,
            "mean_rate_requests_per_s": ask.billed_rate,
            "input_len": ask.input_len,
            "output_len": ask.output_len,
            "ttft_ms": ask.ttft_s * 1e3 if ask.ttft_s else None,
            "itl_ms": ask.itl_s * 1e3 if ask.itl_s else None,
            "offline": ask.offline,
            "recommendation": p.best.to_json() | {"reasons": p.reasons},
            "options": [o.to_json() for o in p.options[:10]],
            "feasible_options": len(p.options),
            "refused": [r.to_json() for r in p.refused],
            "formats": compare.formats(p),
            "apis": api_rows,
            "break_even": compare.break_even(p, api_rows[0] if api_rows else None),
            "platforms": compare.platforms(p),
            "notes": [] if api_rows else [f"no bundled API serves {ask.spec.id}"],
            "prices": self.basis.to_json(),
        }
        if q.response_cache_hit:
            arriving = ask.rate / (1 - q.response_cache_hit)
            out["notes"].append(
                f"a response cache answers {q.response_cache_hit:.0%} of {arriving:g} "
                f"requests/s: the servers carry {ask.rate:g}"
            )
        return out


def make_serve_plan(request: ServeRequest) -> ServeOutcome:
    """The cheapest deployment that carries the request's load within its targets."""
    q = request
    ask = q.ask()
    providers = ",".join(q.providers) if q.providers else None
    offers = select_offers(q.offers, q.discount, (), providers_csv=providers)
    return ServeOutcome(q, plan(ask, offers), price_basis(offers, q.offers))
