"""Each task's training and validation rows as `frugal train` reads them (`ROWS`, by task
name; a task's step is in `step/tasks/`, which sits below `data`), with a note on what the
sequence length cut."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from frugal.config import RunConfig
from frugal.data.examples import Rows, load_examples, pack, split, unpacked
from frugal.data.labels import LabelledRows, read_labelled, tokenize_labelled
from frugal.data.stats import DataStats
from frugal.data.tokens import Examples

TaskRows = tuple[Any, Any, list[str]]  # training rows, validation rows, notes


def token_rows(cfg: RunConfig, tok: Any) -> tuple[Rows, Rows, list[str]]:
    """A causal LM's rows: its examples packed into full rows, or one example each."""
    job = cfg.job
    assert cfg.data.path  # refuse_unsupported checked it
    st = DataStats()
    examples = load_examples(cfg.data.path, tok, job.seq, cfg.data.format, st)
    notes = [cut] if (cut := st.cut(job.seq, "job.seq")) else []
    if cfg.data.val_path:
        train_ex, val_ex = examples, load_examples(cfg.data.val_path, tok, job.seq, cfg.data.format)
    else:
        train_ex, val_ex = split(examples, cfg.data.val_ratio, cfg.training.seed)

    def to_rows(ex: Examples) -> Rows:
        return pack(ex, job.seq, tok.pad_token_id) if job.packing else unpacked(ex)

    return to_rows(train_ex), to_rows(val_ex), notes


def labelled_rows(cfg: RunConfig, tok: Any) -> tuple[LabelledRows, LabelledRows, list[str]]:
    """A classifier's training and validation rows (the validation file's labels must be
    classes of the training file's), and a note on the texts cut to the sequence length."""
    assert cfg.data.path
    train, classes = read_labelled(cfg.data.path)
    if cfg.data.val_path:
        val = read_labelled(cfg.data.val_path, classes)[0]
    else:
        train, val = split(train, cfg.data.val_ratio, cfg.training.seed)
    seq = cfg.job.seq
    rows, val_rows = (tokenize_labelled(x, classes, tok, seq) for x in (train, val))
    cut = rows.cut + val_rows.cut
    note = f"{cut:,} texts longer than job.seq={seq} were cut to it"
    return rows, val_rows, [note] if cut else []


ROWS: dict[str, Callable[[RunConfig, Any], TaskRows]] = {
    "causal": token_rows,
    "classification": labelled_rows,
}


def task_rows(cfg: RunConfig, tok: Any) -> TaskRows:
    """The run's training and validation rows, read as its task reads them."""
    return ROWS[cfg.job.task](cfg, tok)
