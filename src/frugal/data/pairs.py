"""Preference data: rows of a prompt with a chosen and a rejected completion (DPO, IPO,
ORPO, SimPO), or a prompt with one completion and a `label` saying whether it is
desirable (KTO's unpaired rows), as TRL reads them.

A prompt and completions are strings, or (conversational rows) lists of `{role, content}`
messages rendered with the tokenizer's chat template: the prompt with the generation
prompt, a completion as the rest of the whole conversation's text. A sequence is the
prompt's tokens (with the tokenizer's special tokens) then the completion's and EOS (as
`prompt_completion` rows are tokenized for causal training); only the completion is
trained. A sequence longer than `seq` is cut to it; a pair whose cut leaves a completion
without a token is dropped and counted.

A KTO row's KL term reads its prompt with another row's completion: row i's is row
i + 1's (the last row's, the first's), fixed when the file is read, so that the reference's
log-probabilities of it can be computed once (`job.reference: precomputed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from frugal.data.rows import messages, read_rows, text
from frugal.errors import FrugalError
from frugal.step import IGNORE
from frugal.step.tasks.preference import METHODS

PAIR_KEYS = ("prompt", "chosen", "rejected")


@dataclass
class PreferenceRow:
    """One row as read: its prompt and completions (strings, or message lists), and for KTO
    whether its completion is desirable."""

    prompt: Any
    chosen: Any
    rejected: Any = None  # None: an unpaired (KTO) row
    desirable: bool = True
    where: str = ""


@dataclass
class PairRows:
    """Tokenized preference rows as `frugal train` reads them: each row's prompt tokens and
    its two completions' (KTO: the completion, and the mismatched one of the next row),
    cut to the sequence length."""

    prompts: list[list[int]]
    chosen: list[list[int]]
    rejected: list[list[int]]
    desirable: list[bool] | None = None  # KTO rows: whether each completion is desirable
    dropped: int = 0  # rows whose completion the cut left empty
    cut: int = 0  # sequences cut to the sequence length

    def __len__(self) -> int:
        return len(self.prompts)

    def sequences(self, i: int) -> tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]:
        """Row i's two sequences as (tokens, labels): the prompt masked."""
        p = self.prompts[i]
        mask = [IGNORE] * len(p)
        return (
            (p + self.chosen[i], mask + self.chosen[i]),
            (p + self.rejected[i], mask + self.rejected[i]),
        )

    def take(self, index: Sequence[int]) -> PairRows:
        idx = list(index)
        return PairRows(
            [self.prompts[i] for i in idx],
            [self.chosen[i] for i in idx],
            [self.rejected[i] for i in idx],
            None if self.desirable is None else [self.desirable[i] for i in idx],
        )


def read_preferences(path: str) -> list[PreferenceRow]:
    """The rows of a preference file: all paired (prompt, chosen, rejected) or all KTO
    (prompt, completion, label); a row that is neither, or of the other kind, is named."""
    rows: list[PreferenceRow] = []
    kind = ""
    for where, row in read_rows(path):
        paired, kto = "chosen" in row or "rejected" in row, "completion" in row
        got = "pairs" if paired else "kto" if kto else ""
        if not got:
            keys = ", ".join(sorted(row)) or "none"
            raise FrugalError(
                f"{where}: a preference row needs prompt, chosen and rejected (or KTO's "
                f"prompt, completion and label); it has {keys}"
            )
        if kind and got != kind:
            raise FrugalError(
                f"{where}: a {got} row in a file of {kind} rows: give one kind per file"
            )
        kind = got
        rows.append(_pair(row, where) if got == "pairs" else _kto_row(row, where))
    if not rows:
        raise FrugalError(f"{path}: no rows")
    return rows


def is_kto(rows: list[PreferenceRow]) -> bool:
    """Whether the rows are KTO's unpaired ones (a file holds one kind)."""
    return rows[0].rejected is None


def read_for(path: str, method: str, flag: str) -> list[PreferenceRow]:
    """The rows of `path` for preference `method` (KTO reads unpaired rows, the others
    pairs); a file of the other kind is one line naming the fix as `flag` (`--preference `,
    `job.preference=`)."""
    rows = read_preferences(path)
    paired = METHODS[method].paired
    if is_kto(rows) == paired:
        others = [m for m, how in METHODS.items() if how.paired != paired]
        fix = others[0] if len(others) == 1 else f"{', '.join(others[:-1])} or {others[-1]}"
        has, reads = ("KTO", "paired") if paired else ("paired", "KTO")
        raise FrugalError(
            f"{path} holds {has} rows and {flag}{method} reads {reads} ones: give {flag}{fix}"
        )
    return rows


def _field(row: dict[str, Any], key: str, where: str) -> Any:
    value = row.get(key)
    if isinstance(value, list):
        return messages({"messages": value}, f"{where}: '{key}'")
    if key != "prompt" and (value is None or (isinstance(value, str) and not value.strip())):
        raise FrugalError(f"{where}: '{key}' is empty: every preference row needs one")
    return text(row, key, where)


def _pair(row: dict[str, Any], where: str) -> PreferenceRow:
    prompt, chosen, rejected = (_field(row, k, where) for k in PAIR_KEYS)
    return PreferenceRow(prompt, chosen, rejected, where=where)


def _kto_row(row: dict[str, Any], where: str) -> PreferenceRow:
    label = row.get("label")
    if isinstance(label, str) and label.strip().lower() in ("true", "false"):
        label = label.strip().lower() == "true"  # CSV
    if not isinstance(label, bool):
        raise FrugalError(
            f"{where}: a KTO row's 'label' is {'missing' if label is None else repr(label)}: "
            "give true (desirable) or false"
        )
    return PreferenceRow(
        _field(row, "prompt", where), _field(row, "completion", where), None, label, where
    )


def tokenize_preferences(rows: list[PreferenceRow], tok: Any, seq: int) -> PairRows:
    """The rows' tokens as the step reads them (module doc), each sequence cut to `seq`."""
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    kto = is_kto(rows)
    prompts, chosen, rejected, desirable = [], [], [], []
    cut = dropped = 0
    encoded = [_encode(r, tok, eos) for r in rows]
    for i, (r, (p, c, x)) in enumerate(zip(rows, encoded, strict=True)):
        if kto:  # the mismatched completion: the next row's
            x = encoded[(i + 1) % len(rows)][1]
        room = max(seq - len(p), 0)
        cut += (len(p) + len(c) > seq) + (len(p) + len(x) > seq)
        if room == 0 or not c[:room] or not x[:room]:
            dropped += 1
            continue
        prompts.append(p[:seq])
        chosen.append(c[:room])
        rejected.append(x[:room])
        desirable.append(r.desirable)
    if not prompts:
        raise FrugalError(
            f"no preference row keeps a completion token within job.seq={seq}: raise job.seq "
            "or shorten the prompts"
        )
    return PairRows(prompts, chosen, rejected, desirable if kto else None, dropped, cut)


def _encode(row: PreferenceRow, tok: Any, eos: list[int]) -> tuple[list[int], ...]:
    """(prompt tokens, chosen tokens, rejected tokens); the completions end with EOS where
    they are strings (a chat template ends its own turns)."""
    if isinstance(row.prompt, list):
        return _encode_chat(row, tok)
    prompt = tok(row.prompt)["input_ids"]
    done = [
        tok(c, add_special_tokens=False)["input_ids"] + eos if c is not None else []
        for c in (row.chosen, row.rejected)
    ]
    return prompt, done[0], done[1]


def _encode_chat(row: PreferenceRow, tok: Any) -> tuple[list[int], ...]:
    if getattr(tok, "chat_template", None) is None:
        raise FrugalError(
            f"{row.where}: conversational rows need the tokenizer's chat template, and this "
            "tokenizer has none: give string prompts and completions, or a chat model's "
            "tokenizer"
        )
    head = tok.apply_chat_template(row.prompt, tokenize=False, add_generation_prompt=True)
    prompt = tok(head, add_special_tokens=False)["input_ids"]
    out: list[list[int]] = []
    for c in (row.chosen, row.rejected):
        if c is None:
            out.append([])
            continue
        turns = c if isinstance(c, list) else [{"role": "assistant", "content": c}]
        whole = tok.apply_chat_template(row.prompt + turns, tokenize=False)
        if not whole.startswith(head):
            raise FrugalError(
                f"{row.where}: the chat template renders the prompt differently inside the "
                "whole conversation, so its completion cannot be told apart: give string "
                "prompts and completions"
            )
        out.append(tok(whole[len(head) :], add_special_tokens=False)["input_ids"])
    return prompt, out[0], out[1]


def collate_pairs(rows: PairRows, indices: list[int], pad_id: int) -> dict[str, Any]:
    """A preference micro-batch (`step.tasks.preference`): the chosen sequences, then the
    rejected (KTO: mismatched) ones, right-padded to the longest; KTO's `desirable` flags."""
    import torch

    from frugal.step.batch import layout

    seqs = [rows.sequences(i) for i in indices]
    both = [s[0] for s in seqs] + [s[1] for s in seqs]
    width = max(len(t) for t, _ in both)
    tokens = torch.full((len(both), width), pad_id, dtype=torch.long)
    labels = torch.full((len(both), width), IGNORE, dtype=torch.long)
    segments = torch.zeros((len(both), width), dtype=torch.long)
    for r, (t, lab) in enumerate(both):
        tokens[r, : len(t)] = torch.tensor(t)
        labels[r, : len(t)] = torch.tensor(lab)
        segments[r, : len(t)] = 1
    positions = torch.arange(width).expand(len(both), width).clone()
    b = layout(tokens, labels, segments, positions, packed=False)
    if rows.desirable is not None:
        b["desirable"] = torch.tensor([int(rows.desirable[i]) for i in indices])
    return b


def pair_stats(rows: list[PreferenceRow], tok: Any, seq: int) -> dict[str, Any]:
    """What `frugal data check --task preference` says of a file (`--json`): its rows,
    their tokens and lengths (a row's longer sequence, before the cut), and the problems
    that make pairs teach nothing or the wrong thing, each as a warning that names its fix."""
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    kto = is_kto(rows)
    encoded = [_encode(r, tok, eos) for r in rows]
    lengths = [len(p) + max(len(c), len(x)) for p, c, x in encoded]
    over = sum(n > seq for n in lengths)
    out: dict[str, Any] = {
        "rows": len(rows),
        "kind": "kto" if kto else "pairs",
        "tokens": sum(len(p) * (1 if kto else 2) + len(c) + len(x) for p, c, x in encoded),
        "identical_pairs": 0 if kto else sum(repr(r.chosen) == repr(r.rejected) for r in rows),
        "prompt_in_completion": sum(_leaks(r) for r in rows),
        "duplicates": _repeats(rows),
        "over_length": over,
        "over_length_share": over / len(rows),
        "dropped": sum(len(p) >= seq for p, _, _ in encoded),
    }
    warnings = _warnings(out, seq)
    if kto:
        good = sum(r.desirable for r in rows)
        out["desirable_share"] = good / len(rows)
        if not 0.25 <= good / len(rows) <= 0.75:
            warnings.append(
                f"{good} of {len(rows)} rows are desirable: KTO's authors keep lambda_D n_D / "
                "(lambda_U n_U) within 1 to 4/3: set training.kto_desirable_weight or "
                "kto_undesirable_weight to balance them"
            )
    return {**out, "lengths": lengths, "warnings": warnings}


def _repeats(rows: list[PreferenceRow]) -> int:
    """Rows that repeat an earlier one."""
    seen: set[str] = set()
    repeats = 0
    for r in rows:
        key = repr((r.prompt, r.chosen, r.rejected, r.desirable))
        repeats += key in seen
        seen.add(key)
    return repeats


def _warnings(out: dict[str, Any], seq: int) -> list[str]:
    """A preference file's problems (`pair_stats`'s counts), each with its fix."""
    said = {
        "identical_pairs": "{n} pairs have the same chosen and rejected completion: they "
        "teach nothing and dilute each step: drop them",
        "prompt_in_completion": "{n} completions begin with their prompt's text, which is "
        "then trained as if the model had to write it: keep the prompt out of chosen, "
        "rejected and completion",
        "over_length": "{n} rows ({share:.0%}) have a sequence longer than --seq {seq} "
        "tokens, cut to it: raise --seq or shorten them",
        "dropped": "{n} prompts fill --seq {seq} alone: those rows keep no completion token "
        "and are left out of training",
        "duplicates": "{n} rows repeat an earlier row and weigh more in training: dedupe the file",
    }
    share = out["over_length_share"]
    return [text.format(n=out[k], share=share, seq=seq) for k, text in said.items() if out[k]]


def _leaks(row: PreferenceRow) -> bool:
    """Whether a completion repeats its (string) prompt at its start."""
    if not isinstance(row.prompt, str) or not row.prompt.strip():
        return False
    head = row.prompt.strip()
    return any(
        isinstance(c, str) and c.strip().startswith(head) for c in (row.chosen, row.rejected)
    )
