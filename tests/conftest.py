"""Shared test set-up: profiles cached in a per-session temporary dir, never the user's."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from frugal.models.specs import ModelSpec, load_spec


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("FRUGAL_CACHE_DIR")
    os.environ["FRUGAL_CACHE_DIR"] = str(tmp_path_factory.mktemp("profiles"))
    os.environ["FRUGAL_MEASUREMENTS"] = str(tmp_path_factory.mktemp("m") / "measurements.jsonl")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    yield
    if old is None:
        os.environ.pop("FRUGAL_CACHE_DIR", None)
    else:
        os.environ["FRUGAL_CACHE_DIR"] = old


# -- tiny models written from configs (shared by the estimate, CLI and model tests) ---------

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 512,
}


def write_config(directory: Path, config: dict[str, Any]) -> Path:
    """Write `config` as `directory/config.json` and return the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("tiny-llama"), TINY_LLAMA)


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_dir: Path) -> ModelSpec:
    return load_spec(str(tiny_llama_dir / "config.json"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` need CUDA; without it they are skipped, not failed."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
