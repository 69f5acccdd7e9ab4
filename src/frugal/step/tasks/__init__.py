"""The training tasks, one module each (`base.Task` says what a task supplies)."""

from __future__ import annotations

from frugal.step.tasks.base import Task
from frugal.step.tasks.causal import Causal
from frugal.step.tasks.classification import Classification
from frugal.step.tasks.distill import Distill
from frugal.step.tasks.preference import Preference

TASKS: dict[str, Task] = {t.name: t for t in (Causal(), Classification(), Preference(), Distill())}


def task_of(name: str) -> Task:
    """The task of a job (`job.task`), a `Loss` or a run config."""
    return TASKS[name]
