"""Atomic, resumable checkpoints.

A checkpoint is a directory `checkpoints/step-NNNNNNNN/` holding the trainable weights
(`trainable.safetensors`: the LoRA adapter, or every weight of a full fine-tune), the
optimizer, scheduler and loss-scaler states, one RNG file per process and `state.json`
(step, tokens, dollars, best evaluation, micro-batch). It is written into a hidden temporary
directory with a `COMPLETE` marker listing each file and its size; every file and the
marker are fsynced, then the directory is renamed into place and its parent fsynced. A
crash at any point leaves either the previous checkpoints untouched or a temporary
directory that `latest()` ignores and the next save removes. A checkpoint without a
marker, or whose files do not match the marker, is never resumed from.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from frugal.files import fsync_dir as _fsync_dir
from frugal.files import fsync_file as _fsync_file

MARKER = "COMPLETE"
PREFIX = "step-"


def rng_state() -> dict[str, Any]:
    import numpy as np

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().to("cpu", copy=True).contiguous()
        for n, p in model.named_parameters()
        if p.requires_grad
    }


def load_trainable(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import load_file

    saved = load_file(str(path))
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in saved]
    unknown = [n for n in saved if n not in params]
    if missing or unknown:
        from frugal.errors import FrugalError

        raise FrugalError(
            f"{path} does not match this model ({len(missing)} weights missing, "
            f"{len(unknown)} unknown, e.g. {(missing + unknown)[0]}): resume with the run "
            "config the checkpoint was made with"
        )
    with torch.no_grad():
        for n, t in saved.items():
            params[n].copy_(t)


def save(
    root: Path,
    step: int,
    write: Callable[[Path], None],
    state: dict[str, Any],
    keep: int,
) -> Path:
    """Write a checkpoint for `step` atomically; `write(tmp)` fills in the tensors.
    Keeps the newest `keep` checkpoints."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f".tmp-{PREFIX}{step:08d}"
    for stale in root.glob(f".tmp-{PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir())}
    (tmp / MARKER).write_text(json.dumps({"step": step, "files": files}))
    swap_in(tmp, final)  # fsyncs every file and the marker, then renames: the commit
    for old in complete(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def swap_in(tmp: Path, final: Path) -> None:
    """Make the finished directory `tmp` be `final`: fsynced, then renamed; an existing
    `final` is moved aside first and removed after, so one of the two is always whole."""
    for f in tmp.iterdir():
        if f.is_file():
            _fsync_file(f)
    _fsync_dir(tmp)
    aside = final.with_name(f".old-{final.name}")
    shutil.rmtree(aside, ignore_errors=True)  # left by a crash during an earlier swap
    if final.exists():
        final.rename(aside)
    tmp.rename(final)
    _fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def is_complete(path: Path) -> bool:
    try:
        marker = json.loads((path / MARKER).read_text())
        return all((path / n).stat().st_size == size for n, size in marker["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def complete(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"{PREFIX}*") if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: p.name)


def latest(root: Path) -> Path | None:
    done = complete(root)
    return done[-1] if done else None


def read_state(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "state.json").read_text()))
