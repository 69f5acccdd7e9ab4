"""Work a task can move out of its steps into one pass over the data before training (a
preference task's reference log-probabilities, `job.reference: precomputed`): the plan
prices both ways and keeps the cheaper, saying by how much and why.

The pass is a forward of each row, the same work as the reference's forward in every step
of one epoch. It is priced as that share of an epoch of steps: the forward FLOPs of the
step without the reference over the step's whole FLOPs (forward, backward, recompute), by
the simulated step's own counts, so an epoch of 100 steps whose forward is 30% of the
work adds 30 steps' time. Removing the reference from the step frees its memory (a full
fine-tune's frozen copy) and its forward from every step of every epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

from frugal.estimate.core import get_profile
from frugal.formats import usd
from frugal.hardware.offers import Offer
from frugal.models.specs import ModelSpec
from frugal.plan.constraints import Constraints
from frugal.plan.plans import Infeasible, Result
from frugal.plan.search import search
from frugal.step.job import TrainJob
from frugal.step.tasks import task_of


@dataclass(frozen=True)
class Upfront:
    """The plan chosen between the step as asked and the step with its pass before
    training, and the note comparing them."""

    result: Result
    job: TrainJob
    k: Constraints
    note: str | None


def cheaper_upfront(
    spec: ModelSpec, base: TrainJob, offers: list[Offer], k: Constraints, per_epoch: float,
    result: Result,
) -> Upfront:  # fmt: skip
    """`result` (the plan of `base` under `k`) or, cheaper, the plan of the task's step with
    its pass before training (`Task.upfront`), with a note on both."""
    task = task_of(base.task)
    change = task.upfront(base)
    if change is None:
        return Upfront(result, base, k, None)
    alt = TrainJob.model_validate({**base.model_dump(), **change})
    flops = get_profile(spec, alt, alt.seq, "the pass before training").flops(1, alt.seq)
    share = flops["forward"] / max(sum(flops.values()), 1.0)
    k_alt = k.model_copy(update={"tokens": k.tokens + per_epoch * share})
    try:
        other = search(spec, alt, offers, k_alt)
    except Infeasible:
        return Upfront(result, base, k, None)
    mine, theirs = result.recommendation, other.recommendation
    what = ", ".join(f"--{name} {value}" for name, value in change.items())
    pass_note = f"one pass before training priced as {share:.0%} of an epoch of steps"
    if theirs.cost_usd < mine.cost_usd:
        saved = mine.cost_usd - theirs.cost_usd
        saves = f"saves {usd(saved)}" if saved >= 0.01 else "less than a cent cheaper"
        note = (f"{what}: {usd(theirs.cost_usd)} where the step as asked costs "
                f"{usd(mine.cost_usd)} ({saves}): {task.upfront_why(base)}; "
                f"{pass_note}")  # fmt: skip
        return Upfront(other, alt, k_alt, note)
    note = (f"{what} would cost {usd(theirs.cost_usd)}, not less than {usd(mine.cost_usd)} "
            f"({pass_note}): the step kept as asked")  # fmt: skip
    return Upfront(result, base, k, note)
