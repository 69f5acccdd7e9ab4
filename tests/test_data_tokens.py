"""Tokenized once, shared, columnar: the data cache and the vectorized packing."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TINY
from transformers import AutoTokenizer

from frugal.data import tokens
from frugal.data.examples import Example, load_examples, pack
from frugal.step.loss import IGNORE


@pytest.fixture(scope="module")
def tok() -> Any:
    return AutoTokenizer.from_pretrained(str(TINY))


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "data"


def _jsonl(path: Path, n: int, word: str = "row") -> Path:
    path.write_text("".join(json.dumps({"text": f"{word} {i}"}) + "\n" for i in range(n)))
    return path


def test_a_file_is_tokenized_once(
    tmp_path: Path, tok: Any, own_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _jsonl(tmp_path / "d.jsonl", 50)
    first = load_examples(str(data), tok, 64)
    calls = []
    real = tokens.tokenize_batch
    monkeypatch.setattr(tokens, "tokenize_batch", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = load_examples(str(data), tok, 64)
    assert calls == [] and again == first  # read back from the Arrow cache
    assert len(list(own_cache.iterdir())) == 2  # the entry and its lock


def test_a_changed_file_or_tokenizer_is_tokenized_again(
    tmp_path: Path, tok: Any, own_cache: Path
) -> None:
    data = _jsonl(tmp_path / "d.jsonl", 5)
    before = load_examples(str(data), tok, 64)
    _jsonl(data, 5, word="changed")  # same name, same number of rows
    after = load_examples(str(data), tok, 64)
    assert after != before and after[0].input_ids == tok("changed 0")["input_ids"] + [2]
    other = AutoTokenizer.from_pretrained(str(TINY))
    other.chat_template = "{{ messages }}"  # anything that tokenizing depends on
    assert tokens.tokenizer_digest(other) != tokens.tokenizer_digest(tok)


WORKER = """
import json, sys
from transformers import AutoTokenizer
from frugal.data import tokens

real = tokens._tokenize_into
def counted(*a, **k):
    with open(sys.argv[3], "a") as f:
        f.write("tokenized\\n")
    real(*a, **k)
tokens._tokenize_into = counted
ex, fmt = tokens.tokenized(sys.argv[1], AutoTokenizer.from_pretrained(sys.argv[2]))
print(json.dumps([len(ex), int(ex.ids.sum()), fmt]))
"""


@pytest.mark.slow
def test_processes_share_one_tokenization(tmp_path: Path, own_cache: Path) -> None:
    data = _jsonl(tmp_path / "d.jsonl", 3000)
    log = tmp_path / "log"
    cmd = [sys.executable, "-c", WORKER, str(data), str(TINY), str(log)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len({o.strip() for o in outs}) == 1  # the same examples in every process
    assert log.read_text() == "tokenized\n"  # by one of them


def _reference_pack(examples: list[Example], seq: int, pad: int) -> list[list[list[int]]]:
    """The greedy packing as plain Python: [ids, labels, segments, positions] per row."""
    rows: list[list[list[int]]] = []
    cur: list[list[int]] = [[], [], [], []]
    seg = 0
    for e in examples:
        ids, labels = e.input_ids[:seq], e.labels[:seq]
        if cur[0] and len(cur[0]) + len(ids) > seq:
            rows.append(cur)
            cur, seg = [[], [], [], []], 0
        seg += 1
        cur = [cur[0] + ids, cur[1] + labels, cur[2] + [seg] * len(ids),
               cur[3] + list(range(len(ids)))]  # fmt: skip
    if cur[0]:
        rows.append(cur)
    for r in rows:
        n = seq - len(r[0])
        r[0] += [pad] * n
        r[1] += [IGNORE] * n
        r[2] += [0] * n
        r[3] += list(range(n))
    return rows


@pytest.mark.parametrize("seed", range(5))
def test_vectorized_packing_equals_the_plain_greedy_one(seed: int) -> None:
    rng = random.Random(seed)
    seq = rng.choice([8, 16, 33])
    exs = []
    for _ in range(rng.randint(1, 60)):
        n = rng.randint(1, 2 * seq)
        ids = [rng.randint(3, 99) for _ in range(n)]
        exs.append(Example(ids, [IGNORE, *ids[1:]]))
    got = pack(exs, seq, pad_id=0)
    want = _reference_pack(exs, seq, 0)
    assert [[r.input_ids, r.labels, r.segments, r.positions] for r in got] == want
    assert got.input_ids.dtype == np.int32 and got.input_ids.shape == (len(want), seq)


def test_batched_tokenizing_equals_one_call_per_row(tmp_path: Path, tok: Any) -> None:
    """The backend's batched calls give what `tok(text)` gives row by row."""
    rows = [{"prompt": f"Q{i}: spell {w}?", "completion": f" {' '.join(w)}"}
            for i, w in enumerate(["cat", "", "frugal", "ünïcode", "a b"])]  # fmt: skip
    path = tmp_path / "pc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_examples(str(path), tok, 512)
    eos = [tok.eos_token_id]
    answered = [r for r in rows if r["completion"].strip()]  # a blank one: an empty row
    for r, ex in zip(answered, got, strict=True):
        p = tok(r["prompt"])["input_ids"]
        c = tok(r["completion"], add_special_tokens=False)["input_ids"] + eos
        assert ex.input_ids == p + c
        assert ex.labels == [IGNORE] * len(p) + c
    text = tmp_path / "t.jsonl"
    text.write_text("".join(json.dumps({"text": r["prompt"]}) + "\n" for r in rows))
    for r, ex in zip(rows, load_examples(str(text), tok, 512), strict=True):
        ids = tok(r["prompt"])["input_ids"] + eos
        assert ex.input_ids == ids and ex.labels == [IGNORE, *ids[1:]]


def test_a_backend_left_truncating_does_not_cut_examples(tmp_path: Path, own_cache: Path) -> None:
    """A tokenizer.json may carry truncation: tokenizing turns it off, as `tok()` does, and
    the cache key does not depend on what state the tokenizer was left in."""
    fresh = AutoTokenizer.from_pretrained(str(TINY))
    digest = tokens.tokenizer_digest(fresh)
    fresh.backend_tokenizer.enable_truncation(max_length=4)
    assert tokens.tokenizer_digest(fresh) == digest
    fresh.backend_tokenizer.enable_truncation(max_length=4)
    text = "a sentence well over four tokens long"
    data = tmp_path / "t.jsonl"
    data.write_text(json.dumps({"text": text}) + "\n")
    (ex,) = load_examples(str(data), fresh, 512)
    assert ex.input_ids == fresh(text)["input_ids"] + [fresh.eos_token_id]
