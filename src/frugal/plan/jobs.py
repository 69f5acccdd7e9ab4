"""`frugal plan --jobs JOBS.yaml`: many fine-tunes, one bill.

Every rented VM pays its boot, the model's download and the data's upload before the first
step; a sweep of small jobs rented one VM each pays that once per job. Here jobs share VMs:

1. Each job is planned alone on every single-machine offer (`search`, no deadline): its
   training hours there, on-demand and on spot (interruptions priced in), and what moving
   its data costs (`transfer`: the dataset in, the adapter or checkpoint back).
2. The baseline is one VM per job: each job's cheapest offer that meets its deadline, paying
   boot, download and upload itself.
3. Packing, greedy: for every offer and pricing, the jobs are taken earliest deadline first
   and each goes on the first VM of that offer where it still finishes by its deadline (else
   a new VM), if running it there costs less than its own VM would (a shared VM pays boot
   once, the model's download once per model and a dataset's upload once per dataset). The
   pack saving the most against those jobs' own VMs is kept; the rest are packed again, until
   no pack saves anything. A VM runs its jobs one after another in deadline order.
4. Timing (spot, with `--price-history`): each spot VM may start later, within the slack of
   the tightest job on it, in the window its price history makes cheapest (`timing`); a job
   that cannot wait is never delayed. Without a history, the plan says timing needs one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from frugal.hardware.offers import Offer
from frugal.plan.plans import Plan
from frugal.plan.timing import PricePoint, Window, best_start
from frugal.plan.transfer import Move

SWITCH_H = 2 / 60  # between two jobs on one VM: a new process loads the model from local disk
NO_DEADLINE_WAIT_H = 24.0  # how long a spot VM of jobs without deadlines may wait for a window
MIN_SAVING = 0.05  # a VM waits for a window only when that saves at least 5% of its cost


def offer_key(o: Offer) -> tuple[str, str, str]:
    return (o.provider, o.instance, o.region)


@dataclass(frozen=True)
class JobQuote:
    """One job planned on one offer and pricing: what a VM running it pays for it."""

    job: str  # the job's name
    model: str
    dataset: str  # a key: the same dataset is uploaded once per VM
    deadline_h: float | None
    plan: Plan  # the job alone on this offer (its setup and its data's moves included)

    @property
    def train_h(self) -> float:
        """Hours of training on this VM: on spot, with its expected interruptions."""
        return self.plan.hours - self.plan.setup_h

    @property
    def data_in(self) -> Move:
        return self.plan.data_in

    @property
    def data_out(self) -> Move:
        return self.plan.data_out

    @property
    def download_h(self) -> float:
        return max(self.plan.setup_h - boot_h(self.plan.offer) - self.data_in.hours, 0.0)

    @property
    def price_h(self) -> float:
        return self.plan.price_per_hour

    def alone_usd(self) -> float:
        """The job on a VM of its own: boot, download, upload, training, storage, data."""
        return self.plan.cost_usd


def boot_h(o: Offer) -> float:
    return 0.0 if o.provider == "local" else o.terms.boot_min / 60


@dataclass
class VM:
    offer: Offer
    spot: bool
    runs: list[JobQuote] = field(default_factory=list)
    start_h: float = 0.0  # hours from now it starts (a price window)
    window: Window | None = None

    def timeline(self, runs: list[JobQuote] | None = None) -> list[tuple[float, float]]:
        """(start, end) hours from now of each run, in order, setup paid once per model and
        per dataset."""
        t = self.start_h + boot_h(self.offer)
        models: set[str] = set()
        data: set[str] = set()
        out = []
        for i, r in enumerate(runs if runs is not None else self.runs):
            begin = t
            if r.model not in models:
                t += r.download_h
                models.add(r.model)
            if r.dataset not in data:
                t += r.data_in.hours
                data.add(r.dataset)
            t += r.train_h + (SWITCH_H if i else 0.0)
            out.append((begin, t))
        return out

    @property
    def hours(self) -> float:
        """Hours the VM is rented: from its boot to its last job's end."""
        ends = self.timeline()
        return ends[-1][1] - self.start_h if ends else 0.0

    @property
    def nodes(self) -> int:
        """Machines of the offer the VM's runs span (the same for all: see `pack`)."""
        return self.runs[0].plan.nodes if self.runs else 1

    def fits(self, run: JobQuote) -> bool:
        """Whether every job, `run` added last, still ends by its deadline."""
        ends = self.timeline([*self.runs, run])
        return all(
            r.deadline_h is None or end <= r.deadline_h + 1e-9
            for r, (_, end) in zip([*self.runs, run], ends, strict=True)
        )

    def marginal_usd(self, run: JobQuote) -> float:
        """What adding `run` last adds to the bill."""
        before = self.usd(self.runs)
        return self.usd([*self.runs, run]) - before

    def usd(self, runs: list[JobQuote] | None = None) -> float:
        """The VM's bill (`runs`: as if it ran those instead, at the catalog price)."""
        priced = runs is None
        runs = self.runs if runs is None else runs
        if not runs:
            return 0.0
        hours = self.timeline(runs)[-1][1] - self.start_h
        seen: set[str] = set()
        data = 0.0
        for r in runs:
            if r.dataset not in seen:
                data += r.data_in.usd
                seen.add(r.dataset)
            data += r.data_out.usd + r.plan.storage_usd
        compute = hours * runs[0].price_h
        if priced and self.window is not None:  # started in a window: its history's price
            compute = self.window.expected_usd
        return compute + data

    def slack_h(self) -> float:
        """How long the VM could start later and still meet every deadline on it."""
        ends = self.timeline()
        slack = [
            r.deadline_h - end
            for r, (_, end) in zip(self.runs, ends, strict=True)
            if r.deadline_h is not None
        ]
        return max(min(slack), 0.0) if slack else NO_DEADLINE_WAIT_H

    def to_json(self) -> dict[str, Any]:
        ends = self.timeline()
        return {
            "provider": self.offer.provider,
            "instance": self.offer.instance,
            "region": self.offer.region,
            "gpu": self.offer.gpu.name,
            "gpus": self.offer.gpus,
            "nodes": self.nodes,
            "spot": self.spot,
            "price_per_hour_usd": round(self.runs[0].price_h, 4),
            "start_h": round(self.start_h, 2),
            "hours": round(self.hours, 3),
            "cost_usd": round(self.usd(), 2),
            "jobs": [
                {
                    "name": r.job,
                    "method": r.plan.job.method,
                    "start_h": round(a, 3),
                    "end_h": round(b, 3),
                    "deadline_h": r.deadline_h,
                    "train_h": round(r.train_h, 3),
                }
                for r, (a, b) in zip(self.runs, ends, strict=True)
            ],
            "price_window": None if self.window is None else self.window.to_json(),
        }


@dataclass
class Packing:
    vms: list[VM]
    alone: dict[str, JobQuote]  # each job's cheapest VM of its own
    notes: list[str]

    @property
    def usd(self) -> float:
        return sum(vm.usd() for vm in self.vms)

    @property
    def alone_usd(self) -> float:
        return sum(r.alone_usd() for r in self.alone.values())


def _cheapest_alone(runs: list[JobQuote]) -> JobQuote | None:
    ok = [r for r in runs if r.deadline_h is None or r.plan.hours <= r.deadline_h]
    return min(ok, key=lambda r: r.alone_usd()) if ok else None


def _pack(runs: list[JobQuote], alone: dict[str, JobQuote]) -> list[VM]:
    """Earliest deadline first, first fit, a job joining only where it costs less than its
    own VM. `runs` are one offer and pricing."""
    vms: list[VM] = []
    order = sorted(runs, key=lambda r: (math.inf if r.deadline_h is None else r.deadline_h, r.job))
    for r in order:
        own = alone[r.job].alone_usd()
        placed = False
        for vm in vms:
            if vm.fits(r) and vm.marginal_usd(r) < own:
                vm.runs.append(r)
                placed = True
                break
        if not placed:
            vm = VM(r.plan.offer, r.plan.spot)
            if vm.fits(r):
                vm.runs.append(r)
                vms.append(vm)
    return vms


def pack(by_job: dict[str, list[JobQuote]]) -> Packing:
    """Jobs onto shared VMs (module doc): `by_job` holds each job's runs on every offer."""
    alone: dict[str, JobQuote] = {}
    for name, runs in by_job.items():
        best = _cheapest_alone(runs)
        if best is not None:
            alone[name] = best
    left = set(alone)
    chosen: list[VM] = []
    while left:
        groups: dict[tuple[Any, ...], list[JobQuote]] = {}
        for name in left:
            for r in by_job[name]:
                # runs share a VM only on as many nodes as each planned
                key = (*offer_key(r.plan.offer), r.plan.spot, r.plan.nodes)
                groups.setdefault(key, []).append(r)
        best_vms, best_saving = None, 1e-9
        for group in groups.values():
            vms = [vm for vm in _pack(group, alone) if len(vm.runs) > 1]
            saving = sum(sum(alone[r.job].alone_usd() for r in vm.runs) - vm.usd() for vm in vms)
            if saving > best_saving:
                best_vms, best_saving = vms, saving
        if best_vms is None:
            break
        chosen.extend(best_vms)
        left -= {r.job for vm in best_vms for r in vm.runs}
    for name in sorted(left):  # nothing to share with: a VM of its own
        r = alone[name]
        chosen.append(VM(r.plan.offer, r.plan.spot, [r]))
    return Packing(chosen, alone, [])


def time_spot(vms: list[VM], history: list[PricePoint] | None, now: datetime) -> list[str]:
    """Start each spot VM in its cheapest window within its slack (module doc, 4)."""
    notes: list[str] = []
    spot = [vm for vm in vms if vm.spot]
    if not spot:
        return notes
    if history is None:
        return [
            "start times: spot VMs start now; choosing a cheaper window needs its price "
            "history (--price-history)"
        ]
    for vm in spot:
        o = vm.offer
        w = best_start(history, o.provider, o.instance, o.region, vm.hours, vm.slack_h(), now)
        if w is None:
            notes.append(f"{o.provider} {o.instance} {o.region}: no price history; starts now")
            continue
        if w.start_h > 0 and w.saving_usd >= MIN_SAVING * w.now_usd:
            vm.start_h, vm.window = w.start_h, w
            notes.append(w.reason)
        elif w.start_h > 0:
            notes.append(
                f"{o.provider} {o.instance} {o.region}: starts now; waiting {w.start_h:g} h would "
                f"save ${w.saving_usd:.2f}, under {MIN_SAVING:.0%} of ${w.now_usd:.2f}"
            )
        else:
            notes.append(w.reason)
    return notes
