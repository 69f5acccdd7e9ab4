"""What a plan must meet: the request `frugal plan` (and each job of `--jobs`) makes of the
search, validated as one line per bad value; and the one figure of an offer a constraint
may replace (the network between nodes)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import JsonDict

from frugal.config import TrainingConfig
from frugal.durations import Hours
from frugal.errors import FrugalError
from frugal.hardware.gpus import MARGIN
from frugal.hardware.offers import Offer
from frugal.step.job import Method, Optimizer
from frugal.validation import refusal

SpotMode = Literal["auto", "only", "never"]


def spot_mode(spot: bool | None) -> SpotMode:
    """`--spot` (only), `--no-spot` (never) or neither (auto: both)."""
    return "auto" if spot is None else ("only" if spot else "never")


def _cli(flag: str) -> JsonDict:
    return {"flag": flag}  # the `frugal plan` option of a field named otherwise


class Constraints(BaseModel):
    """What a plan must meet, validated here for every caller. `frugal plan`'s options are
    made from these fields (their defaults and descriptions are the help text)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    tokens: float = Field(gt=0, description="training tokens in total (dataset x epochs)")
    effective_batch: int = Field(
        TrainingConfig.model_fields["effective_batch"].default,
        ge=1,
        le=1_048_576,
        description=TrainingConfig.model_fields["effective_batch"].description,
    )
    budget_usd: float | None = Field(
        None, gt=0, description="most you will spend, USD", json_schema_extra=_cli("--budget")
    )
    deadline_h: Hours = Field(
        None,
        description="time until the run must be done: 24h, 90m, 2d, 1h30m (a number is hours)",
        json_schema_extra=_cli("--deadline"),
    )
    max_gpus: int = Field(64, ge=1, description="most GPUs in one run")
    spot: SpotMode = Field("auto", description="spot offers: auto (both), only, or never")
    methods: tuple[Method, ...] = Field(
        ("lora",),
        min_length=1,
        description="methods to compare, e.g. lora,qlora",
    )
    optimizers: tuple[Optimizer, ...] = Field(
        ("adamw", "adamw-8bit"), min_length=1, description="optimizers to try for full fine-tuning"
    )
    margin: float = Field(MARGIN, ge=0, lt=0.5, description="share of usable GPU memory kept free")
    mtbi_h: Hours = Field(
        None,
        description="mean time between spot interruptions, e.g. 12h or 3d (a number is hours; "
        "overrides the offers' buckets)",
        json_schema_extra=_cli("--spot-mtbi-hours"),
    )
    objective: Literal["cost", "time"] = Field(
        "cost", description="what to minimize: cost or time", json_schema_extra=_cli("--optimize")
    )
    value_of_time_usd_h: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="what an hour of waiting for the result is worth, USD: --optimize cost "
        "ranks by cost + this x hours (0: dollars alone)",
        json_schema_extra=_cli("--value-of-time"),
    )
    auto_loss_chunks: bool = Field(
        True,
        description="try the loss in chunks where a set-up does not fit, or where the logits "
        "hold its micro-batch down (off when --loss-chunks is given)",
    )
    auto_offload: bool = Field(
        True,
        description="then try offloading activations to host memory where it still does "
        "not fit (off when --[no-]offload-activations is given)",
    )
    auto_in_backward: bool = Field(
        True,
        description="for full fine-tuning on one GPU, try the optimizer in backward after "
        "the chunked loss (off when --[no-]optimizer-in-backward is given)",
    )
    data: str = Field(
        "local",
        description="where the dataset is and results go: local, hub or PROVIDER:REGION",
    )
    data_gb: float = Field(
        0.0, ge=0, le=1e6, description="the dataset's size, GB, up to a petabyte (0: not priced)"
    )
    scratch_gb: float = Field(
        0.0,
        ge=0,
        description="disk the run writes besides checkpoints and the dataset, GB "
        "(a distillation's precomputed teacher logits), priced for its hours",
    )
    network_gbps: float | None = Field(
        None,
        gt=0,
        le=100_000,
        description="bandwidth between nodes, Gbit/s a node (400 for one NDR InfiniBand or EFA "
        "link): multi-node plans use it, also on providers frugal knows no fast network "
        "between nodes for (by default, each provider's; none: one node only)",
    )

    @classmethod
    def build(cls, **values: Any) -> Constraints:
        """Validated constraints, or one line naming the option to fix."""
        try:
            return cls.model_validate(values)
        except ValidationError as e:
            raise FrugalError(refusal(e, cls, _flag)) from None


def _flag(name: str) -> str:
    """The `frugal plan` option of a Constraints field."""
    field = Constraints.model_fields.get(name)
    extra = field.json_schema_extra if field else None
    return str(extra["flag"]) if isinstance(extra, dict) else "--" + name.replace("_", "-")


def node_network(offer: Offer, k: Constraints) -> tuple[float, str]:
    """GB/s between two nodes of `offer`, and whose figure it is: the user's --network-gbps,
    else the provider's terms (0: the provider rents no multi-node clusters frugal knows of,
    so its plans stay on one node)."""
    if k.network_gbps is not None:
        return k.network_gbps / 8, "--network-gbps"
    return offer.terms.node_network_gbps, f"{offer.provider}'s, providers.csv"
