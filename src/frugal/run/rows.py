"""Each task's training and validation rows as `frugal train` reads them (`ROWS`, by task
name; a task's step is in `step/tasks/`, which sits below `data`), with a note on what the
sequence length cut."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from frugal.config import RunConfig
from frugal.data.examples import Rows, load_examples, pack, split, unpacked
from frugal.data.labels import LabelledRows, read_labelled, tokenize_labelled
from frugal.data.pairs import PairRows, read_for, tokenize_preferences
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


def pair_rows(cfg: RunConfig, tok: Any) -> tuple[PairRows, PairRows, list[str]]:
    """Preference tuning's rows: pairs (or KTO's rows), the validation file's or a held-out
    share; notes on the sequences cut and the rows dropped by the cut."""
    assert cfg.data.path
    method = cfg.job.preference
    train = read_for(cfg.data.path, method, "job.preference=")
    if cfg.data.val_path:
        val = read_for(cfg.data.val_path, method, "job.preference=")
    else:
        train, val = split(train, cfg.data.val_ratio, cfg.training.seed)
    seq = cfg.job.seq
    rows = tokenize_preferences(train, tok, seq)
    val_rows = tokenize_preferences(val, tok, seq) if val else rows.take([])
    notes = []
    if cut := rows.cut + val_rows.cut:
        notes.append(f"{cut:,} sequences longer than job.seq={seq} were cut to it")
    if dropped := rows.dropped + val_rows.dropped:
        notes.append(
            f"{dropped:,} rows kept no completion token within job.seq={seq} and were left out"
        )
    return rows, val_rows, notes


ROWS: dict[str, Callable[[RunConfig, Any], TaskRows]] = {
    "causal": token_rows,
    "classification": labelled_rows,
    "preference": pair_rows,
    "distill": token_rows,  # the student's causal rows; the teacher reads the same tokens
}


def task_rows(cfg: RunConfig, tok: Any) -> TaskRows:
    """The run's training and validation rows, read as its task reads them."""
    return ROWS[cfg.job.task](cfg, tok)
