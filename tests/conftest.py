"""Shared test set-up: profiles cached in a per-session temporary dir, never the user's."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from frugal.cli.main import main
from frugal.config import RunConfig, apply_overrides, validate_run_config
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


# -- the command line, called in process ----------------------------------------------------


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    obj = json.loads(lines[0])
    assert isinstance(obj, dict)
    return obj


def run_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 2, (rc, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error:")
    return lines[0]


# -- a tiny training run on the bundled example model and data ------------------------------

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny-llama"
DATA = ROOT / "examples" / "data"


def make_cfg(out: Path, *overrides: str) -> RunConfig:
    base: dict[str, Any] = {
        "model": str(TINY),
        "init": "random",
        "job": {
            "method": "lora",
            "precision": "fp32",
            "lora_r": 8,
            "batch": 4,
            "seq": 96,
            "grad_checkpointing": False,
        },
        "data": {"path": str(DATA / "spell.jsonl"), "epochs": 1},
        "training": {
            "effective_batch": 8,
            "learning_rate": 0.01,
            "eval_every": 0,
            "loggers": ["jsonl"],
            "warmup_ratio": 0.0,
        },
        "output_dir": str(out),
    }
    return validate_run_config(apply_overrides(base, list(overrides)), "test")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` need CUDA; without it they are skipped, not failed."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
