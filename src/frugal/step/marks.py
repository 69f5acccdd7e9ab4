"""Where a training step is: the marks the step's own code makes for a memory tracker.

The step (`frugal.step.run`) says which phase it is in (forward, backward, optimizer) and
which accumulation micro-step; the 4-bit stand-in says which of its storages are
temporaries, and activation offloading which live in host memory. With no tracker
watching, each mark is one empty-list check, so `frugal train` runs the very same code at
no measurable cost; the estimator's simulation and the self-consistency tests watch it
with `frugal.estimate.tracker.StepTracker`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Protocol


class Observer(Protocol):
    def set_segment(self, name: str) -> None: ...
    def begin_micro(self, index: int) -> None: ...
    def temporary(self) -> Any: ...  # a context manager
    def in_forward(self) -> Any: ...  # a context manager
    def on_host(self) -> Any: ...  # a context manager


_OBSERVERS: list[Observer] = []


def phase(name: str) -> None:
    """The step enters `name`: fwd, bwd_head or opt (see estimate.categories.SEGMENTS)."""
    for o in _OBSERVERS:
        o.set_segment(name)


def micro_step(index: int) -> None:
    """Micro-step `index` (1, 2, ...) of gradient accumulation begins."""
    for o in _OBSERVERS:
        o.begin_micro(index)


def temporaries() -> Any:
    """Storages made inside are temporaries (4-bit dequantization buffers)."""
    return _OBSERVERS[-1].temporary() if _OBSERVERS else nullcontext()


def host_memory() -> Any:
    """Storages made inside live in host memory (offloaded activations), not the device's."""
    return _OBSERVERS[-1].on_host() if _OBSERVERS else nullcontext()


def function_forward() -> Any:
    """Ops inside a custom autograd Function's forward (a re-run counts as recompute)."""
    return _OBSERVERS[-1].in_forward() if _OBSERVERS else nullcontext()


@contextmanager
def observing(observer: Observer) -> Iterator[Observer]:
    _OBSERVERS.append(observer)
    try:
        yield observer
    finally:
        _OBSERVERS.remove(observer)
