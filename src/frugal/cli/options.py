"""Command-line options made from the typed schemas the library validates (TrainJob,
Constraints, the run config): each default, each help text and each range is written once,
on the field, and every command that exposes the field shows and checks the same.

Every numeric option of every command parses through a `frugal.validation.Number` (a test
walks them all): NaN, infinities, values out of range and fractions of a whole quantity are
one line naming the option and the accepted values, before any work is done.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, get_type_hints

import typer
from pydantic import BaseModel, ValidationError

from frugal.counts import parse_count
from frugal.errors import FrugalError
from frugal.validation import Number, numeric, refusal

R = TypeVar("R", bound=BaseModel)
Opts = TypeVar("Opts")


def number(default: Any, help: str, **bounds: Any) -> Any:
    """A numeric typer option that is not a field of a schema: its range is given here
    (ge, gt, le, lt; whole=True for a count). For a positional argument: `argument`."""
    return typer.Option(default, help=help, parser=Number(**bounds))


def argument(help: str, **bounds: Any) -> Any:
    """A required numeric positional argument with its range (see `number`)."""
    return typer.Argument(..., help=help, parser=Number(**bounds))


def describe(model: type[BaseModel], name: str) -> str:
    """The field's description as help text: a sentence."""
    text = model.model_fields[name].description or ""
    if text.split(" ")[0].isalpha():  # not "bf16-mixed/..." or "--method"
        text = text[:1].upper() + text[1:]
    return text + ("" if text.endswith(".") else ".")


def default(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].get_default(call_default_factory=True)


def option(
    model: type[BaseModel],
    name: str,
    *,
    unset: bool | str = False,
    listed: bool = False,
    help: str | None = None,
) -> Any:
    """A typer option for `model.name`, with the field's default, description and range
    (a required field: a required option).
    unset: the option defaults to None (not given: the library picks the default, and may
    refuse the option where it does not apply); the help still shows the field's default,
    or the text given (e.g. "the run config's").
    listed: a tuple field given as a comma-separated string.
    help: other words for the same field (the range stays the field's)."""
    field = model.model_fields[name]
    value: Any = ... if field.is_required() else default(model, name)
    parser = Number.of(field) if numeric(field) else None
    text = help or describe(model, name)
    if listed:
        value = ",".join(str(v) for v in value)
    if unset:
        shown = unset if isinstance(unset, str) else "none" if value is None else value
        # typer prints help through rich: a bare [default: ...] would be read as markup
        return typer.Option(None, help=f"{text} \\[default: {shown}]", parser=parser)
    return typer.Option(value, help=text, parser=parser)


MODEL_HELP = "Bundled hub id, local dir or config.json, or hub id."
JSON_HELP = "Print one JSON object."
OFFERS_HELP = (
    "Your own offers CSV (negotiated, reserved or on-prem rates; or a SkyPilot vms.csv): its "
    "rows add to the catalog or replace the same provider, instance and region."
)


def token_count(default: Any, help: str) -> Any:
    """A token count option, written as people write it: 20M, 1.5B, 2e7 (frugal.counts)."""
    return typer.Option(default, help=help, parser=parse_count)


def fields_of(ctx: typer.Context, model: type[BaseModel]) -> dict[str, Any]:
    """The command's options that are fields of `model`, named as the fields are."""
    return {k: v for k, v in ctx.params.items() if k in model.model_fields}


def request_of(ctx: typer.Context, request: type[R], **made: Any) -> R:
    """The typed request a command's options make: each option that is one of the
    request's fields is named as the field (an option not given, None, is left out);
    `made`: fields the command built itself (the step of `estimate`)."""
    given = {k: v for k, v in fields_of(ctx, request).items() if v is not None} | made
    try:
        return request.model_validate(given)
    except ValidationError as e:
        raise FrugalError(refusal(e, request, _flag)) from None


def _flag(field: str) -> str:
    """A request field as the command line names it: MODEL is the argument."""
    return "MODEL" if field == "model" else "--" + field.replace("_", "-")


Body = Callable[[typer.Context, Opts], None]


INFOS = "__options__"  # where `option_set` keeps each field's typer.Option


@dataclass_transform(kw_only_default=True)
def option_set(cls: type[Opts]) -> type[Opts]:
    """A command's options as a dataclass, one field per option, declared with its
    annotation and its `typer.Option` (or `option(...)`) as the default: typer reads those
    (`takes`), while the dataclass itself holds plain values, so `PlanOptions()` used as a
    library is the command's defaults, not typer's OptionInfo objects. Keyword-only: an
    option without a default (typer's `...`) is required by name."""
    infos = {}
    for name in cls.__annotations__:
        info = cls.__dict__.get(name)
        if isinstance(info, typer.models.ParameterInfo):
            infos[name] = info
            if info.default is ...:
                delattr(cls, name)  # required
            else:  # made afresh for each instance: a list default is not shared
                fresh = functools.partial(copy.copy, info.default)
                setattr(cls, name, dataclasses.field(default_factory=fresh))
    made = dataclasses.dataclass(kw_only=True)(cls)
    setattr(made, INFOS, infos)
    return made


def takes(options: type[Opts]) -> Callable[[Body[Opts]], Callable[..., None]]:
    """A command whose options are declared as an `option_set`, one field per option (its
    annotation and its `typer.Option`, as typer reads them from a signature): the command
    is `body(ctx, opts)`, and typer sees the fields as the command's parameters."""
    fields = dataclasses.fields(options)  # type: ignore[arg-type]
    hints = get_type_hints(options)
    infos = getattr(options, INFOS)
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("ctx", keyword, annotation=typer.Context)]
    params += [
        inspect.Parameter(f.name, keyword, default=infos[f.name], annotation=hints[f.name])
        for f in fields
    ]

    def wrap(body: Body[Opts]) -> Callable[..., None]:
        @functools.wraps(body)
        def command(ctx: typer.Context, **given: Any) -> None:
            body(ctx, options(**given))

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap
