"""What a task reads besides the trained model, made before training: its second model (a
full fine-tune's frozen reference copy, a distillation's teacher), or what that model
would give, computed once before the first update and kept in the output directory so
that a resumed run reads the same: preference tuning's reference log-probabilities of
every row (`job.reference: precomputed`, by the model as built), a distillation's
teacher's top k logits of every token (`job.teacher_logits: precomputed`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from frugal.data.examples import Batcher, load_tokenizer
from frugal.data.pairs import PairRows
from frugal.errors import FrugalError
from frugal.files import replacing
from frugal.step.model import DTYPES
from frugal.step.tasks.preference import policy_logps

REFERENCE_FILE = "reference_logps-{}.npy"  # by the rows' digest
TEACHER_FILES = "teacher_top{k}-{key}.{part}.npy"  # by the rows', the teacher's and k's digest


def same_tokenizer(cfg: Any, tok: Any) -> None:
    """A teacher with its own tokenizer files must map every token as the student's does:
    its logits are read token for token (a vocabulary of the same size can still differ)."""
    teacher = cfg.job.teacher
    if not teacher or not (Path(teacher) / "tokenizer_config.json").exists():
        return
    theirs = load_tokenizer(teacher, "give the teacher's directory with its tokenizer files")
    if theirs.get_vocab() != tok.get_vocab():
        raise FrugalError(
            f"job.teacher={teacher} has another tokenizer than the student's: distillation "
            "reads the teacher's logits token for token: pick a teacher of the same tokenizer"
        )


def extra_model(model: Any, cfg: Any, precision: str) -> Any:
    """The task's second, frozen model (a reference copy made from the freshly built one,
    a teacher), or None where it has none."""
    from frugal.step.tasks import task_of

    dtype = DTYPES[cfg.job.model_copy(update={"precision": precision}).compute_dtype]
    return task_of(cfg.job.task).extra_model(model, cfg.job, dtype)


def precompute(run: Any, batches: Batcher) -> None:
    """The reference's log-probabilities of `batches.rows` (a preference task's), read from
    the output directory when an earlier session of this run computed them; else computed
    by the model as it is now (before training: the reference), each process a share."""
    rows = batches.rows
    assert isinstance(rows, PairRows)
    if not len(rows):
        return
    path = Path(run.out) / REFERENCE_FILE.format(rows.digest())
    if path.exists():
        rows.ref_logps = np.load(path)
        return
    acc, model = run.acc, run.unwrapped
    out = torch.zeros((len(rows), 2), dtype=torch.float64, device=acc.device)
    mine = list(range(acc.process_index, len(rows), run.world))
    adapter_off = getattr(model, "disable_adapter", None)
    model.eval()
    with torch.no_grad(), adapter_off() if adapter_off else contextlib.nullcontext():
        for i in range(0, len(mine), run.eval_micro):
            idx = mine[i : i + run.eval_micro]
            b = {k: v.to(acc.device) for k, v in batches(idx).items()}
            with acc.autocast():
                logp = policy_logps(model, b)[0].double()
            out[idx] = torch.stack([logp[: len(idx)], logp[len(idx) :]], dim=1)
    if run.world > 1:
        out = acc.reduce(out, reduction="sum")
    rows.ref_logps = out.cpu().numpy().astype(np.float32)
    if run.main:
        with replacing(path) as tmp:
            np.save(tmp, rows.ref_logps)
    model.train()


def precompute_teacher(run: Any, batches: Batcher) -> None:
    """The teacher's top k logits of every token of `batches` (a distillation's, teacher
    logits precomputed) into two memory-mapped arrays (rows, seq, k) in the output
    directory, which the batches then carry: read where an earlier session of this run
    wrote them; else the teacher is loaded, each process computes its share of the rows,
    and the teacher is freed before training."""
    from frugal.step.tasks import task_of
    from frugal.step.tasks.distill import teacher_config

    job = run.cfg.job
    if not len(batches):
        return
    k = job.teacher_top_k  # no more than the vocabulary (checked with the teacher's config)
    dtype = DTYPES[job.model_copy(update={"precision": run.precision}).compute_dtype]
    blob = json.dumps([batches.digest(), job.teacher, teacher_config(job.teacher), str(dtype)])
    key = hashlib.sha256(blob.encode()).hexdigest()[:16]
    paths = {part: Path(run.out) / TEACHER_FILES.format(k=k, key=key, part=part)
             for part in ("ids", "logits")}  # fmt: skip
    if not all(p.exists() for p in paths.values()):
        online = job.model_copy(update={"teacher_logits": "online"})
        teacher = task_of(job.task).extra_model(run.unwrapped, online, dtype).to(run.acc.device)
        _teacher_pass(run, batches, teacher, k, paths)
        del teacher
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    batches.per_token = {
        "teacher_ids": np.load(paths["ids"], mmap_mode="r"),
        "teacher_logits": np.load(paths["logits"], mmap_mode="r"),
    }


def _teacher_pass(run: Any, batches: Batcher, teacher: Any, k: int, paths: dict[str, Path]) -> None:
    """Each process writes its rows into the files the main process made (the output
    directory is on storage every node reads); the main process renames them into place
    once all are done, so a cut-off pass leaves no file a resumed run would read."""
    from frugal.step.forward import forward

    acc, seq, n = run.acc, run.cfg.job.seq, len(batches)
    parts = {p: path.with_suffix(".part") for p, path in paths.items()}
    kinds = {"ids": np.int32, "logits": np.float16}
    if run.main:
        for p, tmp in parts.items():
            np.lib.format.open_memmap(tmp, mode="w+", dtype=kinds[p], shape=(n, seq, k)).flush()
    acc.wait_for_everyone()
    out = {p: np.load(tmp, mmap_mode="r+") for p, tmp in parts.items()}
    mine = list(range(acc.process_index, n, run.world))
    with torch.no_grad(), acc.autocast():  # as the step runs it online
        for i in range(0, len(mine), run.eval_micro):
            idx = mine[i : i + run.eval_micro]
            b = {name: v.to(acc.device) for name, v in batches(idx).items()}
            top = forward(teacher, b).logits.float().topk(k, dim=-1)
            width = top.values.shape[1]
            out["ids"][idx, :width] = top.indices.int().cpu().numpy()
            out["logits"][idx, :width] = top.values.half().cpu().numpy()
    for a in out.values():
        a.flush()
    del out
    acc.wait_for_everyone()
    if run.main:
        for p, tmp in parts.items():
            os.replace(tmp, paths[p])
    acc.wait_for_everyone()
