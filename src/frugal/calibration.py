"""User calibration of frugal's modelled constants, from one JSON file.

The file is `FRUGAL_CALIBRATION` or `calibration.json` in the user config dir. It has one
section per model: `{"memory": {...}, "speed": {...}}` (a flat object is the memory
section, as written by earlier versions). Each section overrides fields of one frozen
dataclass of defaults; unknown keys are an error naming the known ones.

Two more keys, written by `frugal calibrate`:

- `groups`: sections for one GPU and method, `{"A100 80GB/lora": {"speed": {...}}}`, or for
  all of one side with `*`: `"*/qlora"`, `"H100 SXM/*"`. A job takes the top-level
  sections, then `*/method`, then `GPU/*`, then `GPU/method`, each overriding the fields
  it names. The estimator asks with the GPU's catalog name and the job's method (memory
  is asked per method: the estimate of a step's memory does not depend on the GPU).
- `calibrated`: where the constants came from (runs, errors before and after); not read.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from frugal.errors import FrugalError, notice
from frugal.files import write_text_atomic
from frugal.paths import user_path

T = TypeVar("T")
SECTIONS = ("memory", "speed")
GROUPS = "groups"
MAX_HOLDOUT = 0.5  # `frugal calibrate --holdout`: the share of runs held back, at most
ABOUT = "calibrated"  # provenance, written by `frugal calibrate`; the estimator ignores it
ANY = "*"


def path() -> Path:
    """Where the calibration file is, or would be written."""
    return user_path("FRUGAL_CALIBRATION", "config", "calibration.json")


def _path() -> Path | None:
    p = path()
    return p if os.environ.get("FRUGAL_CALIBRATION") or p.exists() else None


def _read() -> tuple[str, str]:
    """(the file's text, its path); ("", "") without a file."""
    p = _path()
    if p is None:
        return "", ""
    try:
        return p.read_text(), str(p)
    except OSError as e:
        raise FrugalError(f"cannot read calibration file {p}: {e}; fix or remove it") from e


def parse(text: str, where: str) -> dict[str, Any]:
    """The file's object with a flat (old) memory object moved into its section; checks
    the layout, not the field names (`resolve` checks those against the defaults)."""
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as e:
        raise FrugalError(f"cannot read calibration file {where}: {e}; fix or remove it") from e
    if not isinstance(data, dict):
        raise FrugalError(f"calibration file {where} must hold a JSON object")
    known = (*SECTIONS, GROUPS, ABOUT)
    if data and not any(k in known for k in data):
        data = {"memory": data}
    extra = set(data) - set(known)
    if extra:
        raise FrugalError(
            f"calibration file {where} has unknown sections {sorted(extra)}; known: {known}"
        )
    for name in SECTIONS:
        _check_object(data.get(name), f"{where}: {name}")
    _check_object(data.get(GROUPS), f"{where}: {GROUPS}")
    groups = data.get(GROUPS) or {}
    for key, group in groups.items():
        if key.count("/") != 1:
            raise FrugalError(
                f"calibration file {where}: group {key!r} must be GPU/method "
                "(e.g. 'A100 80GB/lora', '*/qlora')"
            )
        _check_object(group, f"{where}: group {key!r}")
        bad = set(group) - set(SECTIONS)
        if bad:
            raise FrugalError(
                f"calibration file {where}: group {key!r} has unknown sections "
                f"{sorted(bad)}; known: {SECTIONS}"
            )
        for name in SECTIONS:
            _check_object(group.get(name), f"{where}: group {key!r} {name}")
    return data


def _check_object(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, dict):
        raise FrugalError(f"calibration file {where} must be a JSON object")


def group_key(gpu: str | None, method: str | None) -> str:
    return f"{gpu or ANY}/{method or ANY}"


def with_values(
    data: dict[str, Any], where: str | None, section: str, values: dict[str, float]
) -> dict[str, Any]:
    """`data` with `values` set in `section` at the top level (`where` None) or in the group
    `where` (`group_key`)."""
    out = copy.deepcopy(data)
    if where is None:
        out.setdefault(section, {}).update(values)
    else:
        groups = out.setdefault(GROUPS, {})
        groups.setdefault(where, {}).setdefault(section, {}).update(values)
    return out


def value_at(
    data: dict[str, Any], where: str | None, section: str, defaults: type, name: str
) -> float:
    """The value of `name` that applies at `where` (the top level, or a `group_key`)."""
    gpu, method = (None, None)
    if where is not None:
        g, _, m = where.rpartition("/")
        gpu, method = (None if g == ANY else g), (None if m == ANY else m)
    return float(getattr(resolve(data, section, defaults, gpu, method), name))


def overrides(
    data: dict[str, Any], section: str, gpu: str | None = None, method: str | None = None
) -> dict[str, Any]:
    """The fields `data` sets for `section` of a job of `method` on `gpu`, most specific
    last: top level, `*/method`, `GPU/*`, `GPU/method`."""
    out = dict(data.get(section) or {})
    groups = {k.casefold(): v for k, v in (data.get(GROUPS) or {}).items()}
    keys = []
    if method:
        keys.append(group_key(None, method))
    if gpu:
        keys.append(group_key(gpu, None))
    if gpu and method:
        keys.append(group_key(gpu, method))
    for k in keys:
        out.update((groups.get(k.casefold()) or {}).get(section) or {})
    return out


def resolve(
    data: dict[str, Any],
    section: str,
    defaults: type[T],
    gpu: str | None = None,
    method: str | None = None,
    where: str = "calibration",
) -> T:
    """`defaults()` with the fields `data` (a parsed calibration) sets for this job."""
    values = overrides(data, section, gpu, method)
    retired: frozenset[str] = getattr(defaults, "RETIRED", frozenset())
    if set(values) & retired:  # constants of a model frugal no longer uses: fitted for it
        in_file = {k for d in _sections(data, section) for k in d} & retired  # said once
        notice(
            f"calibration file {where}: {section} keys {sorted(in_file)} belong to an earlier "
            f"{section} model and are not used; run `frugal calibrate` again to refit"
        )
        values = {k: v for k, v in values.items() if k not in retired}
    known = {f.name for f in fields(defaults)}  # type: ignore[arg-type]
    unknown = set(values) - known
    if unknown:
        raise FrugalError(
            f"calibration file {where}: unknown {section} keys {sorted(unknown)}; "
            f"known: {sorted(known)}"
        )
    try:
        made = defaults(**{k: float(v) for k, v in values.items()})
    except (TypeError, ValueError) as e:
        raise FrugalError(f"calibration file {where}: {section} values must be numbers") from e
    problems = made.problems() if hasattr(made, "problems") else []  # unphysical values
    if problems:
        raise FrugalError(
            f"calibration file {where}: {section} {problems[0]}; fix it or run `frugal "
            "calibrate` again"
        )
    return made


def _sections(data: dict[str, Any], section: str) -> list[dict[str, Any]]:
    """Every `section` object of `data`: the top level's and each group's."""
    groups = (g.get(section) for g in (data.get(GROUPS) or {}).values())
    return [d for d in (data.get(section), *groups) if d]


_made: dict[tuple[str, str, type, str | None, str | None], Any] = {}  # parsed once per text


def load(section: str, defaults: type[T], gpu: str | None = None, method: str | None = None) -> T:
    """`defaults()` with the fields the calibration file's `section` overrides, for a job of
    `method` on `gpu` (its groups) when they are given. The file is read each time (a plan
    asks per GPU and method) and parsed once per content."""
    text, where = _read()
    key = (text, section, defaults, gpu, method)
    if key not in _made:
        data = parse(text, where) if text else {}
        _made[key] = resolve(data, section, defaults, gpu, method, where)
    made: T = _made[key]
    return made


def read_data() -> dict[str, Any]:
    """The calibration file's content (parsed, a flat object moved into `memory`); {} when
    there is none (yet: `FRUGAL_CALIBRATION` may name the file to create)."""
    if not path().exists():
        return {}
    text, where = _read()
    return copy.deepcopy(parse(text, where)) if text else {}


def write_data(data: dict[str, Any]) -> Path:
    """Write a calibration (atomically) where `load` reads it."""
    p = path()
    p.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(p, json.dumps(data, indent=1, sort_keys=False) + "\n")
    return p
