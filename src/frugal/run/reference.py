"""What a task reads besides the trained model, made before training: its second model (a
full fine-tune's frozen reference copy, a distillation's teacher), or (preference tuning's
`job.reference: precomputed`) the reference's log-probabilities of every training and
validation row, computed once by the model before its first update and kept in the output
directory, so that a resumed run reads the same ones."""

from __future__ import annotations

import contextlib
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
