"""Numbers a user gives, and how a refused one is explained: one mechanism for every
command-line option, run config key and jobs-file field.

The typed schemas (TrainJob, Constraints, the run config) declare each field's range with
pydantic (`Field(ge=1, le=65_536)`, no NaN or infinities). `Number` reads that range; the
command line parses each numeric option with it (`frugal.cli.options`), so a bad value is
one line naming the option and the accepted values before any work is done; `problem`
words a schema's own refusal the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ValidationError
from pydantic.fields import FieldInfo

# pydantic's error types that mean "this number is out of its range or not a number"
RANGE_ERRORS = frozenset(
    (
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "finite_number",
        "int_parsing",
        "int_from_float",
        "int_type",
        "float_parsing",
        "float_type",
    )
)


@dataclass(frozen=True)
class Number:
    """The values a number accepts: finite, within the bounds given, and whole where the
    quantity is counted. Called on the text a user typed, it returns the number or raises
    ValueError naming the accepted values."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    whole: bool = False

    @classmethod
    def of(cls, field: FieldInfo) -> Number:
        """The range a pydantic field declares (Field(ge=..., lt=...)) and its kind."""
        bounds: dict[str, float] = {}
        for m in field.metadata:  # annotated_types' Ge(ge=1), Lt(lt=0.5), ...
            for key in ("ge", "gt", "le", "lt"):
                if isinstance(getattr(m, key, None), int | float):
                    bounds[key] = getattr(m, key)
        return cls(**bounds, whole=int in _types(field) and float not in _types(field))

    def __call__(self, text: str | float) -> float | int:
        given = str(text).strip()
        try:
            x = float(given.replace("_", ""))
        except ValueError:
            raise ValueError(f"{given!r} is not a number: give {self.accepts()}") from None
        if not self.accepting(x):
            raise ValueError(f"{given}: give {self.accepts()}")
        return int(x) if self.whole else x

    def accepting(self, x: float) -> bool:
        return (
            math.isfinite(x)
            and (not self.whole or x.is_integer())
            and (self.ge is None or x >= self.ge)
            and (self.gt is None or x > self.gt)
            and (self.le is None or x <= self.le)
            and (self.lt is None or x < self.lt)
        )

    def accepts(self) -> str:
        """The accepted values in words: 'a whole number from 1 to 4,096', 'a number
        above 0, up to 1', 'a number from 0, below 1', 'a number of 0 or more'."""
        kind = "a whole number" if self.whole else "a number"
        low = (
            f"from {_n(self.ge)}"
            if self.ge is not None
            else f"above {_n(self.gt)}"
            if self.gt is not None
            else ""
        )
        high = (
            f"to {_n(self.le)}"
            if self.le is not None
            else f"below {_n(self.lt)}"
            if self.lt is not None
            else ""
        )
        if low.startswith("from") and high.startswith("to"):
            return f"{kind} {low} {high}"
        if low and high:
            return f"{kind} {low}, {high.replace('to', 'up to')}"
        if self.ge is not None:
            return f"{kind} of {_n(self.ge)} or more"
        if low:
            return f"{kind} {low}"
        return f"{kind} {high.replace('to', 'up to')}".strip()


def _n(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:g}"


def _types(field: FieldInfo) -> tuple[Any, ...]:
    return getattr(field.annotation, "__args__", None) or (field.annotation,)


def numeric(field: FieldInfo) -> bool:
    """A plain number field: int or float, not a bool, and not parsed from words first
    (a duration such as 24h, a count such as 20M)."""
    types = _types(field)
    parsed = any(hasattr(m, "func") for m in field.metadata)  # a BeforeValidator
    return any(t in (int, float) for t in types) and bool not in types and not parsed


def model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The schema that holds the field at a validation error's `loc`: `model`, or one of
    its nested models (a run config's `training`, say); None past a plain value."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        inner = (
            next(
                (t for t in _types(field) if isinstance(t, type) and issubclass(t, BaseModel)),
                None,
            )
            if field
            else None
        )
        if inner is None:
            return None
        model = inner
    return model


def field_at(model: type[BaseModel], loc: tuple[Any, ...]) -> FieldInfo | None:
    """The field at a validation error's `loc`, or None."""
    holder = model_at(model, loc) if loc else None
    return holder.model_fields.get(str(loc[-1])) if holder else None


def problem(e: ValidationError, model: type[BaseModel]) -> tuple[tuple[Any, ...], str, str]:
    """The first problem of a failed validation: where (the field's loc), its pydantic
    type, and what to do, in words. A number out of its range is said as `Number` says
    it ("0: give a whole number of 1 or more"); the schema's own messages are kept."""
    err = e.errors()[0]
    loc = tuple(err.get("loc") or ())
    kind = str(err.get("type", ""))
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    field = field_at(model, loc)
    if kind in RANGE_ERRORS and field is not None and numeric(field):
        given = err.get("input")
        number = isinstance(given, int | float) and not isinstance(given, bool)
        msg = f"{given if number else repr(given)}: give {Number.of(field).accepts()}"
    elif kind == "too_short":  # a list, typed or written "a,b"
        msg = "give at least one, comma-separated"
    elif kind == "string_too_short" and err.get("input") == "":
        msg = "give a value, not an empty string"
    elif kind != "value_error":  # pydantic's own sentence, as part of ours
        msg = msg[:1].lower() + msg[1:]
    return loc, kind, msg


def refusal(
    e: ValidationError, model: type[BaseModel], flag: Callable[[str], str] | None = None
) -> str:
    """A refused request as one line naming its option: `flag(field)` (default: the field
    as an option, `--field-name`) and the value first where it was the value that was
    wrong ("--budget 0: give a number above 0"), else the problem ("--optimize: input
    should be 'cost' or 'time'")."""
    loc, kind, msg = problem(e, model)
    name = str((loc or ("",))[0])
    if not name:  # the whole of it: not an object of fields
        return f"the request: {msg}"
    said = flag(name) if flag else "--" + name.replace("_", "-")
    if kind == "value_error" or kind in RANGE_ERRORS:  # names the value first
        return f"{said} {msg}"
    return f"{said}: {msg}"


def listed(value: Any) -> Any:
    """A list as people type it on a command line, "lora,qlora", as a tuple; a list or
    None as it is."""
    if isinstance(value, str):
        return tuple(x.strip() for x in value.split(",") if x.strip())
    return value


# a request's list field: a JSON list, or one comma-separated string as an option gives it
Listed = Annotated[tuple[str, ...], BeforeValidator(listed)]
