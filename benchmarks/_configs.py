"""Model configs the benchmarks make: a bundled model that no shipped profile covers."""

from __future__ import annotations

import json
from pathlib import Path

from frugal.models.specs import read_bundled


def unbundled(model: str, root: Path) -> str:
    """A local config.json of `model` with one more vocabulary row: a model no profile
    ships for, the same work to simulate."""
    cfg = {k: v for k, v in read_bundled(model).items() if not k.startswith("_frugal")}
    cfg["vocab_size"] += 1
    d = root / model.replace("/", "--")
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d / "config.json")
