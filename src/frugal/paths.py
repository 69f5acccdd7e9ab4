"""Where frugal keeps its files on this machine: an environment variable when set, else the
platform's user directory (platformdirs: ~/.cache/frugal, ~/.config/frugal on Linux)."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Literal

import platformdirs

Kind = Literal["cache", "config", "data"]
_DIRS = {
    "cache": platformdirs.user_cache_dir,
    "config": platformdirs.user_config_dir,
    "data": platformdirs.user_data_dir,
}


def user_path(env: str, kind: Kind, name: str) -> Path:
    """`$env` if it is set, else `name` in frugal's user `kind` directory."""
    value = os.environ.get(env)
    return Path(value) if value else _user_dir(kind, *(os.environ.get(v) for v in _HOME)) / name


_HOME = ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME")


@cache
def _user_dir(kind: Kind, *home: str | None) -> Path:
    """platformdirs' answer, asked once per process for the same home (a plan asks for the
    calibration file per GPU and method)."""
    return Path(_DIRS[kind]("frugal"))


def cache_dir(name: str) -> Path:
    """`name` in frugal's cache: under `FRUGAL_CACHE_DIR` when set (profiles/, data/)."""
    return user_path("FRUGAL_CACHE_DIR", "cache", "") / name
