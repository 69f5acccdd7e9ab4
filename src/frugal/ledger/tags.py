"""Tags: who and what a plan, run or cost is for (project, team, model, env, user, or free).

Where a tag's value comes from, later ones winning:
  1. the user settings file, `FRUGAL_SETTINGS` or `settings.toml` in frugal's config dir:
         required_tags = ["project", "team"]
         [tags]
         team = "nlp"
  2. the environment: `FRUGAL_TAGS="project=chatbot,env=prod"` and `FRUGAL_TAG_<KEY>=value`
     (`FRUGAL_REQUIRED_TAGS="project,team"` sets which are required);
  3. the run config's `tags:` section (written by `plan --write --tag ...`);
  4. `--tag key=value` on the command line.
`user` defaults to the login name and `model` to the model being trained or planned.
A run missing a required tag is refused before any work, naming the flag that adds it.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from frugal.errors import FrugalError
from frugal.settings import read_settings, settings_path

STANDARD = ("project", "team", "model", "env", "user")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,99}$")


@dataclass(frozen=True)
class Settings:
    tags: dict[str, str] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    source: str = ""  # where `required` came from, for the error message


def load_settings() -> Settings:
    """Tag defaults and required tags from the settings file and the environment."""
    path = settings_path()
    data: dict[str, Any] = read_settings()
    raw_tags = data.get("tags", {})
    required: Any = data.get("required_tags", [])
    if not isinstance(raw_tags, dict) or not isinstance(required, list):
        raise FrugalError(
            f'settings file {path}: write `required_tags = ["project"]` and a [tags] table '
            'of key = "value"'
        )
    tags = {check_key(str(k), str(path)): str(v) for k, v in raw_tags.items()}
    source = str(path) if required else ""
    tags.update(parse_tags(_split(os.environ.get("FRUGAL_TAGS", "")), "FRUGAL_TAGS"))
    for name, value in os.environ.items():
        if name.startswith("FRUGAL_TAG_") and value:
            tags[check_key(name.removeprefix("FRUGAL_TAG_").lower(), name)] = value
    env_required = os.environ.get("FRUGAL_REQUIRED_TAGS")
    if env_required is not None:
        required, source = _split(env_required), "FRUGAL_REQUIRED_TAGS"
    return Settings(tags, tuple(check_key(str(k), source) for k in required), source)


def _split(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def check_key(key: str, where: str) -> str:
    if not _KEY.match(key):
        raise FrugalError(
            f"{where}: tag name {key!r} must start with a letter and hold only letters, "
            "digits, '_', '-' or '.'"
        )
    return key


def parse_tags(items: Iterable[str], where: str = "--tag") -> dict[str, str]:
    """`key=value` items as a dict; one line naming the bad item otherwise."""
    tags: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value.strip():
            raise FrugalError(f"{where} {item!r}: write key=value, e.g. {where} project=chatbot")
        if len(value.strip()) > 300:
            raise FrugalError(f"{where} {key.strip()}=...: a tag value is at most 300 characters")
        tags[check_key(key.strip(), where)] = value.strip()
    return tags


def resolve(
    flags: Iterable[str] = (),
    config: Mapping[str, str] | None = None,
    model: str | None = None,
    settings: Settings | None = None,
    required: bool = True,
) -> dict[str, str]:
    """The tags of a plan, run or cost: defaults < environment < run config < flags; then
    (`required`) check the required ones are there."""
    s = settings or load_settings()
    tags = {"user": _login()} | ({"model": model} if model else {}) | s.tags
    tags |= dict(config or {})
    tags |= parse_tags(flags)
    missing = [k for k in s.required if required and not tags.get(k)]
    if missing:
        add = " ".join(f"--tag {k}=NAME" for k in missing)
        raise FrugalError(
            f"missing required tag{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"(required by {s.source}): add {add}, or set them in FRUGAL_TAGS"
        )
    return tags


def _login() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return os.environ.get("USER", "unknown")
