"""`frugal init`: what a practitioner should settle before spending, asked in the terminal.

The task and its data, the model (a hub id, a local directory, or a size such as 8B), the
budget, the deadline, the hardware at hand, and whether quality or cost comes first. Each
question has a default (Enter takes it) and a check; a bad answer is asked again with the
reason. Then the plan is made for those answers, its run config written (`frugal.yaml`)
and the plan printed, as `frugal plan --write` would. `--yes` answers every question with
its flag or its default, without a terminal.

Quality or cost first decides the methods the plan compares: cost first, QLoRA and LoRA
(the 4-bit base is the cheapest memory); quality first, LoRA and full fine-tuning (no
quantized base). No claim is made of how much either changes the result.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_args

import typer

from frugal.cli import console
from frugal.cli.options import option, option_set, takes
from frugal.cli.plan_cmd import render
from frugal.data.count import CHARS_PER_TOKEN
from frugal.data.labels import read_labelled
from frugal.data.pairs import is_kto, read_preferences
from frugal.data.rows import detect_format, read_rows
from frugal.durations import parse_duration
from frugal.errors import FrugalError
from frugal.estimate.closed_form import model_params
from frugal.files import check_target
from frugal.hardware.catalog import local_offer
from frugal.models.specs import bundled_model_ids, load_spec
from frugal.plan.constraints import Constraints
from frugal.plan.request import PlanRequest, files, make_plan
from frugal.step.job import Task, TrainJob
from frugal.step.tasks import task_of
from frugal.step.tasks.distill import same_vocabulary

METHODS = {"cost": ("qlora", "lora"), "quality": ("lora", "full")}
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bBmM])\s*$")  # 8B, 0.5b, 360M


@option_set
class InitOptions:
    """The options of `frugal init`: each answers its question without asking."""

    task: str | None = option(TrainJob, "task", unset="asked")
    dataset: str | None = typer.Option(None, help="The training file (.jsonl, .csv, .parquet).")
    model: str | None = typer.Option(
        None, help="A hub id, a local dir with config.json, or a size such as 8B."
    )
    budget: float | None = option(Constraints, "budget_usd", unset="asked (none: no cap)")
    deadline: str | None = option(Constraints, "deadline_h", unset="asked (none: no deadline)")
    hardware: str | None = typer.Option(
        None, help="cloud (rent the cheapest), or your own GPUs, e.g. '2x RTX 4090'."
    )
    priority: str | None = typer.Option(None, help="cost or quality: which comes first.")
    teacher: str | None = option(TrainJob, "teacher")
    output: str = typer.Option("frugal.yaml", help="Where the run config is written.")
    yes: bool = typer.Option(False, "--yes", "-y", help="Ask nothing: flags, else defaults.")
    force: bool = typer.Option(False, "--force", help="Replace --output if it exists.")


@dataclass
class Question:
    name: str  # the option that answers it
    text: str
    default: Callable[[dict[str, Any]], str | None]  # from the answers so far
    check: Callable[[str, dict[str, Any]], Any]  # the answer's value, or FrugalError(why)
    asked: Callable[[dict[str, Any]], bool] = lambda got: True  # whether it applies


def _task(text: str, got: dict[str, Any]) -> str:
    t = text.strip().lower()
    if t in get_args(Task):
        return t
    raise FrugalError(
        "answer causal (next-token: chat, completion, text), classification, preference or distill"
    )


def _data(text: str, got: dict[str, Any]) -> str:
    """The training file, read as `frugal train` reads it for the task (a bad row is
    named); what the run takes from it in `got` (its sequence length, ...)."""
    path = text.strip()
    if not path or not Path(path).is_file():
        raise FrugalError(f"{path or 'nothing'}: no such file: give the training file's path")
    got.update(FROM_DATA[got["task"]](path))
    return path


def _token_seq(path: str) -> dict[str, Any]:
    """A causal model's packed rows take 2,048 tokens (a row that is no text, completion or
    chat is named)."""
    first = next(iter(read_rows(path)), None)
    if first is None:
        raise FrugalError(f"{path}: no rows")
    detect_format(first[1], first[0])  # text, prompt/completion or chat, else named
    return {"seq": 2048}


def _classifier_seq(path: str) -> dict[str, Any]:
    """A classifier's row is one text: its longest text (characters / 4) rounded up to a
    power of two, from 64 to 2,048 (a longer text is cut to it)."""
    examples, _ = read_labelled(path)
    longest = max(sum(len(t) for t in e.texts) for e in examples) / CHARS_PER_TOKEN
    return {"seq": _power_of_two(longest)}


def _preference_seq(path: str) -> dict[str, Any]:
    """A preference row's longer sequence (characters / 4, prompt and completion) as a
    classifier's text; KTO's method where the rows are unpaired."""
    rows = read_preferences(path)
    longest = (
        max(len(str(r.prompt)) + max(len(str(r.chosen)), len(str(r.rejected or ""))) for r in rows)
        / CHARS_PER_TOKEN
    )
    return {"seq": _power_of_two(longest), "preference": "kto" if is_kto(rows) else "dpo"}


def _power_of_two(tokens: float) -> int:
    """`tokens` rounded up to a power of two, from 64 to 2,048 (a longer row is cut)."""
    return int(min(2048, max(64, 2 ** math.ceil(math.log2(max(tokens, 1))))))


# what each task's run takes from its training file (its sequence length, ...)
FROM_DATA: dict[str, Callable[[str], dict[str, Any]]] = {
    "causal": _token_seq,
    "classification": _classifier_seq,
    "preference": _preference_seq,
    "distill": _token_seq,
}


def _teacher(text: str, got: dict[str, Any]) -> str:
    """A teacher the student can learn from: found, and of the student's vocabulary."""
    same_vocabulary(load_spec(got["model"]).config, text.strip())
    return text.strip()


def _model(text: str, got: dict[str, Any]) -> str:
    """A hub id or local model as given; a size: the bundled model nearest to it."""
    m = SIZE.match(text)
    if m is None:
        return load_spec(text.strip()).id
    want = float(m.group(1)) * (1e9 if m.group(2).lower() == "b" else 1e6)
    sizes = {mid: model_params(load_spec(mid).config) for mid in bundled_model_ids()}
    return min(sizes, key=lambda mid: abs(math.log(sizes[mid] / want)))


def _money(text: str, got: dict[str, Any]) -> float | None:
    if text.strip().lower() in ("", "none", "no"):
        return None
    try:
        usd = float(text.strip().lstrip("$").replace(",", ""))
    except ValueError:
        usd = -1.0
    if not math.isfinite(usd) or usd <= 0:
        raise FrugalError(f"{text!r}: give dollars, more than 0 (e.g. 50), or none")
    return usd


def _hours(text: str, got: dict[str, Any]) -> float | None:
    if text.strip().lower() in ("", "none", "no"):
        return None
    try:
        hours = parse_duration(text.strip(), "h")
    except ValueError as e:
        raise FrugalError(str(e)) from None
    if hours <= 0:
        raise FrugalError(f"{text!r}: give a deadline after now (e.g. 24 or 2d), or none")
    return hours


def _hardware(text: str, got: dict[str, Any]) -> str | None:
    if text.strip().lower() in ("cloud", ""):
        return None
    local_offer(text.strip(), 0.0)  # names the GPU or count it cannot read
    return text.strip()


def _priority(text: str, got: dict[str, Any]) -> str:
    p = text.strip().lower()
    if p in METHODS:
        return p
    raise FrugalError("answer cost (QLoRA or LoRA) or quality (LoRA or full fine-tuning)")


QUESTIONS = [
    Question(
        "task",
        "Task: causal (next-token), classification, preference or distill",
        lambda g: "causal",
        _task,
    ),
    Question("dataset", "Training data file", lambda g: None, _data),
    Question(
        "model",
        "Model: hub id, local dir, or a size such as 8B",
        lambda g: task_of(g["task"]).default_model,
        _model,
    ),
    Question(
        "teacher",
        "Teacher: a bundled id or a directory with its weights (the student's tokenizer)",
        lambda g: None,
        _teacher,
        lambda g: "teacher" in task_of(g["task"]).fields,
    ),
    Question("budget", "Budget in USD (none: no cap)", lambda g: "none", _money),
    Question(
        "deadline", "Deadline: hours, or e.g. 2d (none: no deadline)", lambda g: "none", _hours
    ),
    Question(
        "hardware",
        "Hardware: cloud, or your GPUs (e.g. '1x RTX 4090')",
        lambda g: "cloud",
        _hardware,
    ),
    Question("priority", "Quality or cost first", lambda g: "cost", _priority),
]


def ask(o: InitOptions) -> dict[str, Any]:
    """Every question's value: its flag's, else (with --yes) its default's, else asked until
    the answer passes its check."""
    got: dict[str, Any] = {}
    for q in QUESTIONS:
        if not q.asked(got):
            continue
        given, default = getattr(o, q.name), q.default(got)
        if given is not None or o.yes:
            text = given if given is not None else default
            if text is None:
                raise FrugalError(f"--yes: give --{q.name} (it has no default)")
            got[q.name] = q.check(str(text), got)  # a bad flag is an error, not a question
            continue
        while True:
            try:
                text = typer.prompt(q.text, default=default, show_default=default is not None)
            except (EOFError, typer.Abort):  # Ctrl-D, or input that ran out
                raise FrugalError(
                    f"no answer to {q.text.split(':')[0]!r} (the input ended): run frugal init "
                    "again, or answer with --yes and flags; nothing was written"
                ) from None
            try:
                got[q.name] = q.check(text, got)
                break
            except FrugalError as e:
                typer.echo(f"  {e}: try again")
    return got


def request(got: dict[str, Any]) -> PlanRequest:
    """The plan these answers ask for."""
    local = (got["hardware"],) if got["hardware"] else ()
    return PlanRequest.model_validate(
        {
            "model": got["model"],
            "dataset": got["dataset"],
            "task": got["task"],
            "preference": got.get("preference", "dpo"),
            "teacher": got.get("teacher"),
            "seq": got["seq"],
            "methods": METHODS[got["priority"]],
            "budget": got["budget"],
            "deadline": got["deadline"],
            "local": local,
            "providers": ("local",) if local else None,
        }
    )


@takes(InitOptions)
def init(ctx: typer.Context, o: InitOptions) -> None:
    """Asks what to settle before spending (task, data, model, budget, deadline, hardware,
    quality or cost first), then writes frugal.yaml and prints the plan."""
    check_target(o.output, "--output", force=o.force)  # before a question is asked
    if not o.yes and not sys.stdin.isatty():
        flags = ", ".join("--" + f.name for f in fields(o)[:7])
        raise FrugalError(
            "frugal init asks in a terminal: run it in one, or answer with --yes and flags "
            f"({flags})"
        )
    got = ask(o)
    out = make_plan(request(got))
    wrote = files(out, {"run config": o.output})
    render(out, wrote)
    console().print(f"next: frugal train {o.output}")
