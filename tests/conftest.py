"""Shared test set-up: profiles cached in a per-session temporary dir, never the user's."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("FRUGAL_CACHE_DIR")
    os.environ["FRUGAL_CACHE_DIR"] = str(tmp_path_factory.mktemp("profiles"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    yield
    if old is None:
        os.environ.pop("FRUGAL_CACHE_DIR", None)
    else:
        os.environ["FRUGAL_CACHE_DIR"] = old
