"""When no plan is feasible: which changes would give one, each tried before it is offered.

The search says what came nearest (`search.Infeasible`). This module then re-runs the
search with one constraint relaxed at a time and offers a change only when that search
finds a plan, saying what the plan would be. The changes, in the order a user would rather
make them:

* nothing fits the GPUs: the step's memory techniques the command pinned off
  (`--loss-chunks 0`, `--no-offload-activations`, `--no-optimizer-in-backward`), a shorter
  `--seq` (the longest that fits, halving), another `--methods` (QLoRA, then LoRA), a
  memory-lean optimizer for full fine-tuning, more GPUs (`--max-gpus`), every provider
  (`--providers`), and the largest smaller model of the same family (same organisation
  and architecture) that fits;
* no plan meets the deadline: the fastest plan's hours as `--deadline`, more GPUs, every
  provider, LoRA instead of QLoRA;
* no plan meets the budget: the cheapest plan's cost as `--budget`, the cheapest plan's
  hours as `--deadline` when a deadline made it dear, QLoRA, every provider.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from frugal.errors import FrugalError
from frugal.estimate.closed_form import model_params
from frugal.hardware.offers import Offer
from frugal.models.specs import ModelSpec, bundled_model_ids, load_spec
from frugal.plan.constraints import Constraints
from frugal.plan.plans import Infeasible, Plan
from frugal.plan.search import search
from frugal.step.job import TrainJob

MAX_TRIES = 10  # searches one explanation may run (each new method or model simulates)


@dataclass(frozen=True)
class Ask:
    """What the search was asked: the model, its job, the offers and the constraints."""

    spec: ModelSpec
    base: TrainJob
    offers: list[Offer]
    k: Constraints


@dataclass
class Suggestion:
    """A change to the command and the plan it gives. `flags`: option -> its new value,
    None to drop the option, "MODEL" for the model argument."""

    flags: dict[str, str | None]
    plan: Plan

    @property
    def text(self) -> str:
        parts = []
        for k, v in self.flags.items():
            parts.append(
                f"model {v}" if k == "MODEL" else f"without {k}" if v is None else f"{k} {v}"
            )
        return " ".join(parts)

    def gives(self) -> str:
        p = self.plan
        return f"{p.label()}: ${p.cost_usd:,.2f} in {p.hours:.1f} h"


@dataclass
class _Trial:
    flags: dict[str, str | None]
    ask: Ask


def suggest(e: Infeasible, ask: Ask, every_offer: list[Offer] | None = None) -> list[Suggestion]:
    """The changes that make a plan, each with its plan (tried, in the order above)."""
    left = [MAX_TRIES]
    out: list[Suggestion] = []

    def tried(trials: list[_Trial], first_only: bool = False) -> None:
        for t in trials:
            if left[0] <= 0:
                return
            left[0] -= 1
            try:
                r = search(t.ask.spec, t.ask.base, t.ask.offers, t.ask.k)
            except FrugalError:
                continue
            out.append(Suggestion(t.flags, r.recommendation))
            if first_only:
                return

    k = ask.k
    wider = every_offer if every_offer and len(every_offer) > len(ask.offers) else None
    more_gpus = max((o.gpus * 4 for o in (every_offer or ask.offers)), default=0)
    if not e.plans:  # nothing fits
        tried(_unpinned(ask))
        tried(_shorter_seqs(ask), first_only=True)
        tried(
            [
                _Trial({"--methods": m}, _with(ask, methods=(m,)))
                for m in ("qlora", "lora")
                if m not in k.methods and _leaner(m, k.methods)
            ]
        )
        if "full" in k.methods and "paged-adamw-8bit" not in k.optimizers:
            opt = ("paged-adamw-8bit",)
            tried([_Trial({"--optimizers": opt[0]}, _with(ask, optimizers=opt))])
    else:
        fastest = min(e.plans, key=lambda p: p.hours)
        cheapest = min(e.plans, key=lambda p: p.cost_usd)
        if k.deadline_h is not None and fastest.hours > k.deadline_h:
            hours = _up(fastest.hours)
            tried([_Trial({"--deadline": f"{hours:g}h"}, _with(ask, deadline_h=hours))])
            if "lora" not in k.methods:
                tried([_Trial({"--methods": "lora"}, _with(ask, methods=("lora",)))])
        else:
            in_time = [p for p in e.plans if k.deadline_h is None or p.hours <= k.deadline_h]
            c = min(in_time or e.plans, key=lambda p: p.cost_usd)
            usd = math.ceil(c.cost_usd * 100) / 100
            tried([_Trial({"--budget": f"{usd:g}"}, _with(ask, budget_usd=usd))])
            if k.deadline_h is not None and cheapest.cost_usd <= (k.budget_usd or 0):
                hours = _up(cheapest.hours)
                tried([_Trial({"--deadline": f"{hours:g}h"}, _with(ask, deadline_h=hours))])
            if "qlora" not in k.methods:
                tried([_Trial({"--methods": "qlora"}, _with(ask, methods=("qlora",)))])
    if more_gpus > k.max_gpus:
        tried([_Trial({"--max-gpus": str(more_gpus)}, _with(ask, max_gpus=more_gpus))])
    if wider:
        tried([_Trial({"--providers": None}, replace(ask, offers=wider))])
    if not e.plans:
        tried(_smaller_models(ask), first_only=True)
    return out


def explain(e: Infeasible, ask: Ask, every_offer: list[Offer] | None = None) -> str:
    """One line: the closest miss, then each change that makes a plan and what it gives."""
    found = suggest(e, ask, every_offer)
    if not found:
        return (
            f"{e}; no single change tried makes a plan (shorter --seq, other --methods, "
            "more GPUs, more providers, a smaller model)"
        )
    return f"{e}; these would give a plan: " + "; ".join(f"{s.text} ({s.gives()})" for s in found)


def _up(hours: float) -> float:
    return math.ceil(hours * 10) / 10


def _leaner(method: str, current: tuple[str, ...]) -> bool:
    order = {"full": 0, "lora": 1, "qlora": 2}  # less memory to the right
    return order[method] > min(order[m] for m in current)


def _with(ask: Ask, **change: Any) -> Ask:
    """`ask` with some of its constraints changed."""
    return replace(ask, k=ask.k.model_copy(update=change))


def _unpinned(ask: Ask) -> list[_Trial]:
    """The plan's memory techniques, where the command pinned them off."""
    flags: dict[str, str | None] = {}
    change: dict[str, bool] = {}
    if not (ask.k.auto_loss_chunks or ask.base.loss_chunks or ask.spec.soft_caps_logits):
        flags["--loss-chunks"], change["auto_loss_chunks"] = None, True
    if not ask.k.auto_offload and not ask.base.offload_activations:
        flags["--no-offload-activations"], change["auto_offload"] = None, True
    in_backward_helps = "full" in ask.k.methods and not ask.base.optimizer_in_backward
    if not ask.k.auto_in_backward and in_backward_helps:
        flags["--no-optimizer-in-backward"], change["auto_in_backward"] = None, True
    return [_Trial(flags, _with(ask, **change))] if flags else []


def _shorter_seqs(ask: Ask) -> list[_Trial]:
    seqs, s = [], ask.base.seq // 2
    while s >= 128:
        seqs.append(s)
        s //= 2
    return [
        _Trial({"--seq": str(s)}, replace(ask, base=ask.base.model_copy(update={"seq": s})))
        for s in seqs
    ]


def family(spec: ModelSpec) -> Callable[[ModelSpec], bool]:
    """Models of the same family: the same organisation and architecture."""
    org = spec.id.split("/", 1)[0] if "/" in spec.id else None

    def same(other: ModelSpec) -> bool:
        return bool(org) and other.id.startswith(f"{org}/") and other.model_type == spec.model_type

    return same


def _params(spec: ModelSpec) -> int:

    return model_params(spec.config)


def _smaller_models(ask: Ask) -> list[_Trial]:
    same = family(ask.spec)
    size = _params(ask.spec)
    smaller: list[tuple[int, ModelSpec]] = []
    for model_id in bundled_model_ids():
        other = load_spec(model_id)
        if other.id != ask.spec.id and same(other) and (n := _params(other)) < size:
            smaller.append((n, other))
    smaller.sort(key=lambda t: -t[0])  # the largest that fits first
    return [_Trial({"MODEL": s.id}, replace(ask, spec=s)) for _, s in smaller[:3]]
