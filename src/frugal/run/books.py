"""A run on the books: checked before any work, started, a heartbeat every minute or so, ended;
the budgets in its scope; and the idle watchdog.

- `preflight` (before the model is loaded): the run's tags (a required one missing is
  refused, naming the flag), and the guardrail: a plan estimate that would cross a budget's
  remainder is refused, or only warned about under `--force`.
- `RunBooks` records the run's start (its config, tags, offer, the hourly price at launch,
  the plan it came from, the prediction), a heartbeat every `training.heartbeat_min` (step,
  tokens, dollars so far) and its end (outcome, hours, tokens, dollars, peak memory,
  tokens/s, best evaluation, beside the prediction). Records go through a `Recorder`: when
  the ledger is down they wait in a spool file in the run's directory and follow later.
  At each heartbeat the budgets' thresholds are checked (alerts to the console, a webhook,
  e-mail) and the run reserves of each stop budget what it will spend until the next one
  (`frugal.ledger.budgets.reserve`).
- `Watchdog`: no step, evaluation or checkpoint for `training.idle_stop_min` asks the loop
  to stop (it checkpoints and reports); a loop that does not come back within as long again
  is hung: the run is ended as idle-stopped on the books and the process exits resumable
  from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frugal.config import RunConfig
from frugal.data.labels import headline
from frugal.errors import RESUMABLE_EXIT, FrugalError
from frugal.files import write_text_atomic
from frugal.hardware.gpus import lookup_gpu
from frugal.ledger.budgets import check_alerts, guardrail, reserve
from frugal.ledger.notify import announce
from frugal.ledger.schema import RunRecord
from frugal.ledger.spool import SPOOL_NAME, Recorder, attempt
from frugal.ledger.store import Ledger, aware, now
from frugal.ledger.tags import resolve
from frugal.run.predict import Prediction
from frugal.run.summary import RunSummary

ID_FILE = "ledger.json"  # the run's id on the books, kept beside its checkpoints


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


@dataclass
class Preflight:
    tags: dict[str, str]
    warnings: list[str] = field(default_factory=list)


def preflight(
    cfg: RunConfig,
    tag_flags: list[str],
    force: bool = False,
    out: Path | None = None,
    dry_run: bool = False,
) -> Preflight:
    """Before any work: the run's tags and the budgets its estimate must fit. The estimate
    of a run that was on the books before (in `out`) is what is left of it; a dry run is
    checked only against stop budgets already spent."""
    tags = resolve(tag_flags, config=cfg.tags, model=cfg.model)
    estimate = cfg.plan.est_cost_usd if cfg.plan and not dry_run else None
    known = _known_id(out) if out is not None else None

    def check(led: Ledger) -> list[str]:
        left = estimate
        if left is not None and known and (rec := led.run(known)) is not None:
            left = max(0.0, left - rec.cost_usd)  # its earlier sessions are in the spend
        return guardrail(led, tags, left)

    over, down = attempt(check)
    if down:
        return Preflight(tags, [f"budgets not checked (ledger unreachable: {down})"])
    if over and not force:
        raise FrugalError(
            f"{'; '.join(over)}: raise the budget (frugal budget set), plan a cheaper run, "
            "or start anyway with --force"
        )
    return Preflight(tags, [f"over budget, started under --force: {w}" for w in over or []])


@dataclass
class Cap:
    """What a stop budget lets the run spend, counted on the run's own meter."""

    usd: float  # the run's dollars its reservation reaches: there it asks again
    limit_usd: float  # the run's dollars at which it must have stopped (the budget's rest)
    budget: str


class RunBooks:
    def __init__(
        self,
        cfg: RunConfig,
        tags: dict[str, str],
        out: Path,
        dry_run: bool,
        say: Callable[[str], None],
        url: str | None = None,
    ) -> None:
        self.cfg, self.tags, self.out, self.dry_run, self.say = cfg, tags, out, dry_run, say
        self.recorder = Recorder(out / SPOOL_NAME, url)
        self.interval_s = 60 * (cfg.training.heartbeat_min or 1.0)
        self.run_id = ""
        self.last_beat = -float("inf")
        self.cap: Cap | None = None
        self.beat_s: deque[float] = deque([0.0], maxlen=5)  # how long the last heartbeats took
        self.warned_down = False
        self.started_at = now()  # where its dollars count (a resumed run's first start)
        self.lock = threading.Lock()  # the loop and the money guard ask one at a time

    # -- start ---------------------------------------------------------------------------------

    def start(self, prediction: Prediction, device: str | None) -> tuple[float, float]:
        """Put the run on the books; a run whose directory was on the books before (resumed,
        or restarted before its first checkpoint) carries on its record. Returns the dollars
        and hours the books already hold for it: its earlier sessions, work lost after the
        last checkpoint included."""
        self.out.mkdir(parents=True, exist_ok=True)
        known = _known_id(self.out)
        self.run_id = known or str(uuid.uuid4())
        id_file = self.out / ID_FILE
        write_text_atomic(id_file, json.dumps({"run_id": self.run_id}))
        cfg, plan = self.cfg, self.cfg.plan
        gpu = plan.gpu if plan else _catalog_name(device)
        self.recorder.send(
            "start_run",
            run_id=self.run_id,
            model=cfg.model,
            method=cfg.job.method,
            config=cfg.model_dump(mode="json"),
            price_per_hour_usd=cfg.hourly_usd,
            provider=plan.provider if plan else "local",
            instance=plan.instance if plan else "",
            region=plan.region if plan else "",
            gpu=gpu,
            gpus=cfg.job.gpus,
            spot=plan.spot if plan else False,
            plan_id=plan.ledger_id if plan else None,
            dry_run=self.dry_run,
            predicted=prediction.model_dump(),
            tags=self.tags,
            resource_id=os.environ.get("FRUGAL_RESOURCE_ID") or socket.gethostname(),
            output_dir=str(self.out.resolve()),
        )
        before = (0.0, 0.0)
        if known:
            self.recorder.send("resume_run", run_id=self.run_id)
            rec, _ = attempt(lambda led: led.run(self.run_id))
            if isinstance(rec, RunRecord):
                before = (rec.cost_usd, _hours(rec))
                self.started_at = aware(rec.started_at)
        self._note_down()
        return before

    # -- heartbeats ----------------------------------------------------------------------------

    @property
    def ask_s(self) -> float:
        """How long asking the books takes (the slowest of the last heartbeats): the run
        spends while it asks, so it asks before its reservation runs out by that much."""
        return max(self.beat_s)

    def due(self, now: float, reach_usd: float = 0.0) -> bool:
        """A heartbeat is due every interval, and sooner when the run's work until its next
        check and asking the books again, to `reach_usd` on its meter, would go past what
        it has reserved of a stop budget (its steps are slower than its heartbeats
        planned): while the ledger is down it cannot reserve more, and spends up to what
        the budget had left."""
        if now - self.last_beat >= self.interval_s:
            return True
        return self.cap is not None and reach_usd > self.cap.usd and self.recorder.down is None

    def beat(
        self,
        now: float,
        step: int,
        tokens: float,
        spent_usd: float,
        total_steps: int | None = None,
        lag_s: float = 0.0,
        usd_per_s: float = 0.0,
    ) -> None:
        """Record progress; check the budgets' alerts, and reserve of each stop budget what
        the run spends, at `usd_per_s`, until the next heartbeat, due in an interval or
        after the `lag_s` of work under way then, and while it asks again."""
        with self.lock:
            self.last_beat, t0 = now, time.monotonic()
            try:
                self._beat(step, tokens, spent_usd, total_steps, lag_s, usd_per_s)
            finally:
                self.beat_s.append(time.monotonic() - t0)

    def _beat(
        self,
        step: int,
        tokens: float,
        spent_usd: float,
        total_steps: int | None,
        lag_s: float,
        usd_per_s: float,
    ) -> None:
        on_books = self.recorder.send(
            "heartbeat",
            run_id=self.run_id,
            step=step,
            tokens=tokens,
            cost_usd=spent_usd,
            total_steps=total_steps,
        )
        if not on_books:
            self._note_down()
            return  # the budgets cannot be read: the run's own budget guard still holds
        self._alerts()
        # what the run will have spent once this heartbeat is done (what it reserved last
        # time covers that), and what it spends until it has asked again
        spent_usd += usd_per_s * self.ask_s
        want = usd_per_s * (self.interval_s + lag_s + self.ask_s)
        got, down = attempt(
            lambda led: reserve(led, self.run_id, self.tags, spent_usd, want, self.interval_s)
        )
        if down is None:  # a failed read keeps the last cap: it never lifts a stop budget
            self.cap = None
            if got is not None:
                self.cap = Cap(spent_usd + got.usd, spent_usd + got.left_usd, got.budget)

    def _alerts(self) -> None:
        fired, _ = attempt(lambda led: check_alerts(led, self.tags, self.started_at))
        announce(fired or [], self.say)

    # -- end -----------------------------------------------------------------------------------

    def end(self, s: RunSummary) -> None:
        a = s.actual
        extra = {
            "best_eval_loss": s.best_eval_loss,
            "best_step": s.best_step,
            **headline(s.best_metrics),
            "steps": s.steps,
            "total_steps": s.total_steps,
            "micro_batch": s.micro_batch,
            "grad_accum": s.grad_accum,
            "reason": s.reason,
        }
        self.recorder.send(
            "end_run",
            run_id=self.run_id,
            outcome=s.outcome,
            actual=a.model_dump() | extra,
            predicted=s.predicted.model_dump(),
            step=s.steps,
            tokens=float(a.tokens),
            cost_usd=a.cost_usd,
            hours=a.hours,
        )
        self._finish_note()

    def end_failed(
        self, outcome: str, reason: str, spent_usd: float, hours: float, step: int, tokens: float
    ) -> None:
        """A run that stopped on an error (or hung, or stalled past its money) is ended on
        the books as such."""
        if not self.run_id:
            return
        with self.lock:
            self.recorder.send(
                "end_run",
                run_id=self.run_id,
                outcome=outcome,
                actual={"hours": hours, "cost_usd": spent_usd, "reason": reason},
                step=step,
                tokens=tokens,
                cost_usd=spent_usd,
                hours=hours,
            )
        self._finish_note()

    def _finish_note(self) -> None:
        if self.recorder.down is None:
            self._alerts()
            return
        self.say(
            f"[yellow]ledger unreachable[/] ({self.recorder.down}): "
            f"{self.recorder.pending()} records wait in {self.recorder.spool}; they are sent "
            f"by the next run in {self.out} or by `frugal costs sync {self.out}`"
        )

    def _note_down(self) -> None:
        if self.recorder.down and not self.warned_down:
            self.warned_down = True
            self.say(
                f"[yellow]ledger unreachable[/] ({self.recorder.down}): training goes on; "
                f"its records wait in {self.recorder.spool}"
            )


def _known_id(out: Path) -> str | None:
    """The id on the books of the run in `out`, if it was on them before."""
    id_file = out / ID_FILE
    try:
        return str(json.loads(id_file.read_text())["run_id"]) if id_file.exists() else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable: the run goes on the books afresh


def _hours(rec: RunRecord) -> float:
    """A run's hours on the books: its end's, or up to its last heartbeat."""
    if rec.hours:
        return rec.hours
    return max(0.0, (rec.heartbeat_at - rec.started_at).total_seconds() / 3600)


def _catalog_name(device: str | None) -> str:
    if device is None:
        return "cpu"
    gpu = lookup_gpu(device)
    return gpu.name if gpu else device


class Watchdog:
    """Watches the loop's steps: one running for `idle_s` asks the loop to stop (with a
    checkpoint) once it returns; one not returning within twice that is a hang, ended on
    the books and by exiting resumable. A session's first step warms up (kernels,
    allocator, compilation): it has twice as long. Evaluations, checkpoints and the final
    export are not watched."""

    def __init__(self, idle_s: float, on_hung: Callable[[], None]) -> None:
        self.idle_s, self.on_hung = idle_s, on_hung
        self.last = time.monotonic()
        self.watching = False
        self.warm = False  # the first step is done
        self.idle = False  # read by the loop's `decide`
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="frugal-idle", daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()

    def watch(self, on: bool) -> None:
        """Watch what the loop does next (a step), or not (anything else)."""
        self.last, self.watching = time.monotonic(), on

    def touch(self) -> None:
        if self.watching:
            self.warm = True
        self.last = time.monotonic()

    def _watch(self) -> None:
        poll = min(5.0, self.idle_s / 4)
        while not self._done.wait(poll):
            if not self.watching:
                continue
            quiet = (time.monotonic() - self.last) / (1 if self.warm else 2)
            if quiet >= 2 * self.idle_s:
                self.on_hung()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(RESUMABLE_EXIT)
            if quiet >= self.idle_s:
                self.idle = True
