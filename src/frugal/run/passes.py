"""The passes a task runs before training (`step.tasks.base.Pass`: a preference task's
reference log-probabilities, a distillation's teacher top k), run one way for every task.

Each pass over a set of rows (the training rows, then the validation rows) is kept in the
output directory as a folder, `passes/<name>-<key>/`, keyed by a digest of the rows as the
batches give them, the pass's own key (a teacher's config, k) and the compute dtype: one
`.npy` file per output, one entry per row, and `record.json` with each file's dtype,
shape, size and sha256. A resumed run reads the folder instead of running the pass again
(before a checkpoint's weights are restored: the pass reads the model as built).

* Shared out: each process computes every world-th row into the files the main process
  made (the output directory is on storage every node reads, as for checkpoints).
* Whole or not at all: the files are written into `<name>-<key>.part/`, and the main
  process records their checksums and renames the folder into place once every process is
  done; a cut-off pass leaves no folder a later session would read.
* Checked before any step reads it: a folder whose record is missing or unreadable, whose
  file is missing, of another size (truncated, emptied), with a header numpy cannot read,
  of another dtype or shape, or whose bytes differ from their sha256 (ids overwritten by
  other valid ids, random bytes) is said in one line and computed again, as a damaged
  checkpoint is passed over for an intact one. The main process checks and tells the
  others.

The batches then carry each output (`Batcher.carried`), memory-mapped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from frugal.data.examples import Batcher
from frugal.errors import FrugalError, notice
from frugal.files import replacing
from frugal.run.build import compute_dtype
from frugal.step.extra import build_frozen
from frugal.step.tasks.base import Pass

RECORD = "record.json"


def run_passes(run: Any) -> None:
    """Every pass the run's task declares, over its training and validation rows, read from
    the output directory where an earlier session made them intact, else computed."""
    job = run.cfg.job
    dtype = compute_dtype(job, run.precision)
    for p in run.task.passes(job):
        todo = [b for b in (run.batches, run.val_batches) if len(b)]
        folders = {id(b): run.out / "passes" / f"{p.name}-{pass_key(p, b, dtype)}" for b in todo}
        redo = [b for b in todo if not _intact(run, p, b, folders[id(b)])]
        if redo:
            _compute(run, p, redo, [folders[id(b)] for b in redo], dtype)
        for b in todo:
            carry(p, b, folders[id(b)])


def pass_key(p: Pass, batches: Batcher, dtype: torch.dtype) -> str:
    """What a pass's results depend on: the rows, the pass's own key and the dtype."""
    blob = json.dumps([p.name, batches.digest(), p.key(), str(dtype)], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def expected(run: Any, p: Pass, batches: Batcher) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each output's dtype and shape over `batches`' rows (each of the job's length, of the
    task's sequences)."""
    seq, sequences = run.cfg.job.seq, run.task.sequences_per_row
    return {o.name: (o.dtype, (len(batches), *o.row_shape(seq, sequences))) for o in p.outputs}


def damage(folder: Path, want: dict[str, tuple[str, tuple[int, ...]]]) -> str | None:
    """Why the pass in `folder` cannot be read as it is (None: intact); raises
    FileNotFoundError where there is none."""
    if not folder.is_dir():
        raise FileNotFoundError(folder)
    try:
        record = json.loads((folder / RECORD).read_text())["files"]
        files = {n: (int(record[n]["bytes"]), str(record[n]["sha256"])) for n in want}
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {RECORD} is missing or unreadable"
    for name, (dtype, shape) in want.items():
        path, (recorded, digest) = folder / f"{name}.npy", files[name]
        if not path.is_file():
            return f"{path.name} is missing"
        size = path.stat().st_size
        if size != recorded:
            return f"{path.name} is {size:,} bytes where its record says {recorded:,}"
        try:
            a = np.load(path, mmap_mode="r")
        except (OSError, ValueError):
            return f"{path.name} has no readable .npy header"
        if a.dtype != np.dtype(dtype) or a.shape != shape:
            return f"{path.name} holds {a.dtype} {a.shape} where {dtype} {shape} belongs"
        del a
        if _sha256(path) != digest:
            return f"{path.name}'s bytes differ from their sha256 in {RECORD}"
    return None


def _intact(run: Any, p: Pass, batches: Batcher, folder: Path) -> bool:
    """Whether `folder` holds the pass intact: the main process checks (a damaged folder is
    said and removed) and tells the others."""
    ok = False
    if run.main:
        try:
            why = damage(folder, expected(run, p, batches))
        except FileNotFoundError:
            why = None
        else:
            ok = why is None
        if why is not None:
            said = f"the {p.name} pass in {folder} was damaged ({why}): computed again"
            notice(said)
            run.notes.append(said)
            shutil.rmtree(folder, ignore_errors=True)
    if run.world > 1:
        from accelerate.utils import broadcast_object_list

        (ok,) = broadcast_object_list([ok])
    return bool(ok)


def _compute(
    run: Any, p: Pass, todo: list[Batcher], folders: list[Path], dtype: torch.dtype
) -> None:
    """Run the pass over each set of rows in `todo` into its folder: the model as built, or
    the one the pass names, made for it and freed after."""
    model = run.unwrapped
    if p.model is not None:
        model = build_frozen(p.model, model, run.cfg.job, dtype).to(run.acc.device)
    was_training = model.training
    model.eval()
    try:
        for batches, folder in zip(todo, folders, strict=True):
            _write(run, p, batches, folder, model)
    finally:
        if p.model is not None:
            del model
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        elif was_training:
            model.train()


def _write(run: Any, p: Pass, batches: Batcher, folder: Path, model: Any) -> None:
    acc, want = run.acc, expected(run, p, batches)
    part = folder.with_name(folder.name + ".part")
    if run.main:
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        for name, (dtype, shape) in want.items():
            np.lib.format.open_memmap(part / f"{name}.npy", "w+", np.dtype(dtype), shape).flush()
    acc.wait_for_everyone()
    out = {name: np.load(part / f"{name}.npy", mmap_mode="r+") for name in want}
    mine = list(range(acc.process_index, len(batches), run.world))
    with torch.no_grad(), acc.autocast():  # as the step would run it
        for i in range(0, len(mine), run.eval_micro):
            idx = mine[i : i + run.eval_micro]
            b = {name: v.to(acc.device) for name, v in batches(idx).items()}
            with p.context(model):
                got = p.compute(model, b)
            for name, t in got.items():
                values = t.cpu().numpy()
                out[name][idx, : values.shape[1]] = values
    for a in out.values():
        a.flush()
    del out
    acc.wait_for_everyone()
    if run.main:
        _seal(part, folder, list(want))
    acc.wait_for_everyone()


def _seal(part: Path, folder: Path, names: list[str]) -> None:
    """Record the files' sizes and checksums, then rename the folder into place."""
    files = {}
    for name in names:
        path = part / f"{name}.npy"
        files[name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    with replacing(part / RECORD) as tmp:
        tmp.write_text(json.dumps({"files": files}, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(part, folder)


def carry(p: Pass, batches: Batcher, folder: Path) -> None:
    """The batches carry the pass's outputs from then on, memory-mapped."""
    for o in p.outputs:
        try:
            batches.carried[o.name] = (np.load(folder / f"{o.name}.npy", mmap_mode="r"), o)
        except (OSError, ValueError) as e:  # removed under the run since it was checked
            raise FrugalError(
                f"the {p.name} pass in {folder} could not be read ({e}): resume again, and "
                "it is computed again"
            ) from None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()
