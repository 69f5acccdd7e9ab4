"""The user settings file: `FRUGAL_SETTINGS`, or `settings.toml` in frugal's config directory.

One TOML file for every setting a user keeps between commands; each part of frugal reads its
own table from it:

    required_tags = ["project", "team"]    # frugal.ledger.tags
    [tags]
    team = "nlp"
    [offers]                               # frugal.hardware.offers
    files = ["~/prices/negotiated.csv"]    # your own offers, on top of the catalog
    max_age_days = 7                       # warn when the prices are older than this
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from frugal.errors import FrugalError
from frugal.paths import user_path


def settings_path() -> Path:
    return user_path("FRUGAL_SETTINGS", "config", "settings.toml")


def read_settings() -> dict[str, Any]:
    """The settings file's contents ({} when there is none); one line naming it if it is not
    TOML."""
    path = settings_path()
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise FrugalError(f"cannot read settings file {path}: {e}; fix or remove it") from None


def table(name: str) -> dict[str, Any]:
    """One `[name]` table of the settings file ({} when absent)."""
    value = read_settings().get(name, {})
    if not isinstance(value, dict):
        raise FrugalError(f"settings file {settings_path()}: `{name}` must be a [{name}] table")
    return value
