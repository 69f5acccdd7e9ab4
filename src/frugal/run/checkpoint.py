"""Atomic, resumable checkpoints.

A checkpoint is a directory `checkpoints/step-NNNNNNNN/` holding `tensors/` (the trainable
weights, the LoRA adapter or every weight of a full fine-tune, and the optimizer state, in
PyTorch's distributed checkpoint format: each process writes its own shard under FSDP, and
a resume on another number of processes reshards), the scheduler and loss-scaler states,
one RNG file per process and `state.json` (step, tokens, dollars, best evaluation,
micro-batch). It is written into a hidden temporary directory with a `COMPLETE` marker
listing each file, its size and its SHA-256; every file and the marker are fsynced, then the
directory is renamed into place and its parent fsynced. A crash at any point leaves either
the previous checkpoints untouched or a temporary directory that `latest()` ignores and the
next save removes. A checkpoint without a marker, or whose files do not match the marker
(in size: `is_complete`, cheap; in content: `damage`, read whole before a resume), is never
resumed from: the resume falls back to the newest intact one.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from frugal.errors import FrugalError
from frugal.files import fsync_dir as _fsync_dir
from frugal.files import fsync_file as _fsync_file
from frugal.run.interrupt import held
from frugal.run.state import TrainState

MARKER = "COMPLETE"
PREFIX = "step-"


def rng_state() -> dict[str, Any]:

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def whole(p: torch.Tensor) -> torch.Tensor:
    """A tensor whole: FSDP's shards (a DTensor) gathered from every process."""
    from torch.distributed.tensor import DTensor

    return p.full_tensor() if isinstance(p, DTensor) else p


def trainable_state(model: torch.nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
    """The trainable weights, whole, on the CPU. Under FSDP every process must call it (each
    weight is gathered in turn, one at a time on the GPU); only where `keep` is the result
    kept (the main process), so the CPU holds one copy."""
    out = {}
    for n, p in model.named_parameters():
        if p.requires_grad:
            full = whole(p.detach())
            if keep:
                out[n] = full.to("cpu", copy=True).contiguous()
    return out


def load_trainable(model: torch.nn.Module, path: Path) -> None:
    """Copy whole trainable weights saved by `trainable_state` into `model`; under FSDP
    every process calls it and keeps its own shard."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = dict(model.named_parameters())
    with safe_open(str(path), framework="pt") as f:
        saved = set(f.keys())
        missing = [n for n, p in params.items() if p.requires_grad and n not in saved]
        unknown = [n for n in saved if n not in params]
        if missing or unknown:
            raise FrugalError(
                f"{path} does not match this model ({len(missing)} weights missing, "
                f"{len(unknown)} unknown, e.g. {(missing + unknown)[0]}): resume with the run "
                "config the checkpoint was made with"
            )
        with torch.no_grad():
            for n in (n for n in params if n in saved):  # the same order on every process
                p, t = params[n], f.get_tensor(n)
                if isinstance(p, DTensor):
                    t = distribute_tensor(t.to(p.device), p.device_mesh, p.placements)
                p.copy_(t)


def _tensor_states(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """The trainable weights and the optimizer state, as distributed-checkpoint state dicts
    (FSDP shards stay shards; frozen weights are left out: they come from the base model)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, optim = get_state_dict(model, optimizer)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {"model": {k: v for k, v in weights.items() if k in trainable}, "optim": optim}


def save_tensors(path: Path, model: torch.nn.Module, optimizer: Any) -> None:
    """Write the trainable weights and optimizer state under `path`; every process calls it
    and writes its part (the main process also the metadata)."""
    import torch.distributed.checkpoint as dcp

    # not fsynced here: `commit` fsyncs every file of the checkpoint once
    writer = dcp.FileSystemWriter(str(path), sync_files=False)
    with _unwrapped():
        dcp.save(_tensor_states(model, optimizer), storage_writer=writer)


@contextmanager
def _unwrapped() -> Iterator[None]:
    """torch's distributed checkpoint wraps what failed in a write or read (a second Ctrl-C,
    a full disk) in a CheckpointException, a BaseException nothing else expects: it left
    `frugal train` with a traceback and exit 1. Raise what failed instead, this process's
    own where it has one."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as e:
        failures = e.failures
        rank = next(iter(failures)) if failures else None
        if rank is None:
            raise
        own = _rank()
        exc, _ = failures.get(own, failures[rank])
        raise exc from None


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def load_tensors(path: Path, model: torch.nn.Module, optimizer: Any) -> None:
    """Restore what `save_tensors` wrote, resharded for this number of processes."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    states = _tensor_states(model, optimizer)
    with _unwrapped():
        dcp.load(states, checkpoint_id=str(path))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=states["model"],
        optim_state_dict=states["optim"],
        options=StateDictOptions(strict=False),  # the frozen weights are not in it
    )


def staging(root: Path, step: int) -> Path:
    """Where the checkpoint of `step` is written before it is committed."""
    return root / f".tmp-{PREFIX}{step:08d}"


def begin(root: Path, step: int) -> Path:
    """A fresh, empty staging directory for `step` (the main process only); what a crash
    left of an earlier save is removed."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".tmp-{PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = staging(root, step)
    tmp.mkdir()
    return tmp


def commit(tmp: Path, state: TrainState, keep: int) -> Path:
    """Mark the filled staging directory complete and rename it into place; keeps the
    newest `keep` checkpoints."""
    step = state.step
    final = tmp.parent / f"{PREFIX}{step:08d}"
    (tmp / "state.json").write_text(state.to_json())
    found = _files(tmp)
    files = {
        str(f.relative_to(tmp)): {"bytes": f.stat().st_size, "sha256": digest}
        for f, digest in zip(found, _digests(found), strict=True)
    }
    (tmp / MARKER).write_text(json.dumps({"step": step, "files": files}))
    swap_in(tmp, final)  # fsyncs every file and the marker, then renames: the commit
    for old in complete(tmp.parent)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _files(root: Path) -> list[Path]:
    return sorted(f for f in root.rglob("*") if f.is_file())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _digests(files: list[Path]) -> list[str]:
    """SHA-256 of each file, several at once (hashlib lets go of the GIL on big buffers:
    a sharded checkpoint's files hash in parallel, at ~1.4 GB/s a core with SHA-NI)."""
    if len(files) < 2:
        return [_sha256(f) for f in files]
    with ThreadPoolExecutor(max_workers=min(8, len(files))) as pool:
        return list(pool.map(_sha256, files))


def _recorded(path: Path) -> dict[str, Any]:
    """The marker's files: {name: {"bytes": n, "sha256": hex}}; a marker of an earlier
    frugal recorded sizes only ({name: n})."""
    files = dict(json.loads((path / MARKER).read_text())["files"])
    return {k: v if isinstance(v, dict) else {"bytes": v} for k, v in files.items()}


def swap_in(tmp: Path, final: Path) -> None:
    """Make the finished directory `tmp` be `final`: fsynced, then renamed; an existing
    `final` is moved aside first and removed after, so one of the two is always whole."""
    for f in _files(tmp):
        _fsync_file(f)
    for d in sorted((d for d in tmp.rglob("*") if d.is_dir()), reverse=True):
        _fsync_dir(d)
    _fsync_dir(tmp)
    aside = final.with_name(f".old-{final.name}")
    shutil.rmtree(aside, ignore_errors=True)  # left by a crash during an earlier swap
    with held():  # a second Ctrl-C between the two renames would leave neither in place
        if final.exists():
            final.rename(aside)
        tmp.rename(final)
    _fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def incomplete_reason(path: Path) -> str | None:
    """Why `path` is not a checkpoint to resume from, or None when it is one."""
    try:
        files = _recorded(path)
        sizes = {name: int(f["bytes"]) for name, f in files.items()}
    except FileNotFoundError:
        return f"no {MARKER} marker (its writing was cut off)"
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MARKER} marker is unreadable"
    for name, size in sizes.items():
        try:
            have = (path / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if have != size:
            return f"{name} has {have:,} bytes where {size:,} were written (truncated or changed)"
    return None


def damage(path: Path) -> str | None:
    """Why the complete checkpoint `path` must not be resumed from, its files read whole:
    a file whose bytes differ from those written (same size, other content: a bad disk, a
    copy gone wrong) or a training state that does not read; None when it is intact."""
    why = incomplete_reason(path)
    if why is not None:
        return why
    files = _recorded(path)
    named = [name for name, f in files.items() if "sha256" in f]
    for name, digest in zip(named, _digests([path / n for n in named]), strict=True):
        if digest != files[name]["sha256"]:
            return f"{name} does not match the checksum written with it (damaged)"
    try:
        TrainState.read(path)
    except FrugalError as e:
        if named:  # it reads as written: a state of another frugal, not damage
            raise
        return f"state.json does not read ({e})"
    return None


def is_complete(path: Path) -> bool:
    return incomplete_reason(path) is None


def skipped(root: Path, resumed: Path | None) -> list[str]:
    """Checkpoints newer than `resumed` that a resume passes over, each with why."""
    if not root.is_dir():
        return []
    after = resumed.name if resumed else ""
    out = []
    for p in sorted(root.glob(f"*{PREFIX}*"), key=lambda p: p.name.removeprefix(".tmp-")):
        step_name = p.name.removeprefix(".tmp-")
        if not p.is_dir() or step_name <= after:
            continue
        if p.name.startswith(".tmp-"):
            out.append(f"{step_name} was still being written when the run stopped")
        elif (why := incomplete_reason(p)) is not None:
            out.append(f"{p.name}: {why}")
    return out


def complete(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"{PREFIX}*") if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: p.name)


def latest(root: Path) -> Path | None:
    done = complete(root)
    return done[-1] if done else None


def read_state(path: Path) -> TrainState:
    return TrainState.read(path)


@dataclass
class Parts:
    """What a checkpoint holds besides the training state: the model (unwrapped), the torch
    optimizer, the LR scheduler and accelerate's Accelerator (processes, loss scaler)."""

    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    acc: Any


class Checkpoints:
    """The checkpoints of one run directory: find, save, restore. Every process calls
    `save` and `restore` (each writes and reads its own shard and RNG state); the main
    process writes the rest and commits."""

    def __init__(self, root: Path, keep: int) -> None:
        self.root, self.keep = root, keep

    def latest(self) -> Path | None:
        return latest(self.root)

    def any(self) -> bool:
        return bool(complete(self.root))

    def skipped(self, resumed: Path | None) -> list[str]:
        return skipped(self.root, resumed)

    def intact(self, newest: Path) -> tuple[Path | None, list[str]]:
        """The newest intact checkpoint from `newest` back, read whole (`damage`), with a
        note for each damaged one passed over; None when none is intact. A damaged one is
        renamed `damaged-step-N` once an intact one is found (kept for a look, never again
        taken for a checkpoint, nor counted among those kept)."""
        damaged: list[tuple[Path, str]] = []
        for p in reversed([c for c in complete(self.root) if c.name <= newest.name]):
            why = damage(p)
            if why is None:
                for d, _ in damaged:
                    aside = d.with_name(f"damaged-{d.name}")
                    shutil.rmtree(aside, ignore_errors=True)  # damaged there before, again
                    d.rename(aside)
                return p, [
                    f"skipped checkpoint {d.name}: {w} (moved to damaged-{d.name})"
                    for d, w in damaged
                ]
            damaged.append((p, why))
        return None, [f"checkpoint {d.name}: {w}" for d, w in damaged]

    def save(self, state: TrainState, parts: Parts) -> Path:
        acc = parts.acc
        main = bool(acc.is_main_process)
        tmp = begin(self.root, state.step) if main else staging(self.root, state.step)
        acc.wait_for_everyone()  # the staging directory exists, and is empty
        save_tensors(tmp / "tensors", parts.model, parts.optimizer)
        rngs = [rng_state()]
        if acc.num_processes > 1:
            import torch.distributed as dist

            gathered: list[Any] = [None] * acc.num_processes
            dist.all_gather_object(gathered, rngs[0])  # also: every shard is written
            rngs = gathered
        if main:
            scaler = acc.scaler.state_dict() if acc.scaler is not None else None
            torch.save(
                {"scheduler": parts.scheduler.state_dict(), "scaler": scaler},
                tmp / "scheduler.pt",
            )
            for r, rng in enumerate(rngs):
                torch.save(rng, tmp / f"rng-{r}.pt")
            commit(tmp, state, self.keep)
        acc.wait_for_everyone()
        return self.root / f"{PREFIX}{state.step:08d}"

    def restore(self, path: Path, parts: Parts) -> tuple[TrainState, bool]:
        """The saved state, with weights, optimizer, scheduler, scaler and RNG restored;
        the flag says whether this process's RNG stream was (the same number of
        processes wrote it), else the caller reseeds."""
        state = TrainState.read(path)
        if not (path / "tensors").is_dir():
            raise FrugalError(
                f"{path} was written by an older frugal (no tensors/): resume it with that "
                "version, or start again in a new output_dir"
            )
        load_tensors(path / "tensors", parts.model, parts.optimizer)
        sched = _load(path / "scheduler.pt")
        parts.scheduler.load_state_dict(sched["scheduler"])
        if sched["scaler"] is not None and parts.acc.scaler is not None:
            parts.acc.scaler.load_state_dict(sched["scaler"])
        rng = path / f"rng-{parts.acc.process_index}.pt"
        same = state.world == parts.acc.num_processes and rng.exists()
        if same:
            set_rng_state(_load(rng))
        return state, same


def _load(path: Path) -> Any:
    """A checkpoint file, onto the CPU first (not every process's state onto GPU 0)."""
    return torch.load(path, map_location="cpu", weights_only=False)


def save_best(out: Path, model: torch.nn.Module, step: int, main: bool) -> None:
    """The trainable weights of the best evaluation so far, in `out/best/`, swapped in whole
    (under FSDP every process calls it; the main process writes)."""
    weights = trainable_state(model, keep=main)
    if not main:
        return
    from safetensors.torch import save_file

    tmp = out / ".tmp-best"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(weights, str(tmp / "trainable.safetensors"))
    (tmp / "step.json").write_text(json.dumps({"step": step}))
    swap_in(tmp, out / "best")


def best_step(out: Path) -> int | None:
    """The step whose weights `out/best/` holds, if any."""
    path = out / "best" / "step.json"
    return int(json.loads(path.read_text())["step"]) if path.exists() else None
