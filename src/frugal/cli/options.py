"""Command-line options made from the typed schemas the library validates (TrainJob,
Constraints, the run config): each default and each help text is written once, on the
field, and every command that exposes the field shows the same."""

from __future__ import annotations

from typing import Any

import typer
from pydantic import BaseModel

from frugal.counts import parse_count
from frugal.errors import FrugalError


def describe(model: type[BaseModel], name: str) -> str:
    """The field's description as help text: a sentence."""
    text = model.model_fields[name].description or ""
    if text.split(" ")[0].isalpha():  # not "bf16-mixed/..." or "--method"
        text = text[:1].upper() + text[1:]
    return text + ("" if text.endswith(".") else ".")


def default(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].get_default(call_default_factory=True)


def option(
    model: type[BaseModel], name: str, *, unset: bool | str = False, listed: bool = False
) -> Any:
    """A typer option for `model.name`, with the field's default and description.
    unset: the option defaults to None (not given: the library picks the default, and may
    refuse the option where it does not apply); the help still shows the field's default,
    or the text given (e.g. "the run config's").
    listed: a tuple field given as a comma-separated string."""
    value = default(model, name)
    if listed:
        value = ",".join(value)
    if unset:
        shown = unset if isinstance(unset, str) else "none" if value is None else value
        # typer prints help through rich: a bare [default: ...] would be read as markup
        return typer.Option(None, help=f"{describe(model, name)} \\[default: {shown}]")
    return typer.Option(value, help=describe(model, name))


def listed(text: str | None) -> tuple[str, ...] | None:
    """A comma-separated option value as a tuple (None stays None)."""
    return None if text is None else tuple(x.strip() for x in text.split(",") if x.strip())


MODEL_HELP = "Bundled hub id, local dir or config.json, or hub id."
JSON_HELP = "Print one JSON object."


def parse_tokens(text: str, flag: str) -> float:
    """A token count as people write it (frugal.counts), or one line naming `flag`."""
    try:
        return parse_count(text)
    except ValueError:
        raise FrugalError(f"{flag} {text!r}: give a positive count like 20M or 2e7") from None
