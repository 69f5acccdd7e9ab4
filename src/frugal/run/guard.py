"""The run's money held by the clock, not by its steps.

The training loop stops cleanly before a limit: before each step it asks whether the next
step and a clean stop (a checkpoint and the weights) would cross the run's budget, what
its stop budgets reserved for it, or `max_hours` (`CostMeter.crossed`), and it asks the
books for more of a shared stop budget before its reservation runs out. All of that
happens between steps. A step that stalls (a loaded host, a hung collective, a swapping
machine) spends by the hour all the same, and spent $24.26 of a $24 stop budget.

`MoneyGuard` watches the meter by the clock from a thread of its own, whatever the loop is
doing: when the run's dollars come within what it spends in `poll_s + exit_s` of what it
may spend, it first asks the books for more of its stop budgets (`renew`, as a heartbeat
would); where no more is to be had (or its own budget or `max_hours` is the limit), it
ends the run on the books and exits at once, resumable from its last checkpoint (`on_stop`
records why). So what a run spends never passes what it was allowed, stalled or not. The
loop plans its steps with that reach in hand (`reach_s`), so the guard cuts only a run
whose work overran what the loop planned.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from frugal.errors import RESUMABLE_EXIT
from frugal.run.books import Cap
from frugal.run.meter import CostMeter

POLL_S = 0.5  # how often the guard reads the meter
EXIT_S = 2.0  # what ending the run on the books and exiting may take, on a loaded host


class MoneyGuard:
    """See the module. `cap()`: the run's stop-budget reservation now (None: none);
    `renew(ahead_s)`: ask the books again, for `ahead_s` more than a heartbeat's interval,
    and return the new reservation; `down()`: whether the books cannot be reached (then
    the run may spend what its stop budget had left); `on_stop(why)`: record the stop,
    before the process exits."""

    def __init__(
        self,
        meter: CostMeter,
        on_stop: Callable[[str], None],
        cap: Callable[[], Cap | None] = lambda: None,
        renew: Callable[[float], Cap | None] = lambda ahead_s: None,
        down: Callable[[], bool] = lambda: False,
        poll_s: float = POLL_S,
        exit_s: float = EXIT_S,
    ) -> None:
        self.meter, self.on_stop = meter, on_stop
        self.cap, self.renew, self.down = cap, renew, down
        self.poll_s, self.exit_s = poll_s, exit_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="frugal-money", daemon=True)

    @property
    def enabled(self) -> bool:
        """Guarding a meter on the wall clock with a limit to hold (a meter on a clock of
        its own, a test's, has no wall-clock to guard)."""
        m = self.meter
        return m.clock is time.monotonic and bool(m.rate or m.max_hours is not None)

    @property
    def reach_s(self) -> float:
        """How far ahead the guard reads the meter: the loop keeps that much in hand when
        it plans its next step, so the guard never cuts a run the loop would stop cleanly."""
        return self.poll_s + self.exit_s if self.enabled else 0.0

    def __enter__(self) -> MoneyGuard:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            why = self.over()
            if why is not None and not self._done.is_set():
                self.on_stop(why)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(RESUMABLE_EXIT)

    def over(self) -> str | None:
        """Why the run must stop now (None: it may go on): within a poll and an exit of a
        limit, its stop budgets asked again first."""
        m = self.meter
        ahead_s = self.reach_s
        reach = m.spent_usd() + m.rate * ahead_s
        if m.budget is not None and reach > m.budget:
            return f"the ${m.budget:,.2f} budget: a step ran past it, stopped at once"
        cap = self.cap()
        if cap is not None:
            allowed = cap.limit_usd if self.down() else cap.usd
            if reach > allowed and not self.down():
                cap = self.renew(ahead_s)  # the loop has not asked in time: a stalled step
                allowed = cap.usd if cap is not None else float("inf")
            if cap is not None and reach > allowed:
                return (
                    f"stop budget {cap.budget}: a step ran past what it left this run, "
                    "stopped at once"
                )
        if m.max_hours is not None and m.elapsed_s() + ahead_s > 3600 * m.max_hours:
            return f"max_hours={m.max_hours:.4g} h: a step ran past it, stopped at once"
        return None
