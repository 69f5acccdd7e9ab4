"""Work a task can move out of its steps into one pass over the data before training (a
preference task's reference log-probabilities, `job.reference: precomputed`; a
distillation's teacher logits, `job.teacher_logits: precomputed`): the plan prices both
ways and keeps the cheaper, saying by how much and why.

The pass is the work the step no longer does, once over the data instead of in every step
of every epoch: the simulated step's FLOPs as asked less the step's without it (the
reference's forward, the teacher's). It is priced as that share of an epoch of the lighter
step's work on the same machines, so an epoch of 100 steps whose removed forward is 30% of
the remaining step's FLOPs adds 30 steps' time. A pass that runs another model (a
teacher) holds it beside the trained model's weights: only GPUs that hold both, and the
step's own peak, are searched. What the pass writes (the top-k logits) is disk kept for the
whole run, priced with the rest of its disk.
"""

from __future__ import annotations

from dataclasses import dataclass

from frugal.estimate.core import get_profile, memory_at
from frugal.formats import usd
from frugal.hardware.gpus import GIB, memory_budget
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
    spec: ModelSpec,
    base: TrainJob,
    offers: list[Offer],
    k: Constraints,
    per_epoch: float,
    result: Result,
) -> Upfront:
    """`result` (the plan of `base` under `k`) or, cheaper, the plan of the task's step with
    its pass before training (`Task.upfront`), with a note on both."""
    task = task_of(base.task)
    change = task.upfront(base)
    if change is None:
        return Upfront(result, base, k, None)
    alt = TrainJob.model_validate({**base.model_dump(), **change})
    asked = get_profile(spec, base, base.seq, "the step as asked")
    lighter = get_profile(spec, alt, alt.seq, "the pass before training")
    f_asked, f_alt = (sum(p.flops(1, base.seq).values()) for p in (asked, lighter))
    share = max(f_asked - f_alt, 0.0) / max(f_alt, 1.0)
    passes = task.passes(alt)
    disk_gb = sum(p.disk_bytes(per_epoch) for p in passes) / 1e9
    k_alt = k.model_copy(
        update={"tokens": k.tokens + per_epoch * share, "scratch_gb": k.scratch_gb + disk_gb}
    )
    pass_note = f"one pass before training priced as {share:.0%} of an epoch of steps"
    if disk_gb:
        pass_note += f", its {disk_gb:,.1f} GB on disk through the run"
    if any(p.model is not None for p in passes):  # it holds another model beside the trained one
        held = asked.start_bytes("frozen_weights") - lighter.start_bytes("frozen_weights")
        need = held + memory_at(lighter, alt, 1, alt.seq).device_total
        offers = [o for o in offers if memory_budget(o.gpu.usable_gib, k.margin) >= need]
        pass_note += f", on GPUs of {need / GIB:,.0f} GiB or more, which hold both models"
    try:
        other = search(spec, alt, offers, k_alt)
    except Infeasible:
        return Upfront(result, base, k, None)
    mine, theirs = result.recommendation, other.recommendation
    what = ", ".join(f"--{name.replace('_', '-')} {value}" for name, value in change.items())
    if theirs.cost_usd < mine.cost_usd:
        saved = mine.cost_usd - theirs.cost_usd
        saves = f"saves {usd(saved)}" if saved >= 0.01 else "less than a cent cheaper"
        note = (
            f"{what}: {usd(theirs.cost_usd)} where the step as asked costs "
            f"{usd(mine.cost_usd)} ({saves}): {task.upfront_why(base)}; "
            f"{pass_note}"
        )
        return Upfront(other, alt, k_alt, note)
    note = (
        f"{what} would cost {usd(theirs.cost_usd)}, not less than {usd(mine.cost_usd)} "
        f"({pass_note}): the step kept as asked"
    )
    return Upfront(result, base, k, note)
