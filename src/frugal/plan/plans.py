"""What the search finds: a plan (an offer, a set-up, its time and money, its reasons),
an option it rejected and why, the result, and the Pareto frontier of cost vs time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from frugal.errors import FrugalError
from frugal.estimate.profile import Profile
from frugal.estimate.throughput import Speed
from frugal.hardware.offers import Offer
from frugal.plan import spot as spot_math
from frugal.plan.transfer import Move
from frugal.step.job import TrainJob

NO_MOVE = Move(0.0, 0.0, "")


@dataclass
class Plan:
    offer: Offer
    nodes: int
    job: TrainJob
    speed: Speed
    peak_reserved_gib: float
    device_total_gib: float
    spot: bool
    hours: float
    compute_usd: float
    setup_h: float
    storage_usd: float
    egress_usd: float
    checkpoint_interval_min: float | None = None
    interruptions: float = 0.0
    mtbi_h: float = 0.0  # on spot: mean hours between interruptions (of the whole run)
    mtbi_from: str = ""  # and where that figure comes from
    fallback: spot_math.Fallback | None = None
    reasons: list[str] = field(default_factory=list)
    value_of_time_usd_h: float = 0.0  # Constraints.value_of_time_usd_h, weighs the hours
    output_gb: float = 0.0  # what the run hands back: the adapter, or the whole model
    data_in: Move = NO_MOVE  # the dataset onto the machine (in egress_usd and setup_h)
    data_out: Move = NO_MOVE  # the result back to where the data lives (in egress_usd)
    host_offload_gib: float = 0.0  # pinned host memory per GPU (--offload-activations)
    why_on: dict[str, str] = field(default_factory=dict)  # techniques the plan turned on, why
    profile: Profile | None = field(default=None, repr=False, compare=False)  # of its step
    # the same plan with its hours of work scaled by a factor, priced alike (set-up, spot
    # interruptions and fallback): what its range is priced with, when asked
    reprice: Callable[[float], Plan | None] | None = field(default=None, repr=False, compare=False)

    @cached_property
    def _ends(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """(hours, dollars) at the fastest and at the slowest speed expected."""
        out = []
        for f in self.speed.hours_factor:
            p = self.reprice(f) if self.reprice else None
            out.append((p.hours, p.cost_usd) if p else (self.hours * f, self.cost_usd * f))
        return out[0], out[1]

    @property
    def hours_range(self) -> tuple[float, float]:
        """The plan's hours at the fastest and the slowest speed expected
        (`Speed.tokens_per_s_range`)."""
        return self._ends[0][0], self._ends[1][0]

    @property
    def cost_range(self) -> tuple[float, float]:
        """Its dollars at the fastest and the slowest speed expected."""
        return self._ends[0][1], self._ends[1][1]

    @property
    def cost_usd(self) -> float:
        return self.compute_usd + self.storage_usd + self.egress_usd

    @property
    def data_note(self) -> str:
        return (
            f"{self.data_in.reason}; {self.data_out.reason}"
            if self.data_in.reason
            else (self.data_out.reason)
        )

    @property
    def time_value_usd(self) -> float:
        """The wait priced: the value of time x the hours until the result (setup, and
        on spot the expected interruptions, included)."""
        return self.value_of_time_usd_h * self.hours

    @property
    def weighed_cost_usd(self) -> float:
        """What `--optimize cost` ranks by: dollars spent plus the wait priced."""
        return self.cost_usd + self.time_value_usd

    @property
    def gpus(self) -> int:
        return self.job.gpus

    @property
    def price_per_hour(self) -> float:
        return self.offer.hourly_usd(self.spot) * self.nodes

    def label(self) -> str:
        nodes = f"{self.nodes}x " if self.nodes > 1 else ""
        spot = " spot" if self.spot else ""
        return f"{self.offer.provider} {nodes}{self.offer.instance}{spot} {self.job.method}"

    def to_json(self) -> dict[str, Any]:
        return self._where() | self._setup() | self._estimate() | {"reasons": self.reasons}

    def _where(self) -> dict[str, Any]:
        """The machines: provider, instance, nodes, GPUs, spot and its fallback."""
        j = self.job
        return {
            "provider": self.offer.provider,
            "instance": self.offer.instance,
            "region": self.offer.region,
            "nodes": self.nodes,
            "gpu": self.offer.gpu.name,
            "gpus": j.gpus,
            "spot": self.spot,
            "spot_fallback": (
                {
                    "switch_to_ondemand_after_h": round(self.fallback.switch_at_h, 2),
                    "spot_share": round(self.fallback.spot_share, 3),
                }
                if self.fallback and self.fallback.spot_share < 1
                else None
            ),
        }

    def _setup(self) -> dict[str, Any]:
        """The training set-up of the step on them."""
        j = self.job
        task = j.task_settings() if j.task != TrainJob.model_fields["task"].default else {}
        return {
            **task,
            "method": j.method,
            "precision": j.precision,
            "sharding": j.sharding if j.gpus > 1 else None,
            "micro_batch": j.batch,
            "grad_accum": j.grad_accum,
            "grad_checkpointing": j.grad_checkpointing,
            "optimizer": j.optimizer,
            "optimizer_in_backward": j.optimizer_in_backward,
            "seq": j.seq,
            "loss_chunks": j.loss_chunks,
            "offload_activations": j.offload_activations,
            "host_offload_gib": round(self.host_offload_gib, 2),
        }

    def _estimate(self) -> dict[str, Any]:
        """What it is expected to take: hours, dollars, memory, speed, interruptions."""
        return {
            "est_hours": round(self.hours, 3),
            "est_hours_range": [round(h, 3) for h in self.hours_range],
            "est_cost_usd": round(self.cost_usd, 2),
            "est_cost_usd_range": [round(c, 2) for c in self.cost_range],
            "cost_breakdown_usd": {
                "compute": round(self.compute_usd, 2),
                "storage": round(self.storage_usd, 2),
                "egress": round(self.egress_usd, 2),
            },
            "price_per_hour_usd": round(self.price_per_hour, 4),
            "setup_h": round(self.setup_h, 3),
            "peak_reserved_gib": round(self.peak_reserved_gib, 2),
            "device_total_gib": round(self.device_total_gib, 2),
            "usable_gib": round(self.offer.gpu.usable_gib, 2),
            "tokens_per_s": round(self.speed.tokens_per_s, 1),
            "tokens_per_s_range": [round(v, 1) for v in self.speed.tokens_per_s_range],
            "bound": self.speed.bound,
            "host_share": round(self.speed.host_share, 3),
            "step_time_s": round(self.speed.step_time_s, 4),
            "mfu": round(self.speed.efficiency, 3),
            "checkpoint_interval_min": (
                round(self.checkpoint_interval_min, 1)
                if self.checkpoint_interval_min is not None
                else None
            ),
            "expected_interruptions": round(self.interruptions, 2),
            "interrupted_every_h": round(self.mtbi_h, 2) if self.spot else None,
            "interruption_rate_from": self.mtbi_from or None,
            **(
                {
                    "time_value_usd": round(self.time_value_usd, 2),
                    "weighed_cost_usd": round(self.weighed_cost_usd, 2),
                }
                if self.value_of_time_usd_h
                else {}
            ),
        }


@dataclass
class Rejected:
    label: str
    why: str
    kind: str  # fit | deadline | budget | dtype | batch
    cost_usd: float | None = None
    hours: float | None = None
    need_gib: float | None = None  # fit: per GPU at micro-batch need_batch, what the GPU offers
    have_gib: float | None = None
    need_batch: int = 1  # the least micro-batch the job can run (no accumulation: all of it)

    def to_json(self) -> dict[str, Any]:
        return {
            "option": self.label,
            "why": self.why,
            "kind": self.kind,
            "est_cost_usd": None if self.cost_usd is None else round(self.cost_usd, 2),
            "est_hours": None if self.hours is None else round(self.hours, 3),
        }


class Infeasible(FrugalError):
    """No plan meets the constraints: the message names the closest miss; `plans` (over
    the deadline or budget) and `rejected` say what the search found."""

    def __init__(self, message: str, plans: list[Plan], rejected: list[Rejected]) -> None:
        super().__init__(message)
        self.plans, self.rejected = plans, rejected


@dataclass
class Result:
    recommendation: Plan
    frontier: list[Plan]
    plans: list[Plan]  # every feasible plan, best first
    rejected: list[Rejected]
    notes: list[str]


def pareto(plans: list[Plan]) -> list[Plan]:
    """Plans no other plan beats on both cost and time, cheapest first."""
    out: list[Plan] = []
    for p in sorted(plans, key=lambda p: (p.cost_usd, p.hours)):
        if not out or p.hours < out[-1].hours - 1e-9:
            out.append(p)
    return out
