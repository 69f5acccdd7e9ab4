"""The plan API: a `PlanRequest` in, a `PlanOutcome` out, through `make_plan`.

It is the one way a fine-tune is planned: `frugal plan`, the dashboard's Plan form and the
tests call it alike. A request's fields are named as `frugal plan`'s options are (so a
form, a JSON body and a command line say the same thing), and hold what a person gives,
with the ranges of the fields they stand for: the step's settings are then checked by
`TrainJob` and what the plan must meet by `Constraints`, each in its one place, with one
line naming the option to fix. The outcome
carries the search's result, its reasons and notes, the prices it used, the id it has on
the books, and its JSON; the run config that trains it and the files a plan can write
come from the outcome too (`files`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from frugal import counts
from frugal.config import DataConfig, RunConfig, Schedule, TrainingConfig
from frugal.data.count import count_tokens
from frugal.data.labels import read_labelled
from frugal.data.pairs import is_kto, read_for
from frugal.errors import FrugalError
from frugal.estimate.core import get_profile
from frugal.estimate.notes import profile_notes
from frugal.files import write_text_atomic
from frugal.hardware.catalog import PriceBasis, finding, price_basis, select_offers
from frugal.hardware.offers import KWH_USD, Offer
from frugal.ledger.tags import parse_tags, resolve
from frugal.models.specs import ModelSpec, load_spec
from frugal.plan.constraints import Constraints, spot_mode
from frugal.plan.emit import (
    hf_script,
    modal_app,
    skypilot_task,
    slurm_script,
    to_run_config,
    torchrun_lines,
)
from frugal.plan.hyper import WHERE, Choice, choose
from frugal.plan.plans import Infeasible, Result
from frugal.plan.plot import write_plot
from frugal.plan.relax import Ask, explain
from frugal.plan.search import search
from frugal.plan.transfer import measure_gb, parse_location
from frugal.plan.upfront import cheaper_upfront
from frugal.step.job import LORA_FIELDS, Task, TrainJob, make_job
from frugal.step.tasks import task_of
from frugal.validation import Listed

if TYPE_CHECKING:  # SQLAlchemy is imported once there is a plan to record
    from frugal.ledger.store import Ledger


def _about(model: type[BaseModel], name: str) -> Any:
    """A request field that is `model.name`, with its default, description and range (a
    request holds what was given; the schema checks the rest: a name, a duration)."""
    f = model.model_fields[name]
    bounds = {
        k: getattr(m, k)
        for m in f.metadata
        for k in ("ge", "gt", "le", "lt")
        if getattr(m, k, None) is not None
    }
    return Field(f.get_default(call_default_factory=True), description=f.description, **bounds)


def _unset(model: type[BaseModel], name: str) -> Any:
    """A request field that is `model.name`, not given: the plan picks (with its range)."""
    f = model.model_fields[name]
    bounds = {
        k: getattr(m, k)
        for m in f.metadata
        for k in ("ge", "gt", "le", "lt")
        if getattr(m, k, None) is not None
    }
    return Field(None, description=f.description, **bounds)


class PlanRequest(BaseModel):
    """What `frugal plan MODEL` is asked, named as its options are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, description="a bundled hub id, a local dir or config.json")
    tokens: float | None = Field(
        None, ge=1, le=counts.MOST, description="training tokens per epoch, e.g. 20M"
    )
    dataset: str | None = Field(None, description="or: a .jsonl/.csv/.parquet file to count")
    epochs: float | None = _unset(DataConfig, "epochs")
    # the step (TrainJob checks them); None: the search tries what fits
    seq: int = _about(TrainJob, "seq")
    task: Task = _about(TrainJob, "task")
    num_labels: int | None = _unset(TrainJob, "num_labels")
    preference: str = _about(TrainJob, "preference")
    teacher: str | None = _about(TrainJob, "teacher")
    reference: str | None = _unset(TrainJob, "reference")  # None: the cheaper (plan/upfront)
    teacher_logits: str | None = _unset(TrainJob, "teacher_logits")  # None: alike
    teacher_top_k: int = _about(TrainJob, "teacher_top_k")
    method: str = _about(TrainJob, "method")
    methods: Listed | None = Field(
        None, min_length=1, description="methods to compare [default: --method]"
    )
    precision: str = _about(TrainJob, "precision")
    optimizers: Listed = _about(Constraints, "optimizers")
    lora_r: int | None = _unset(TrainJob, "lora_r")
    lora_alpha: int | None = _unset(TrainJob, "lora_alpha")
    lora_dropout: float | None = _unset(TrainJob, "lora_dropout")
    lora_targets: str | None = _unset(TrainJob, "lora_targets")
    attention: str = _about(TrainJob, "attention")
    packing: bool = _about(TrainJob, "packing")
    loss: str = _about(TrainJob, "loss")
    loss_chunks: int | None = _unset(TrainJob, "loss_chunks")
    offload_activations: bool | None = _unset(TrainJob, "offload_activations")
    optimizer_in_backward: bool | None = _unset(TrainJob, "optimizer_in_backward")
    # how it learns (None: the plan chooses, with its reason: plan/hyper.py)
    learning_rate: float | None = _unset(TrainingConfig, "learning_rate")
    schedule: Schedule | None = _unset(TrainingConfig, "schedule")
    warmup_ratio: float | None = _unset(TrainingConfig, "warmup_ratio")
    effective_batch: int | None = _unset(Constraints, "effective_batch")
    # what the plan must meet (Constraints checks them)
    budget: float | None = _about(Constraints, "budget_usd")
    deadline: str | float | None = _about(Constraints, "deadline_h")
    max_gpus: int = _about(Constraints, "max_gpus")
    spot: bool | None = Field(None, description="only spot (true), never spot (false), or both")
    spot_mtbi_hours: str | float | None = _about(Constraints, "mtbi_h")
    optimize: str = _about(Constraints, "objective")
    value_of_time: float = _about(Constraints, "value_of_time_usd_h")
    margin: float = _about(Constraints, "margin")
    network_gbps: float | None = _about(Constraints, "network_gbps")
    data: str = _about(Constraints, "data")
    data_gb: float | None = Field(None, description="the dataset's size, GB [default: measured]")
    # the offers
    offers: tuple[str, ...] = Field((), description="offers CSVs that add to the catalog")
    providers: Listed | None = Field(
        None, min_length=1, description="providers to consider [default: all]"
    )
    include_suspicious: bool = Field(
        False,
        description="plan with offers whose price is an error too (zero, spot above "
        "on-demand, a GPU count the instance contradicts)",
    )
    discount: tuple[str, ...] = Field((), description="PROVIDER=PERCENT off, e.g. aws=15")
    local: tuple[str, ...] = Field((), description="your own GPUs, e.g. '2x RTX 4090'")
    kwh_usd: float = Field(KWH_USD, description="electricity price for local GPUs, $/kWh")
    tag: tuple[str, ...] = Field((), description="ledger tags, key=value")

    def job(self, chosen: dict[str, Any] | None = None) -> TrainJob:
        """The step the plan starts from (the first adapter method compared, else the first
        method; the adapters `chosen`), or one line naming the option: every method of
        --methods and optimizer of --optimizers is checked here too."""
        methods = self.methods or (self.method,)
        # the adapters' settings ride on the first adapter method compared (a full job has none)
        lora = {k: v for k, v in (chosen or {}).items() if k in LORA_FIELDS} or {
            "lora_r": self.lora_r,
            "lora_alpha": self.lora_alpha,
            "lora_dropout": self.lora_dropout,
            "lora_targets": self.lora_targets,
        }
        base = make_job(
            task=self.task,
            num_labels=self.num_labels,
            preference=self.preference,
            teacher=self.teacher,
            teacher_logits=self.teacher_logits,
            teacher_top_k=self.teacher_top_k,
            reference=self.reference,
            method=_adapters_first(methods),
            precision=self.precision,
            seq=self.seq,
            attention=self.attention,
            packing=self.packing,
            loss=self.loss,
            loss_chunks=self.loss_chunks,
            offload_activations=self.offload_activations,
            optimizer_in_backward=self.optimizer_in_backward,
            **lora,
        )
        for m in methods:
            make_job(method=m)  # names a bad method in --methods
        for o in self.optimizers:
            make_job(optimizer=o)  # names a bad optimizer in --optimizers
        return base

    def constraints(self, tokens: float, data_gb: float, effective_batch: int) -> Constraints:
        """What the plan must meet, for `tokens` in all, a dataset of `data_gb` and
        `effective_batch` sequences a step."""
        return Constraints.build(
            # a classifier has no logits over the vocabulary to chunk; preference tuning
            # reads them whole
            auto_loss_chunks=self.loss_chunks is None and task_of(self.task).chunked_loss,
            auto_offload=self.offload_activations is None,
            auto_in_backward=self.optimizer_in_backward is None,
            data=self.data,
            data_gb=data_gb,
            tokens=tokens,
            effective_batch=effective_batch,
            budget_usd=self.budget,
            deadline_h=self.deadline,
            max_gpus=self.max_gpus,
            spot=spot_mode(self.spot),
            methods=self.methods or (self.method,),
            optimizers=self.optimizers,
            margin=self.margin,
            mtbi_h=self.spot_mtbi_hours,
            objective=self.optimize,
            value_of_time_usd_h=self.value_of_time,
            network_gbps=self.network_gbps,
        )

    def settings(self, spec: ModelSpec, method: str, tokens_per_epoch: float) -> list[Choice]:
        """The training settings of `method` on this request's data, each with its reason:
        what this request gives is kept as the user's."""
        given = {name: getattr(self, name) for name in WHERE}
        return choose(spec.config, method, self.task, tokens_per_epoch, self.seq, given)

    def select(self, every_provider: bool = False) -> list[Offer]:
        """The offers this request plans with (all providers': what a change would give)."""
        return select_offers(
            self.offers,
            self.discount,
            self.local,
            self.kwh_usd,
            None if every_provider or not self.providers else ",".join(self.providers),
            include_suspicious=self.include_suspicious,
        )


@dataclass
class PlanOutcome:
    """A plan and what came with it: the search's result (recommendation, frontier,
    rejected, reasons, notes), the constraints it met, the prices' basis and its id on the
    books (None when the ledger was unreachable: a note says so)."""

    request: PlanRequest
    spec: ModelSpec
    k: Constraints
    result: Result
    basis: PriceBasis
    tokens_per_epoch: float
    tags: dict[str, str]
    settings: list[Choice]  # the recommendation's training settings, with their reasons
    plan_id: int | None = None

    def to_json(self, wrote: dict[str, str] | None = None) -> dict[str, Any]:
        """What `frugal plan --json` prints (and the books keep, less the files written)."""
        r = self.result
        out: dict[str, Any] = {
            "model": self.spec.id,
            "tokens": self.k.tokens,
            "recommendation": r.recommendation.to_json(),
            "frontier": [p.to_json() for p in r.frontier],
            "rejected": [x.to_json() for x in r.rejected],
            "feasible_plans": len(r.plans),
            "settings": [c.to_json() for c in self.settings],
            "notes": r.notes,
            "prices": self.basis.to_json(),
        }
        keys = {
            "run config": "wrote",
            "hf": "wrote_hf",
            "skypilot": "wrote_skypilot",
            "modal": "wrote_modal",
        }
        out.update({keys.get(what, f"wrote_{what}"): p for what, p in (wrote or {}).items()})
        return out

    def run_config(self) -> RunConfig:
        """The run config that trains the recommendation (`frugal train` reads it)."""
        q = self.request
        epochs = self.k.tokens / self.tokens_per_epoch if self.tokens_per_epoch else 1.0
        cfg = to_run_config(
            self.spec.id,
            self.result.recommendation,
            self.k,
            q.dataset,
            self.tokens_per_epoch,
            epochs,
            self.settings,
        )
        cfg.tags = parse_tags(q.tag)  # what was asked for; defaults apply when it runs
        if cfg.plan:
            cfg.plan.ledger_id = self.plan_id
        return cfg


def make_plan(request: PlanRequest, books: Ledger | None = None) -> PlanOutcome:
    """The cheapest (or fastest) plan for `request` that fits and meets its deadline,
    recorded on `books` (default: frugal's ledger; a ledger that cannot be reached leaves a
    note, not an error). Bad input, or no plan at all, is one line (FrugalError): for no
    plan, what came nearest and which changes would give one."""
    q = request
    if (q.tokens is None) == (q.dataset is None):
        raise FrugalError("give the amount of training: --tokens N or --dataset FILE")
    resolve(q.tag, required=False)  # a bad --tag fails before the search
    base = q.job()
    spec = load_spec(q.model)
    notes: list[str] = []
    if q.dataset:  # read as the task's run reads it
        q, per_epoch, counted = DATASETS[q.task](q)
        notes.append(counted)
    else:
        per_epoch = q.tokens or 0.0
    if spec.max_positions and q.seq > spec.max_positions:
        notes.append(f"--seq {q.seq} is beyond {spec.id}'s {spec.max_positions} positions")
    try:
        parse_location(q.data)  # a bad --data fails before the search
    except FrugalError as e:
        raise FrugalError(f"--data: {e}") from None
    data_gb = q.data_gb if q.data_gb is not None else (measure_gb(q.dataset) if q.dataset else 0)
    # what shapes the step (adapters, batch, epochs) is the same for every method compared
    methods = q.methods or (q.method,)
    shape = {c.name: c.value for c in q.settings(spec, _adapters_first(methods), per_epoch)}
    base = q.job(shape)
    k = q.constraints(per_epoch * shape["epochs"], data_gb, shape["effective_batch"])
    offers = q.select()
    try:
        result = search(spec, base, offers, k)
    except Infeasible as e:  # say what came nearest and which changes would give a plan
        every = q.select(every_provider=True) if q.providers else None
        raise FrugalError(explain(e, Ask(spec, base, offers, k), every)) from None
    moved = task_of(base.task).upfront(base) or {}
    if all(getattr(q, name) is None for name in moved):  # not asked: the step as it is, or
        # with its work moved before training, the cheaper
        up = cheaper_upfront(spec, base, offers, k, per_epoch, result)
        result, k = up.result, up.k
        notes += [up.note] if up.note else []
    best = result.recommendation.job
    if note := task_of(best.task).note(best, spec.vocab_size):  # of the step chosen
        notes.append(note)
    notes += profile_notes(spec, best, get_profile(spec, best, best.seq, "the plan's notes"))
    chosen = result.recommendation.offer
    if why := finding(chosen):  # a price far from its peers': kept, and said
        notes.append(
            f"price finding: {chosen.provider} {chosen.instance} in {chosen.region}: {why}; "
            "a marketplace's real price or a listing error: check it before you rent"
        )
    result.notes[:0] = notes
    tags = resolve(q.tag, model=spec.id, required=False)
    settings = q.settings(spec, result.recommendation.job.method, per_epoch)
    basis = price_basis(offers, q.offers)
    out = PlanOutcome(q, spec, k, result, basis, per_epoch, tags, settings)
    _record(out, books)
    return out


def _token_data(q: PlanRequest) -> tuple[PlanRequest, float, str]:
    """A causal LM's dataset: the tokens of an epoch as the run reads them (rows cut to
    --seq), and a note saying how they were counted."""
    assert q.dataset
    tc = count_tokens(q.dataset, q.model, q.seq)
    return q, float(tc.tokens), tc.note(q.dataset, q.seq)


def _classifier_data(q: PlanRequest) -> tuple[PlanRequest, float, str]:
    """A classifier's dataset: the request with its classes counted (unless given), the
    tokens of an epoch as the step computes them, and a note saying how."""
    assert q.dataset
    rows, classes = read_labelled(q.dataset)
    if q.num_labels is None:
        q = q.model_copy(update={"num_labels": len(classes.names)})
    elif q.num_labels < len(classes.names):
        raise FrugalError(
            f"--num-labels {q.num_labels}: {q.dataset} has {len(classes.names)} classes: "
            f"give {len(classes.names)} or more, or drop --num-labels"
        )
    note = (
        f"{q.dataset}: {len(rows):,} rows of {len(classes.names)} classes; a classifier pads "
        f"each row to its micro-batch's longest, priced as --seq {q.seq:,} tokens a row"
    )
    return q, float(len(rows) * q.seq), note


def _preference_data(q: PlanRequest) -> tuple[PlanRequest, float, str]:
    """Preference rows: an epoch's rows at --seq tokens each (the step's two sequences of
    a row are padded to its micro-batch's longest), and a note saying how."""
    assert q.dataset
    rows = read_for(q.dataset, q.preference, "--preference ")
    kind = "KTO rows" if is_kto(rows) else "pairs"
    note = (
        f"{q.dataset}: {len(rows):,} {kind}; each row's two sequences are padded to its "
        f"micro-batch's longest, priced as --seq {q.seq:,} tokens each"
    )
    return q, float(len(rows) * q.seq), note


# each task's dataset: the request (with what the data says), an epoch's tokens, a note
DATASETS: dict[str, Callable[[PlanRequest], tuple[PlanRequest, float, str]]] = {
    "causal": _token_data,
    "classification": _classifier_data,
    "preference": _preference_data,
    "distill": _token_data,
}


def _adapters_first(methods: tuple[str, ...]) -> str:
    """The method whose settings shape the search: an adapter method where one is compared
    (its adapters are the ones the search sizes), else the first."""
    return next((m for m in methods if m != "full"), methods[0])


def _record(out: PlanOutcome, books: Ledger | None) -> None:
    from frugal.ledger.spool import attempt  # SQLAlchemy: only once there is a plan to record

    whole = out.to_json()  # the frontier and the rejected too
    out.plan_id, down = attempt(
        lambda led: led.record_plan(whole, out.spec.id, out.k.tokens, out.tags), books
    )
    if down:
        out.result.notes.append(f"the plan is not on the books (ledger unreachable: {down})")


# the files a plan writes, by kind: what makes each one's text
EMITTERS: dict[str, Callable[[PlanOutcome, RunConfig, dict[str, str]], str]] = {
    "hf": lambda o, cfg, to: hf_script(cfg, o.result.recommendation.speed.step_time_s),
    "skypilot": lambda o, cfg, to: skypilot_task(o.result.recommendation, to["run config"]),
    "modal": lambda o, cfg, to: modal_app(o.result.recommendation, to["run config"]),
    "slurm": lambda o, cfg, to: slurm_script(o.result.recommendation, to["run config"]),
    "torchrun": lambda o, cfg, to: torchrun_lines(
        o.result.recommendation, to["run config"], to["torchrun"]
    ),
}


def files(out: PlanOutcome, targets: dict[str, str]) -> dict[str, str]:
    """Write what `targets` asks ("run config", an emitter's kind, "plot": path), in order;
    each task launches the run config written in this same call. Every text is made before
    any file is written: one that cannot be made (Modal without the plan's GPU) leaves
    nothing half-done."""
    cfg = out.run_config()
    texts = {what: EMITTERS[what](out, cfg, targets) for what in targets if what in EMITTERS}
    for what, path in targets.items():
        if what == "run config":
            cfg.write(path)
        elif what == "plot":
            write_plot(out.result, out.k, path)
        else:
            write_text_atomic(path, texts[what])
    return dict(targets)
