"""A training task is one module (`step/tasks/`): the trainer, the estimator and the planner
ask it, and each table that reads a task's data has a row for every task."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

import frugal
from frugal.cli.data_cmd import CHECKS
from frugal.cli.init_cmd import FROM_DATA
from frugal.config import validate_run_config
from frugal.errors import FrugalError
from frugal.plan.request import DATASETS
from frugal.run.rows import ROWS
from frugal.step.job import Task, make_job
from frugal.step.tasks import TASKS

SRC = Path(frugal.__file__).parent


def test_the_job_names_every_task_and_no_other() -> None:
    assert get_args(Task) == tuple(TASKS)


@pytest.mark.parametrize("table", [ROWS, DATASETS, CHECKS, FROM_DATA], ids=lambda t: str(len(t)))
def test_every_table_of_a_tasks_data_has_each_task(table: dict[str, object]) -> None:
    assert set(table) == set(TASKS)


def test_each_task_names_a_transformers_head_and_a_peft_task_type() -> None:
    import transformers
    from peft import TaskType
    from transformers.models.auto import modeling_auto

    for task in TASKS.values():
        assert hasattr(transformers, task.auto_class), task.name
        assert "llama" in getattr(modeling_auto, task.auto_mapping), task.name
        assert task.peft_task_type in TaskType.__members__, task.name


def test_no_code_outside_the_tasks_compares_a_task_name() -> None:
    """`task == "classification"` was spread over 20 places; one of them planned a
    classifier as a causal model. A comparison with a task's name outside `step/tasks/`
    fails here (tables keyed by name are lookups, not comparisons)."""
    found = []
    for path in SRC.rglob("*.py"):
        if "tasks" in path.relative_to(SRC).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = [c.value for c in (node.left, *node.comparators)
                         if isinstance(c, ast.Constant)]  # fmt: skip
                if set(names) & set(TASKS):
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found


def test_a_tasks_own_fields_count_only_in_its_profile() -> None:
    causal = make_job().profile_key()
    assert not {"num_labels", "preference", "reference", "teacher"} & set(causal)
    classes = make_job(task="classification", num_labels=7).profile_key()
    assert classes["num_labels"] == 7 and "teacher" not in classes


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"num_labels": 7}, "--num-labels is for --task classification"),
        ({"teacher": "meta-llama/Llama-3.1-8B"}, "--teacher is for --task distill"),
        ({"task": "classification", "reference": "precomputed"},
         "--reference is for --task preference"),
    ],
)  # fmt: skip
def test_a_setting_of_another_task_is_one_line_naming_its_task(
    given: dict[str, object], says: str
) -> None:
    with pytest.raises(FrugalError) as e:
        make_job(**given)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_training_setting_of_another_task_is_one_line_naming_it() -> None:
    cfg = {"model": "examples/tiny-llama", "data": {"path": "x.jsonl"},
           "training": {"class_weights": "balanced"}}  # fmt: skip
    with pytest.raises(FrugalError) as e:
        validate_run_config(cfg, "run.yaml")
    assert "training.class_weights=balanced is for job.task=classification" in str(e.value)
    assert "\n" not in str(e.value)


def test_every_tasks_settings_cite_a_known_source() -> None:
    from frugal.plan.hyper import SOURCES, WHERE

    for task in TASKS.values():
        for method in ("full", "lora", "qlora"):
            for name, (_, reason, source) in task.settings(method, 8_000_000_000).items():
                assert source in SOURCES and reason and name in WHERE, (task.name, name)
