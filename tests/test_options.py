"""Each default and each help text is written once, on the schema field: every command-line
option of a field shows the field's own; the library validates its inputs for any caller."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from pydantic import BaseModel, ValidationError

from frugal.cli.main import app
from frugal.cli.options import default, describe
from frugal.config import DataConfig, RunConfig
from frugal.errors import FrugalError
from frugal.plan.constraints import Constraints
from frugal.step.job import TrainJob


def _commands(cmd: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every command under `cmd` (typer's own click, whichever it is), with its path."""
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, f"{path} {name}".strip())
    else:
        yield path, cmd


def _field(command: str, param: str) -> tuple[type[BaseModel], str] | None:
    if command.startswith(("serve", "tco")):  # serving, not the training schema: `serve
        return None  # --gpus` is GPUs per server, not a training job's GPU count
    if command == "train":  # overrides of the run config
        name = {"budget": "budget_usd", "price_per_hour": "price_per_hour_usd"}.get(param, param)
        if name in RunConfig.model_fields:
            return RunConfig, name
    if param in ("tokens", "spot"):  # `plan --tokens` is per epoch (the field: all epochs);
        return None  # --spot/--no-spot/neither is the field's only/never/auto
    if param in TrainJob.model_fields:
        return TrainJob, param
    for name, f in Constraints.model_fields.items():
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        if param == name or "--" + param.replace("_", "-") == extra.get("flag"):
            return Constraints, name
    if param == "epochs":
        return DataConfig, param
    return None


def test_every_option_of_a_schema_field_shows_its_default_and_help() -> None:
    seen = set()
    for path, cmd in _commands(typer.main.get_command(app)):
        for p in cmd.params:
            found = _field(path, p.name or "") if p.param_type_name == "option" else None
            if found is None:
                continue
            model, name = found
            want = default(model, name)
            want = ",".join(want) if isinstance(want, tuple) else want
            chosen = "[default: the plan chooses" in (p.help or "")
            # a setting the plan chooses names no other default (lora_alpha's field says
            # "2 x rank", what an estimate takes; the plan sets 32): its help is its own
            assert not chosen or "(default:" not in (p.help or ""), (path, p.name, p.help)
            if not chosen:
                assert (p.help or "").startswith(describe(model, name)), (path, p.name, p.help)
            if p.default is None and want is not None:  # unset: the library picks it
                assert "[default: " in (p.help or ""), (path, p.name)
            else:
                assert p.default == want, (path, p.name, p.default, want)
            seen.add((path, name))
    # the commands that expose the schemas do so through it
    assert {("estimate", "seq"), ("plan", "seq"), ("data check", "seq")} <= seen
    assert {("plan", "effective_batch"), ("plan", "margin"), ("plan", "deadline_h")} <= seen


@pytest.mark.parametrize(
    ("command", "request_type"),
    [("plan", "frugal.plan.request:PlanRequest"),
     ("serve plan", "frugal.serve.request:ServeRequest")],
)  # fmt: skip
def test_a_command_asks_its_apis_request_with_its_defaults(command: str, request_type: str) -> None:
    """`frugal plan` and `frugal serve plan` pass their options to their API by name: each
    field of the request is an option of the command, with the same default, so the
    dashboard's Plan form, a test and the command ask the same thing in the same words."""
    import importlib

    module, name = request_type.split(":")
    request = getattr(importlib.import_module(module), name)
    cmd = dict(_commands(typer.main.get_command(app)))[command]
    params = {p.name: p for p in cmd.params}
    for field_name, f in request.model_fields.items():
        assert field_name in params, f"{name}'s {field_name!r} is no option of `{command}`"
        if f.is_required():  # MODEL: the command's argument (optional beside --jobs)
            continue
        want = f.get_default(call_default_factory=True)
        if isinstance(want, tuple):
            want = ",".join(str(x) for x in want) or None
        assert params[field_name].default == want, (field_name, params[field_name].default, want)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["plan", "", "--tokens", "5M"], "MODEL: give a value, not an empty string"),
        (["estimate", ""], "MODEL: give a value, not an empty string"),
        (["serve", "plan", "", "--rate", "1", "--input-len", "9", "--output-len", "9"],
         "MODEL: give a value, not an empty string"),
        (["plan", "meta-llama/Llama-3.2-1B", "--tokens", "5M", "--methods", ",,"],
         "--methods: give at least one, comma-separated"),
        (["plan", "meta-llama/Llama-3.2-1B", "--tokens", "5M", "--providers", ","],
         "--providers: give at least one, comma-separated"),
        (["plan", "meta-llama/Llama-3.2-1B", "--tokens", "5M", "--schedule", "bogus"],
         "--schedule: input should be 'cosine', 'linear' or 'constant'"),
        (["serve", "plan", "meta-llama/Llama-3.1-8B", "--rate", "1", "--input-len", "9",
          "--output-len", "9", "--commitment-months", "200"],
         "--commitment-months 200: give a whole number from 1 to 120, e.g. 12,36"),
    ],
    ids=["plan-model", "estimate-model", "serve-model", "methods", "providers", "schedule",
         "months"],
)  # fmt: skip
def test_a_request_the_options_make_badly_is_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    """An empty MODEL or list, or a bad item of a list, is refused by the request the
    options make: one line naming the option (an empty --methods was an internal error
    before, and an empty MODEL was read as the current directory)."""
    from conftest import run_error

    assert run_error(capsys, *argv) == f"error: {said}"


def test_the_plan_and_the_run_config_share_the_effective_batch_default() -> None:
    from frugal.config import TrainingConfig

    assert default(Constraints, "effective_batch") == default(TrainingConfig, "effective_batch")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"margin": 0.7}, "--margin 0.7: give a number from 0, below 0.5"),
        ({"budget_usd": 0}, "--budget 0: give a number above 0"),
        ({"budget_usd": float("nan")}, "--budget nan: give a number above 0"),
        ({"deadline_h": "soon"}, "--deadline 'soon' is not a duration"),
        ({"objective": "speed"}, "--optimize: input should be 'cost' or 'time'"),
        ({"methods": ("lora", "dora")}, "--methods: input should be"),
        ({"max_gpus": 0}, "--max-gpus 0: give a whole number of 1 or more"),
    ],
)
def test_constraints_validate_themselves(change: dict[str, object], message: str) -> None:
    with pytest.raises(FrugalError) as e:
        Constraints.build(tokens=1e6, **change)
    assert str(e.value).startswith(message), str(e.value)
    with pytest.raises(ValidationError):  # also for a library caller that skips build()
        Constraints(tokens=1e6, **change)  # type: ignore[arg-type]


def test_constraints_take_durations() -> None:
    k = Constraints.build(tokens=1e6, deadline_h="1h30m", mtbi_h="2d")
    assert (k.deadline_h, k.mtbi_h) == (1.5, 48.0)


def test_an_options_class_used_as_a_library_holds_the_commands_defaults() -> None:
    """`InitOptions()` held typer's OptionInfo objects where its defaults should be: every
    options class of a command makes instances of plain values, the defaults the command
    line has."""
    import dataclasses

    from frugal.cli.catalog_cmd import OffersOptions
    from frugal.cli.data_cmd import CheckOptions
    from frugal.cli.init_cmd import InitOptions
    from frugal.cli.plan_options import PlanOptions

    init = InitOptions()
    assert (init.output, init.yes, init.task) == ("frugal.yaml", False, None)
    for made in (InitOptions(), PlanOptions(), OffersOptions(), CheckOptions(file="d.jsonl")):
        for f in dataclasses.fields(made):
            value = getattr(made, f.name)
            assert not isinstance(value, typer.models.ParameterInfo), (made, f.name)
    with pytest.raises(TypeError):
        CheckOptions()  # FILE has no default: required
