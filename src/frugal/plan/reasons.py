"""Why a plan: the one-line reasons the recommended plan carries (fit, nodes, speed, the
techniques turned on, the ranking, spot, the frontier), and the closest miss when nothing
meets the constraints."""

from __future__ import annotations

from frugal.formats import duration_h
from frugal.plan.constraints import Constraints, node_network
from frugal.plan.plans import Plan, Rejected


def give_reasons(
    best: Plan,
    feasible: list[Plan],
    frontier: list[Plan],
    k: Constraints,
    launch: str | None = None,
) -> None:
    """Give the recommended plan its reasons, in the order a reader asks: does it fit, how
    fast (`launch`: where the host's dispatch bounds its step, or would at a smaller
    micro-batch: `Fitter.launch_note`), what the plan turned on, the data, why this one,
    spot, the frontier."""
    best.reasons += [
        *_set_up(best, k),
        *([launch] if launch else []),
        *_techniques(best),
        *_data(best, feasible, k),
        *_ranking(best, feasible, k),
        *_spot(best, feasible),
        *_frontier(best, frontier),
    ]


def _set_up(best: Plan, k: Constraints) -> list[str]:
    j = best.job
    out = [
        f"fits: {best.device_total_gib:.1f} of {best.offer.gpu.usable_gib:.1f} GiB per GPU "
        f"at micro-batch {j.batch} x {j.seq} tokens"
        + (" with gradient checkpointing" if j.grad_checkpointing else "")
        + (f", {j.sharding} over {j.gpus} GPUs" if j.gpus > 1 else "")
    ]
    if best.nodes > 1:
        gb_s, whose = node_network(best.offer, k)
        share = best.speed.parts_s.get("comm_exposed", 0.0) / best.speed.step_time_s
        out.append(
            f"{best.nodes} nodes of {best.offer.gpus} GPUs, {gb_s * 8:,.0f} Gbit/s between "
            f"nodes ({whose}): the exchange not hidden behind compute is {share:.0%} of the "
            f"step; frugal train joins the nodes into one job (--emit skypilot, slurm or "
            "torchrun launches it)"
        )
    sp = best.speed
    lo, hi = sp.tokens_per_s_range
    (h_lo, h_hi), (c_lo, c_hi) = best.hours_range, best.cost_range
    out.append(
        f"{sp.tokens_per_s:,.0f} tokens/s ({sp.bound}-bound, {sp.efficiency:.0%} of peak; "
        f"{lo:,.0f}-{hi:,.0f} on the hosts and errors seen): {best.hours:.2f} h "
        f"({h_lo:.2f}-{h_hi:.2f}) including {best.setup_h * 60:.0f} min setup, "
        f"${best.cost_usd:,.2f} (${c_lo:,.2f}-{c_hi:,.2f})"
    )
    return out


def _techniques(best: Plan) -> list[str]:
    """The memory techniques of the step the plan uses, each with its cost, and why the
    plan turned it on where it did."""
    j, out = best.job, []

    def turned_on(technique: str) -> str:
        why = best.why_on.get(technique)
        return f"; the plan turned it on: {why}" if why else ""

    if j.loss_chunks:
        out.append(
            f"loss in {j.loss_chunks} chunks of tokens (--loss-chunks): the logits are never "
            "whole, for one more LM-head matmul in backward" + turned_on("loss_chunks")
        )
    if j.offload_activations:
        cost = best.speed.parts_s.get("offload", 0.0) / best.speed.step_time_s
        out.append(
            f"layer inputs offloaded to host memory (--offload-activations): "
            f"{best.host_offload_gib:.1f} GiB pinned per GPU, {cost:.1%} of the step in copies"
            + turned_on("offload_activations")
        )
    if j.optimizer_in_backward:
        out.append(
            "optimizer in backward (--optimizer-in-backward): each weight updated as its "
            "gradient completes, so the step never holds all the gradients (the trainable "
            "weights' size), at no cost in time; no clipping (max_grad_norm 0), no accumulation"
            + turned_on("optimizer_in_backward")
        )
    if best.why_on.get("optimizer"):
        out.append(
            f"AdamW's states in 8 bits (--optimizers {j.optimizer}): a quarter of their bytes"
            + turned_on("optimizer")
        )
    return out


def _data(best: Plan, feasible: list[Plan], k: Constraints) -> list[str]:
    if k.data == "local" and not k.data_gb:
        return []
    why = data_reason(best, feasible)
    return [f"data: {best.data_note}", *([why] if why else [])]


def _ranking(best: Plan, feasible: list[Plan], k: Constraints) -> list[str]:
    """Why this plan among the feasible ones, by the objective."""
    if k.objective != "cost":
        return [f"fastest of {len(feasible)} feasible plans"]
    if k.value_of_time_usd_h:
        return _time_valued(best, feasible, k.value_of_time_usd_h)
    others = [p for p in feasible if p.label() != best.label()]
    if not others:
        return []
    nxt = others[0]
    return [
        f"cheapest of {len(feasible)} feasible plans; next: {nxt.label()} at "
        f"${nxt.cost_usd:,.2f} ({_more(nxt.cost_usd, best.cost_usd)})"
    ]


def _spot(best: Plan, feasible: list[Plan]) -> list[str]:
    out = []
    if best.spot:
        same_od = [p for p in feasible if p.offer is best.offer and not p.spot]
        saving = (
            f"; saves ${same_od[0].cost_usd - best.cost_usd:,.2f} vs on-demand" if same_od else ""
        )
        out.append(
            f"spot: {best.interruptions:.2f} expected interruptions (one every "
            f"{best.mtbi_h:.1f} h: {best.mtbi_from}), checkpoint every "
            f"{best.checkpoint_interval_min:.0f} min (Young/Daly){saving}"
        )
        if best.fallback and best.fallback.spot_share < 1:
            out.append(
                f"deadline at risk on spot alone: switch to on-demand after "
                f"{best.fallback.switch_at_h:.1f} h "
                f"({best.fallback.spot_share:.0%} of the work on spot)"
            )
    if best.offer.gpu.bf16 is False and best.job.precision == "fp16-mixed":
        out.append(f"{best.offer.gpu.name} has no bf16: fp16-mixed with loss scaling")
    return out


def _frontier(best: Plan, frontier: list[Plan]) -> list[str]:
    if best not in frontier or len(frontier) < 2:
        return []
    fastest = min(frontier, key=lambda p: p.hours)
    return [
        f"fastest on the frontier: {fastest.label()} {duration_h(fastest.hours)} for "
        f"${fastest.cost_usd:,.2f}"
    ]


def data_reason(best: Plan, others: list[Plan]) -> str | None:
    """When the offer beside the data beats cheaper compute elsewhere: both sides' dollars."""
    dry = min(others, key=lambda p: (p.cost_usd - p.egress_usd, p.hours))
    if dry.offer == best.offer or dry.egress_usd <= best.egress_usd:
        return None
    saved = best.cost_usd - best.egress_usd - (dry.cost_usd - dry.egress_usd)
    return (
        f"runs where its data is cheaper to reach: {dry.label()} would save ${saved:,.2f} in "
        f"compute but moving it would cost ${dry.egress_usd:,.2f} against "
        f"${best.egress_usd:,.2f} ({dry.data_in.reason or dry.data_out.reason})"
    )


def _more(a: float, b: float) -> str:
    """a against b as a percentage ("+12%"), or in dollars when b is free."""
    return f"{a / b - 1:+.0%}" if b > 0 else f"+${a - b:,.2f}"


def _time_valued(best: Plan, feasible: list[Plan], usd_h: float) -> list[str]:
    """Why the plan wins once each hour of waiting costs `usd_h`: its weighed cost, the
    next best, and (when it is not the cheapest in dollars) what the cheapest would have
    cost in time."""
    rate = f"${usd_h:,.2f}".removesuffix(".00")
    out = [
        f"lowest weighed cost of {len(feasible)} feasible plans with time at {rate}/h: "
        f"${best.cost_usd:,.2f} + {best.hours:.2f} h x {rate} = ${best.weighed_cost_usd:,.2f}"
    ]
    others = [p for p in feasible if p.label() != best.label()]
    if others:
        nxt = others[0]
        out[0] += (
            f"; next: {nxt.label()} at ${nxt.weighed_cost_usd:,.2f} "
            f"({_more(nxt.weighed_cost_usd, best.weighed_cost_usd)})"
        )
    cheap = min(feasible, key=lambda p: (p.cost_usd, p.hours))
    if cheap.cost_usd < best.cost_usd - 0.005:  # then it takes longer: it weighs more
        saved_h = cheap.hours - best.hours
        out.append(
            f"time value changed the choice: the cheapest in dollars, {cheap.label()}, costs "
            f"${cheap.cost_usd:,.2f} but takes {cheap.hours:.1f} h "
            f"(${cheap.weighed_cost_usd:,.2f} weighed); this plan spends "
            f"${best.cost_usd - cheap.cost_usd:,.2f} more to finish {saved_h:.1f} h sooner, "
            f"worth ${saved_h * usd_h:,.2f} at {rate}/h"
        )
    return out


def closest_miss(plans: list[Plan], rejected: list[Rejected], k: Constraints) -> str:
    """What came nearest to a plan, and by how much (frugal.plan.relax says what to change)."""
    if not plans:
        fits = [r for r in rejected if r.kind == "fit" and r.need_gib and r.have_gib]
        never = next((r for r in rejected if r.kind == "spot"), None)
        if never is not None:
            return f"nothing finishes: {never.label} fits but {never.why}"
        if not fits:
            reasons = sorted({r.why for r in rejected}) or ["no offers"]
            return f"nothing can run: {reasons[0]}"
        near = min(fits, key=lambda r: (r.need_gib or 0) - (r.have_gib or 0))
        return (
            f"nothing fits: the closest, {near.label}, needs {near.need_gib:.1f} GiB per GPU "
            f"at micro-batch {near.need_batch} and has {near.have_gib:.1f} usable with the margin"
        )
    fastest = min(plans, key=lambda p: p.hours)
    if k.deadline_h is not None and fastest.hours > k.deadline_h:
        return (
            f"no plan meets the {k.deadline_h:.3g} h deadline: the fastest ({fastest.label()}) "
            f"takes {fastest.hours:.1f} h"
        )
    in_time = [p for p in plans if k.deadline_h is None or p.hours <= k.deadline_h]
    c = min(in_time or plans, key=lambda p: p.cost_usd)
    return (
        f"no plan fits the ${k.budget_usd or 0:,.2f} budget: the cheapest"
        f"{' in time' if k.deadline_h else ''} ({c.label()}) costs ${c.cost_usd:,.2f}"
    )
