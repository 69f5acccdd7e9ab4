"""The training loop as four named steps: `decide` what comes next (one check all processes
agree on: a stop signal, no progress, a money or hours limit, the session's time, a
checkpoint or evaluation due), then `step`, `evaluate` or `checkpoint`; `finish` saves,
exports and summarizes."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import torch

from frugal.config import RunConfig
from frugal.data.labels import headline
from frugal.errors import RESUMABLE_EXIT as RESUMABLE_EXIT  # the runner's exit code
from frugal.errors import FrugalError
from frugal.files import write_text_atomic
from frugal.plan.spot import DEFAULT_CHECKPOINT_MIN
from frugal.run import checkpoint as ckpt
from frugal.run.books import Cap, RunBooks, Watchdog
from frugal.run.diagnose import Diagnostics, Finding
from frugal.run.export import export
from frugal.run.interrupt import Stop, orphaned
from frugal.run.meter import CostMeter, Progress, Sinks
from frugal.run.predict import expected_step_s, predict
from frugal.run.state import FindingRecord, TrainState
from frugal.run.steps import (
    TrainingRun,
    _cuda_device,
    _free_memory,
    _global_sum,
    _is_oom,
    _parts,
    evaluate,
    train_step,
    write_predictions,
)
from frugal.run.summary import Actual, Outcome, RunSummary

Clock = Callable[[], float]  # seconds, as time.monotonic counts them


@dataclass(frozen=True)
class Driving:
    """How a run is driven: `dry_run` steps only (measured, nothing kept), a callback after
    each step, no progress display when `quiet`, and the clock that times steps,
    checkpoints and dollars (a test passes its own)."""

    dry_run: int | None = None
    on_step: Callable[[int, dict[str, float]], None] | None = None
    quiet: bool = False
    clock: Clock = time.monotonic


class Action(Enum):
    STEP = "step"
    EVALUATE = "evaluate"
    CHECKPOINT = "checkpoint"
    STOP = "stop"


class Loop:
    """The training loop as four named steps: `decide` what comes next (one check all
    processes agree on: stop signal, budget, time limit, checkpoint due, evaluation due),
    then `step`, `evaluate` or `checkpoint`; `finish` saves and summarizes."""

    def __init__(
        self,
        run: TrainingRun,
        state: TrainState,
        meter: CostMeter,
        stop: Stop,
        drive: Driving,
        books: RunBooks | None = None,
    ) -> None:
        self.run, self.state, self.meter, self.stop = run, state, meter, stop
        self.clock, self.dry_run, self.on_step = drive.clock, drive.dry_run, drive.on_step
        dry_run, quiet = drive.dry_run, drive.quiet
        cfg, t = run.cfg, run.cfg.training
        self.store = ckpt.Checkpoints(run.out / "checkpoints", t.keep_checkpoints)
        self.total = min(run.total_steps, dry_run or run.total_steps)
        self.sinks = (
            Sinks(run.out, t.loggers, cfg.model_dump(mode="json"), resume=state.step > 0)
            if run.main
            else None
        )
        self.progress = Progress(self.total, enabled=run.main and not quiet)
        self.progress.print(f"precision: {run.precision} ({run.precision_reason})")
        for n in run.notes:
            self.progress.print(n)
        self.diag = Diagnostics(t.learning_rate, run.precision, t.max_grad_norm)
        if state.diagnostics is not None:  # resumed: the windows carry on
            self.diag.load_state_dict(state.diagnostics)
        self.save_every_s = 60 * (t.save_every_min or _plan_interval(cfg) or DEFAULT_CHECKPOINT_MIN)
        self.prediction = predict(cfg, run.micro, run.accum, _cuda_device())
        self.expected_s = expected_step_s(cfg, self.prediction)
        # a clean stop writes a checkpoint and the final weights: guess their time from the
        # bytes until a checkpoint has been timed (1 GB/s disk, 20 ms of fixed cost)
        trainable = sum(p.numel() * p.element_size() for p in run.params)
        self.save_s = 0.02 + 3 * trainable / 1e9
        self.eval_s: float | None = None
        self.session_t0 = self.last_save = drive.clock()
        self.start_step = self.saved_step = state.step  # nothing new to save yet
        self.eval_due = False
        self.outcome: Outcome = "completed"
        self.was_interrupted = False  # by a second Ctrl-C
        self.stopped = False  # set with outcome and reason by whatever ends the run
        self.reason = f"reached {self.total} steps"
        self.peak_alloc = self.peak_res = 0.0
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self.books = books  # the main process keeps the books
        if books is not None:
            books.say = self.progress.alert
        self.dog: Watchdog | None = None
        self.guard_s = 0.0  # what the money guard reads ahead (MoneyGuard.reach_s)

    def train(self) -> RunSummary:
        act = {
            Action.STEP: self.step,
            Action.EVALUATE: self.evaluate,
            Action.CHECKPOINT: self.checkpoint,
        }
        while (action := self.decide()) is not Action.STOP:
            if self.dog:  # steps are watched; evaluations and checkpoints take what they take
                self.dog.watch(action is Action.STEP)
            act[action]()
            if self.dog:
                self.dog.touch()
        if self.dog:
            self.dog.watch(False)  # nor the final checkpoint and export
        return self.finish()

    def decide(self) -> Action:
        """What comes next; on STOP, `outcome` and `reason` say why. The stop rules, in the
        order they win: a stop signal, no progress, a money or hours limit (the meter's),
        the session's time; every process sees what any of them saw."""
        if self.stopped:
            return Action.STOP
        st, t = self.state, self.run.cfg.training
        nxt, stop_s = self._forecast()
        now = self.clock()
        then = nxt + stop_s + self.guard_s  # the next piece of work, a clean stop, and the
        # money guard's reach (it cuts only work that overran this)
        cap = self._books(now, then)
        orphan = orphaned()
        limits = self.meter.crossed(then, cap.limit_usd if cap else None)
        late = t.max_time_min is not None and now - self.session_t0 + nxt > 60 * t.max_time_min
        sig, idle, *over, over_time, save_due = _global_sum(
            self.run,
            float(self.stop.signal is not None or orphan),
            float(self.dog is not None and self.dog.idle),
            *map(float, limits),
            float(late),
            float(self._save_due(now)),
        )
        if sig:
            return self._stop("preempted", self._signalled(orphan))
        if idle:
            return self._stop(
                "idle-stopped", f"nothing progressed for {t.idle_stop_min:g} min (idle_stop_min)"
            )
        work_left = self.eval_due or st.step < self.total
        for limit, hit in enumerate(over):
            if hit and work_left:
                return self._stop(
                    "budget-stopped", self.meter.why(limit, cap.budget if cap else None)
                )
        if over_time and st.step < self.total:
            return self._stop("completed", f"max_time_min={t.max_time_min} reached in this session")
        if self.eval_due:
            return Action.EVALUATE
        if save_due:
            return Action.CHECKPOINT
        return Action.STOP if st.step >= self.total else Action.STEP

    def _forecast(self) -> tuple[float, float]:
        """How long the next piece of work and a clean stop after it may take. The guards
        plan for a slow step: the slowest of the last ten (the first step of a session,
        with its warm-up, only while it is the only one), or the expected before any, plus
        their spread: on a busy host the next one may be slower than any seen yet. A clean
        stop, a checkpoint and the weights, is as slow as the slowest save, and slower by
        as much as the steps now vary (a host that slows the steps slows the saves too)."""
        times = self.state.step_times
        recent = times[1:] if len(times) > 1 else times
        slow = 2 * max(recent) - min(recent) if recent else self.expected_s
        if self.eval_due:
            per = max(1, self.run.cfg.training.effective_batch)
            nxt = (
                self.eval_s
                if self.eval_s is not None
                else (slow * len(self.run.val_batches) / per / 2)
            )
        else:
            nxt = slow if self.state.step < self.total else 0.0
        return nxt, 2 * self.save_s * (max(recent) / min(recent) if recent else 1.0)

    def _save_due(self, now: float) -> bool:
        step = self.state.step
        return (
            not self.dry_run
            and step < self.total
            and step != self.saved_step  # nothing new to save yet
            and now - self.last_save >= self.save_every_s
        )

    def _signalled(self, orphan: bool) -> str:
        before = " before the first step: nothing to save" if self.state.step == 0 else ""
        got = self.stop.signal or "on another process"
        why = "this node's launcher is gone" if orphan and not self.stop.signal else ""
        return f"{why or f'signal {got}'}{before}"

    def _books(self, now: float, then: float) -> Cap | None:
        """A heartbeat when one is due, or when the work until the next check (`then`
        seconds) would go past what the run has reserved of a stop budget; what a stop
        budget lets the run spend."""
        if self.books is None:
            return None
        m = self.meter
        if self.books.due(now, m.spent_usd() + (then + self.books.ask_s) * m.rate):
            st = self.state
            self.books.beat(now, st.step, st.tokens, m.spent_usd(), self.total, then, m.rate)
        return self.books.cap

    def renew(self, ahead_s: float) -> Cap | None:
        """The money guard's question, mid-step (a stalled step has not come back to ask):
        a heartbeat now, reserving of each stop budget what the run spends until its next,
        `ahead_s` (the guard's own reach) on top."""
        if self.books is None:
            return None
        m, st = self.meter, self.state
        self.books.beat(
            self.clock(), st.step, st.tokens, m.spent_usd(), self.total, ahead_s, m.rate
        )
        return self.books.cap

    def money_stop(self, why: str) -> None:
        """The money guard's last word: a step ran to the edge of what the run may spend;
        the process exits at once, resumable from the last checkpoint."""
        m, st = self.meter, self.state
        kept = f"the checkpoint of step {self.saved_step}" if self.saved_step else "no checkpoint"
        reason = f"{why} at step {st.step}; {kept} is kept"
        self.progress.alert(f"[red]budget:[/] {reason}")
        if self.books is not None:
            self.books.end_failed(
                "budget-stopped",
                reason,
                round(m.spent_usd(), 4),
                round(m.elapsed_s() / 3600, 5),
                st.step,
                st.tokens,
            )

    def hung(self) -> None:
        """The watchdog's last word: no progress for twice idle_stop_min (a hang)."""
        minutes = 2 * (self.run.cfg.training.idle_stop_min or 0)
        if self.books is not None:
            m, st = self.meter, self.state
            self.books.end_failed(
                "idle-stopped",
                f"no progress for {minutes:g} min: hung; resume from the last checkpoint",
                round(m.spent_usd(), 4),
                round(m.elapsed_s() / 3600, 5),
                st.step,
                st.tokens,
            )

    def _stop(self, outcome: Outcome, reason: str) -> Action:
        self.outcome, self.reason, self.stopped = outcome, reason, True
        return Action.STOP

    def step(self) -> None:
        run, st, t = self.run, self.state, self.run.cfg.training
        t0 = self.clock()
        try:
            m: dict[str, float] | None = train_step(run, st.step)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not _is_oom(e):
                raise
            m = None
        if m is None:  # out of the except block: its traceback held the attempt's tensors
            _back_off(run, self.progress)
            return
        dt = self.clock() - t0
        st.step += 1
        step = st.step
        st.step_times = [*st.step_times, dt][-10:]
        st.tokens += m["tokens"]
        if step != self.start_step + 1:  # a session's first step warms up: not typical
            st.train_tokens += m["tokens"]
            st.train_time_s += dt
        m.update(
            tokens_per_s=m["tokens"] / dt,
            step_time_s=dt,
            micro_batch=run.micro,
            grad_accum=run.accum,
            spent_usd=round(self.meter.spent_usd(), 6),
        )
        if torch.cuda.is_available():
            self.peak_alloc = max(self.peak_alloc, torch.cuda.max_memory_allocated() / 2**30)
            self.peak_res = max(self.peak_res, torch.cuda.max_memory_reserved() / 2**30)
            m.update(peak_allocated_gib=self.peak_alloc, peak_reserved_gib=self.peak_res)
        # a loss-scale overflow (fp16) skips the update; it is not a broken run
        new = self.diag.on_step(step, m["loss"], None if m.get("skipped") else m["grad_norm"])
        self._report(new)
        if self.sinks and (step % t.log_every == 0 or step == self.total):
            self.sinks.log(step, m)
        self.progress.update(step, m, self.meter, dt)
        if self.on_step is not None:
            self.on_step(step, m)
        if any(f.fatal for f in new):
            self._stop("failed", new[-1].message)
            return
        self.eval_due = not self.dry_run and (
            (t.eval_every and step % t.eval_every == 0) or step == self.total
        )

    def evaluate(self) -> None:
        run, st, t = self.run, self.state, self.run.cfg.training
        self.eval_due = False
        t0 = self.clock()
        ev = evaluate(run)
        self.eval_s = self.clock() - t0
        if ev is None:
            return
        self._report(self.diag.on_eval(st.step, ev.loss, None))
        best = st.best_score
        if best is None and t.best_metric == "eval_loss":
            best = st.best_eval  # a state saved before best_score was kept
        if ev.better(best, t.best_metric):
            st.best_eval, st.best_step, st.bad_evals = ev.loss, st.step, 0
            st.best_score, st.best_metrics = ev.value(t.best_metric), ev.metrics
            ckpt.save_best(run.out, run.unwrapped, st.step, run.main)
        else:
            st.bad_evals += 1
        if self.sinks:
            metrics = {f"eval_{k}": v for k, v in headline(ev.metrics).items()}
            self.sinks.log(st.step, {"eval_loss": ev.loss, **metrics, "eval_time_s": self.eval_s})
        patience = t.early_stopping_patience
        if patience and st.bad_evals >= patience:
            self._stop("completed", f"early stopping: {patience} evaluations without improvement")

    def checkpoint(self) -> None:
        st = self.state
        if st.step == self.saved_step:
            return
        t0 = self.clock()
        st.diagnostics = self.diag.state_dict()
        st.spent_usd, st.elapsed_s = self.meter.spent_usd(), self.meter.elapsed_s()
        st.micro_batch, st.world = self.run.micro, self.run.world
        self.store.save(st, _parts(self.run))
        # the state holds the totals so far; the meter keeps counting this session on top
        # the guards plan for the slowest save of the session (the first replaces the guess)
        took = self.clock() - t0
        saved_before = self.saved_step != self.start_step
        self.save_s = max(took, self.save_s) if saved_before else took
        self.last_save, self.saved_step = self.clock(), st.step

    def interrupted(self) -> RunSummary:
        """A second Ctrl-C: no final save; the newest checkpoint is where a rerun resumes."""
        self.outcome, self.was_interrupted = "preempted", True
        kept = (
            f"the checkpoint of step {self.saved_step} is kept"
            if self.saved_step
            else "no checkpoint: nothing was saved yet"
        )
        self.reason = f"interrupted twice, stopped at once at step {self.state.step}; {kept}"
        return self.finish(save=False)

    def finish(self, save: bool = True) -> RunSummary:
        self.progress.close()
        if save and not self.dry_run and self.outcome != "failed":
            self.checkpoint()
        summary = _summary(self)
        if self.sinks:
            for n in self.sinks.notes:
                self.progress.print(n)
            self.sinks.close()
        return summary

    def _report(self, new: list[Finding]) -> None:
        for f in new:
            self.state.findings.append(FindingRecord(kind=f.kind, step=f.step, message=f.message))
            self.progress.print(f"[yellow]diagnostic:[/] {f.message}")


def _back_off(run: TrainingRun, progress: Progress) -> None:
    """After an OOM: halve the micro-batch, keeping the effective batch (more accumulation)."""
    if run.world > 1:
        raise FrugalError(
            "out of memory on one of the GPUs: set job.batch lower (the micro-batch) and "
            "run again with --resume auto"
        )
    _free_memory(run)
    if run.cfg.job.optimizer_in_backward:
        raise FrugalError(
            f"out of memory at micro-batch {run.micro}, which the optimizer in backward cannot "
            "split: lower training.effective_batch and job.batch, or turn off "
            "job.optimizer_in_backward"
        )
    if run.micro == 1:
        raise FrugalError(
            "out of memory at micro-batch 1: turn on job.grad_checkpointing, lower job.seq, "
            "or use job.method=qlora / a bigger GPU"
        )
    per_rank = run.cfg.training.effective_batch // run.world
    run.micro = max(d for d in range(1, run.micro // 2 + 1) if per_rank % d == 0)
    progress.print(f"OOM: micro-batch now {run.micro}, gradient accumulation {run.accum}")


def _plan_interval(cfg: RunConfig) -> float | None:
    return cfg.plan.checkpoint_interval_min if cfg.plan else None


# -- the end ---------------------------------------------------------------------------------


def _summary(loop: Loop) -> RunSummary:
    run, st, meter, cfg = loop.run, loop.state, loop.meter, loop.run.cfg
    outputs: dict[str, str] = {}
    if not loop.dry_run and loop.outcome in ("completed", "budget-stopped"):
        outputs = export(run, st.best_step)
        if run.classes is not None and len(run.val_batches) and run.main and not run.sharded:
            outputs["predictions"] = str(write_predictions(run))  # by the exported weights
    times = st.step_times
    if st.train_time_s > 0:  # steps after each session's first (warm-up) step
        tokens_per_s: float | None = st.train_tokens / st.train_time_s
    else:
        tokens_per_s = st.tokens / sum(times) if times else None
    cuda = torch.cuda.is_available()
    actual = Actual(
        hours=round(meter.elapsed_s() / 3600, 5),
        cost_usd=round(meter.spent_usd(), 4),
        tokens=int(st.tokens),
        step_time_s=sorted(times)[len(times) // 2] if times else None,
        tokens_per_s=None if tokens_per_s is None else round(tokens_per_s, 1),
        peak_allocated_gib=round(loop.peak_alloc, 3) if cuda else None,
        peak_reserved_gib=round(loop.peak_res, 3) if cuda else None,
    )
    summary = RunSummary(
        outcome=loop.outcome,
        reason=loop.reason,
        resumable=loop.outcome in ("preempted", "idle-stopped"),
        interrupted=loop.was_interrupted,
        steps=st.step,
        total_steps=loop.total,
        steps_this_session=st.step - loop.start_step,
        micro_batch=run.micro,
        grad_accum=run.accum,
        effective_batch=cfg.training.effective_batch,
        tokens_per_step=cfg.training.effective_batch * cfg.job.seq if cfg.job.packing else None,
        precision=run.precision,
        precision_reason=run.precision_reason,
        predicted=predict(cfg, run.micro, run.accum, _cuda_device()),
        actual=actual,
        budget_usd=cfg.budget_usd,
        best_eval_loss=st.best_eval,
        best_step=st.best_step,
        best_metrics={k: round(v, 6) for k, v in st.best_metrics.items()},
        outputs=outputs,
        diagnostics=st.findings,
        notes=run.notes,
    )
    if run.main:
        name = "dry_run.json" if loop.dry_run else "run_summary.json"
        write_text_atomic(run.out / name, summary.to_json(), durable=True)
    return summary
