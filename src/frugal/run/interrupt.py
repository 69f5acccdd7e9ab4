"""Signals during training: the first SIGTERM or SIGINT asks the loop to stop at the next
step boundary (with a checkpoint); a second Ctrl-C stops at once. Where a half-done rename
would lose a whole directory (swapping a checkpoint, the best or the final weights into
place), a second Ctrl-C waits the few milliseconds until the swap is done (`held`)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_active: list[Stop] = []  # the Stop handling signals now (signal handlers are per process)


class Stop:
    """Set by SIGTERM/SIGINT; acted on at the next step boundary."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.old: dict[int, Any] = {}
        self.holding = 0  # inside `held`: a second Ctrl-C waits
        self.pending = False

    def __enter__(self) -> Stop:
        for s in (signal.SIGTERM, signal.SIGINT):
            self.old[s] = signal.signal(s, self._handle)
        _active.append(self)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None and signum == signal.SIGINT:  # a second Ctrl-C: stop now
            if self.holding:
                self.pending = True
                return
            raise KeyboardInterrupt
        self.signal = signum

    def __exit__(self, *exc: Any) -> None:
        _active.remove(self)
        for s, h in self.old.items():
            signal.signal(s, h)


LAUNCHER = "FRUGAL_LAUNCHER_PID"  # set by frugal's launcher in each worker's environment


def orphaned() -> bool:
    """Whether this worker's launcher (frugal's) is gone: killed outright, it passed on no
    signal, so its workers stop as if it had."""
    pid = os.environ.get(LAUNCHER)
    return pid is not None and os.getppid() != int(pid)


@contextmanager
def held() -> Iterator[None]:
    """A block a second Ctrl-C does not cut: it takes effect as the block ends."""
    stop = _active[-1] if _active else None
    if stop is None:
        yield
        return
    stop.holding += 1
    try:
        yield
    finally:
        stop.holding -= 1
        if not stop.holding and stop.pending:
            stop.pending = False
            raise KeyboardInterrupt
