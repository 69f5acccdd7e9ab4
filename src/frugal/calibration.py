"""User calibration of frugal's modelled constants, from one JSON file.

The file is `FRUGAL_CALIBRATION` or `calibration.json` in the user config dir. It has one
section per model: `{"memory": {...}, "speed": {...}}` (a flat object is the memory
section, as written by earlier versions). Each section overrides fields of one frozen
dataclass of defaults; unknown keys are an error naming the known ones.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from frugal.errors import FrugalError
from frugal.paths import user_path

T = TypeVar("T")
SECTIONS = ("memory", "speed")


def _path() -> Path | None:
    path = user_path("FRUGAL_CALIBRATION", "config", "calibration.json")
    return path if os.environ.get("FRUGAL_CALIBRATION") or path.exists() else None


def load(section: str, defaults: type[T]) -> T:
    """`defaults()` with the fields the calibration file's `section` overrides."""
    path = _path()
    if path is None:
        return defaults()
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FrugalError(f"cannot read calibration file {path}: {e}; fix or remove it") from e
    if not isinstance(data, dict):
        raise FrugalError(f"calibration file {path} must hold a JSON object")
    if not any(k in SECTIONS for k in data):
        data = {"memory": data}
    extra = set(data) - set(SECTIONS)
    if extra:
        raise FrugalError(
            f"calibration file {path} has unknown sections {sorted(extra)}; known: {SECTIONS}"
        )
    values = data.get(section) or {}
    known = {f.name for f in fields(defaults)}  # type: ignore[arg-type]
    unknown = set(values) - known
    if unknown:
        raise FrugalError(
            f"calibration file {path}: unknown {section} keys {sorted(unknown)}; "
            f"known: {sorted(known)}"
        )
    try:
        return defaults(**{k: float(v) for k, v in values.items()})
    except (TypeError, ValueError) as e:
        raise FrugalError(f"calibration file {path}: {section} values must be numbers") from e


def measurements_path() -> Path:
    """Where measured runs are appended (JSON lines): `FRUGAL_MEASUREMENTS`, or
    `measurements.jsonl` beside the calibration file in the user config dir."""
    return user_path("FRUGAL_MEASUREMENTS", "config", "measurements.jsonl")


def record_measurement(row: dict[str, Any]) -> Path:
    """Append one measured run (e.g. a `frugal train --dry-run`) for later calibration."""
    path = measurements_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row, default=str) + "\n")
    return path
