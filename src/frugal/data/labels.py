"""Classification data, without torch: each row a text (`text`) or a pair of texts
(`text_a`, `text_b`: two sentences whose relation is the class) and its `label`.

Labels are class names (`"positive"`) or integer ids (`0`, `1`, `"2"`), never both in one
file. Names become ids in sorted order, so a file read twice, or a validation file read
after its training file, gives every class the same id; ids are kept as they are, and
their names are the ids as text. What `frugal train` and `frugal data check` read for
`task: classification`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from frugal.data.rows import read_rows, text
from frugal.errors import FrugalError
from frugal.step.tasks import TASKS

PAIR = ("text_a", "text_b")
MAX_CLASSES = 10_000


@dataclass(frozen=True)
class Labelled:
    """One example: its text (or pair of texts), its class id, and where it is."""

    texts: tuple[str, ...]  # one text, or a pair
    label: int
    where: str


@dataclass(frozen=True)
class Classes:
    """The classes of a task: `names[i]` is the name of class id i."""

    names: tuple[str, ...]

    @classmethod
    def of(cls, raw: Iterable[tuple[Any, str]]) -> Classes:
        """The classes of the labels `raw` ((label, where) pairs) hold: names sorted, or
        ids 0..max (an id no row holds is still a class: the model has an output for it)."""
        seen: dict[str, str] = {}  # kind of label -> where it was first seen
        names, ids = set(), set()
        for value, where in raw:
            if _is_id(value):
                if int(value) >= MAX_CLASSES:  # ids are classes 0..max: this many outputs
                    raise FrugalError(
                        f"{where}: label id {int(value):,}: ids number the classes from 0, "
                        f"at most {MAX_CLASSES - 1:,}; give class names, or renumber the ids"
                    )
                ids.add(int(value))
                seen.setdefault("id", where)
            elif isinstance(value, str) and value.strip():
                names.add(value.strip())
                seen.setdefault("name", where)
            else:
                raise FrugalError(
                    f"{where}: label {value!r}: give a class name or an integer id of 0 or more"
                )
        if names and ids:
            raise FrugalError(
                f"labels mix class names ({seen['name']}) and integer ids ({seen['id']}): "
                "use one or the other in a file"
            )
        out = tuple(sorted(names)) if names else tuple(str(i) for i in range(max(ids) + 1))
        if len(out) < 2:
            raise FrugalError(f"{len(out)} class in the labels: a classifier needs 2 or more")
        if len(out) > MAX_CLASSES:
            raise FrugalError(f"{len(out):,} classes: at most {MAX_CLASSES:,}")
        return cls(out)

    @property
    def numbered(self) -> bool:
        """Classes given as integer ids (a name is never digits: digits are an id)."""
        return self.names[0] == "0"

    def id_of(self, value: Any, where: str) -> int:
        if self.numbered and _is_id(value) and int(value) < len(self.names):
            return int(value)
        name = str(value).strip()
        if name in self.names and not _is_id(value):
            return self.names.index(name)
        raise FrugalError(
            f"{where}: label {value!r} is no class of the training data "
            f"({', '.join(self.names[:8])}{', ...' if len(self.names) > 8 else ''})"
        )


def _is_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    if isinstance(value, float):
        return value.is_integer() and value >= 0
    return isinstance(value, str) and value.strip().isdigit()


def _texts(row: dict[str, Any], where: str) -> tuple[str, ...]:
    if "text" in row and not any(k in row for k in PAIR):
        return (text(row, "text", where),)
    if all(k in row for k in PAIR):
        return (text(row, PAIR[0], where), text(row, PAIR[1], where))
    raise FrugalError(
        f"{where}: a classification row needs `text` and `label`, or `text_a`, `text_b` and "
        f"`label` (found: {', '.join(sorted(row)) or 'nothing'})"
    )


def read_labelled(path: str, classes: Classes | None = None) -> tuple[list[Labelled], Classes]:
    """The examples of `path` and their classes (`classes`: the training file's, for a
    validation file: a label they do not hold is refused)."""
    rows = []
    for where, row in read_rows(path):
        if "label" not in row or row["label"] is None:
            raise FrugalError(f"{where}: no `label`: every classification row needs one")
        rows.append((where, _texts(row, where), row["label"]))
    if not rows:
        raise FrugalError(f"{path}: no rows")
    classes = classes or Classes.of((label, where) for where, _, label in rows)
    return [Labelled(t, classes.id_of(label, where), where) for where, t, label in rows], classes


@dataclass(frozen=True)
class LabelStats:
    """What `frugal data check --task classification` says of a file's labels and texts."""

    counts: dict[str, int]  # examples per class name, every class
    duplicates: int  # rows repeating an earlier row's text and label
    conflicts: list[tuple[str, list[str]]]  # a text given two or more labels: its labels

    @property
    def imbalance(self) -> float:
        """The largest class over the smallest (inf when a class has no example)."""
        least = min(self.counts.values())
        return max(self.counts.values()) / least if least else float("inf")

    def to_json(self) -> dict[str, Any]:
        return {
            "classes": len(self.counts),
            "counts": self.counts,
            "imbalance": None if self.imbalance == float("inf") else round(self.imbalance, 3),
            "duplicates": self.duplicates,
            "conflicting_texts": len(self.conflicts),
            "conflicts": [{"text": t[:200], "labels": labels} for t, labels in self.conflicts[:20]],
        }


def label_stats(examples: list[Labelled], classes: Classes) -> LabelStats:
    counts = Counter(e.label for e in examples)
    by_text: dict[tuple[str, ...], set[int]] = {}
    seen: set[tuple[tuple[str, ...], int]] = set()
    duplicates = 0
    for e in examples:
        key = tuple(t.strip() for t in e.texts)
        duplicates += (key, e.label) in seen
        seen.add((key, e.label))
        by_text.setdefault(key, set()).add(e.label)
    conflicts = [
        (" | ".join(k), sorted(classes.names[i] for i in ls))
        for k, ls in by_text.items()
        if len(ls) > 1
    ]
    return LabelStats(
        {n: counts.get(i, 0) for i, n in enumerate(classes.names)}, duplicates, conflicts
    )


@dataclass
class LabelledRows:
    """A classifier's rows as `frugal train` reads them: each example's tokens (cut to the
    sequence length), their count before the cut, and its class id; the examples they came
    from (for predictions) and the classes (the training file's)."""

    input_ids: list[list[int]]
    lengths: list[int]  # tokens of each text before the cut
    labels: list[int]
    examples: list[Labelled]
    classes: Classes

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def cut(self) -> int:
        """Texts longer than the sequence length, cut to it."""
        return sum(n > len(ids) for n, ids in zip(self.lengths, self.input_ids, strict=True))


def tokenize_labelled(
    examples: list[Labelled], classes: Classes, tok: Any, seq: int
) -> LabelledRows:
    """The examples' tokens as the model reads them (a pair joined by the tokenizer's own
    pair template; no EOS, so each row's last token is its text's), each cut to `seq`."""
    whole = [tok(*e.texts)["input_ids"] for e in examples]
    return LabelledRows(
        [t[:seq] for t in whole],
        [len(t) for t in whole],
        [e.label for e in examples],
        examples,
        classes,
    )


def balanced_weights(labels: Iterable[int], n_classes: int) -> tuple[float, ...]:
    """Class weights n / (k * n_c) (scikit-learn's "balanced"): each class then weighs as
    much in the loss as every other, whatever its count; a class with no example gets 0."""
    counts = Counter(labels)
    n = sum(counts.values())
    return tuple(n / (n_classes * counts[c]) if counts[c] else 0.0 for c in range(n_classes))


# the metrics that stand for a whole run: each task's (a classifier's accuracy and macro-F1)
HEADLINE = tuple(dict.fromkeys(m for t in TASKS.values() for m in t.headline_metrics))


def headline(metrics: dict[str, float]) -> dict[str, float]:
    """The run-wide metrics of `class_metrics`' output (not the per-class ones)."""
    return {k: metrics[k] for k in HEADLINE if k in metrics}


def class_metrics(confusion: list[list[float]], names: tuple[str, ...]) -> dict[str, float]:
    """A classifier's evaluation from its confusion matrix (`confusion[true][predicted]`):
    accuracy; each class's precision, recall and F1; macro-F1, the mean of the classes' F1
    over the classes the data holds (a class with no true and no predicted row has none).
    A class never predicted has precision 0, as scikit-learn's `zero_division=0` gives."""
    k = len(names)
    total = sum(sum(row) for row in confusion)
    right = sum(confusion[c][c] for c in range(k))
    out = {"accuracy": right / total if total else 0.0}
    f1s = []
    for c, name in enumerate(names):
        true = sum(confusion[c])
        said = sum(confusion[r][c] for r in range(k))
        if not true and not said:
            continue
        p = confusion[c][c] / said if said else 0.0
        r = confusion[c][c] / true if true else 0.0
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        out |= {f"precision/{name}": p, f"recall/{name}": r, f"f1/{name}": f1}
        f1s.append(f1)
    out["macro_f1"] = sum(f1s) / len(f1s) if f1s else 0.0
    return out
