"""`frugal data check`: rows tokenized as `frugal train` does, counted, and checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_error, run_json

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny-llama")  # char-level tokenizer: BOS + chars (+ EOS)
CHAT = str(ROOT / "examples" / "data" / "chat.jsonl")
KEYS = {"rows", "format", "empty", "duplicates", "over_length", "tokens", "trained_tokens"}
KEYS |= {"length", "histogram", "seq", "warnings"}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def check(capsys: pytest.CaptureFixture[str], path: str, *args: str) -> dict[str, Any]:
    return run_json(capsys, "data", "check", path, "--model", TINY, "--json", *args)


@pytest.fixture
def mixed(tmp_path: Path) -> str:
    """5 prompt/completion rows: 1 duplicate, 2 longer than 10 tokens, 1 left with nothing
    to train once truncated to 10 (its long prompt fills the row)."""
    return write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"prompt": "ab", "completion": "cd"},  # 6 tokens
            {"prompt": "ab", "completion": "cd"},  # duplicate
            {"prompt": "x" * 20, "completion": "y"},  # 23: over-length and empty
            {"prompt": "q", "completion": "z" * 12},  # 15: over-length
            {"prompt": "hi", "completion": "there"},  # 9
        ],
    )


def test_counts_and_json_keys(capsys: pytest.CaptureFixture[str], mixed: str) -> None:
    d = check(capsys, mixed, "--seq", "10")
    assert set(d) >= KEYS and "wrote_plot" not in d
    assert (d["rows"], d["format"]) == (5, "prompt_completion")
    assert (d["empty"], d["duplicates"], d["over_length"], d["seq"]) == (1, 1, 2, 10)
    assert d["tokens"] == 6 + 6 + 23 + 15 + 9
    assert 0 < d["trained_tokens"] < d["tokens"]  # prompts are masked
    assert d["length"] == {"min": 6, "median": 9, "p95": 23, "max": 23}
    assert sum(b["count"] for b in d["histogram"]) == d["rows"]
    assert len(d["histogram"]) <= 10
    assert all(b["lo"] <= b["hi"] for b in d["histogram"])
    warnings = " ".join(d["warnings"])
    assert "2 of 5 rows are longer than --seq 10 and are cut to it: 18 of 59 tokens" in warnings
    assert d["kept_tokens"] == 59 - 18 and d["lost_tokens"] == 18
    assert "dedupe" in warnings and "format" in warnings
    assert check(capsys, mixed, "--seq", "64")["over_length"] == 0


def test_text_output(capsys: pytest.CaptureFixture[str], mixed: str) -> None:
    from frugal.cli.main import main

    assert main(["data", "check", mixed, "--model", TINY, "--seq", "10"]) == 0
    out = capsys.readouterr().out
    assert "5 rows" in out and "prompt_completion" in out and "█" in out
    assert "warning:" in out and "dedupe" in out


def test_csv_and_chat(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text('text\nhello\n"a, b"\nhello\n')
    d = check(capsys, str(csv))
    assert (d["rows"], d["format"], d["duplicates"], d["empty"]) == (3, "text", 1, 0)
    assert d["warnings"] and not any("job.seq" in w for w in d["warnings"])
    c = check(capsys, CHAT, "--seq", "64")
    assert c["format"] == "chat" and c["rows"] == 120
    assert 0 < c["trained_tokens"] < c["tokens"]  # only the assistant turns train


def test_nothing_to_train_is_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": f"hi {i}"}]} for i in range(3)]
    d = check(capsys, write_jsonl(tmp_path / "c.jsonl", rows))
    assert d["empty"] == d["rows"] == 3 and d["trained_tokens"] == 0
    assert any("refuses" in w for w in d["warnings"])


def test_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_llama_dir: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": oops}\n')
    assert f"{bad}:2" in run_error(capsys, "data", "check", str(bad), "--model", TINY)
    good = write_jsonl(tmp_path / "g.jsonl", [{"text": "abc"}])
    no_tok = run_error(capsys, "data", "check", good, "--model", str(tiny_llama_dir))
    assert "--tokenizer" in no_tok
    d = run_json(
        capsys, "data", "check", good, "--model", str(tiny_llama_dir), "--tokenizer", TINY, "--json"
    )
    assert d["rows"] == 1
    assert "--plot" in run_error(capsys, "data", "check", good, "--model", TINY, "--plot", "x.jpg")
    assert "--seq" in run_error(capsys, "data", "check", good, "--model", TINY, "--seq", "0")


def test_plot_png(capsys: pytest.CaptureFixture[str], tmp_path: Path, mixed: str) -> None:
    png = tmp_path / "h.png"
    d = check(capsys, mixed, "--seq", "10", "--plot", str(png))
    assert d["wrote_plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_plan_counts_the_same_tokens(capsys: pytest.CaptureFixture[str], mixed: str) -> None:
    d = check(capsys, mixed)
    p = run_json(capsys, "plan", TINY, "--dataset", mixed, "--seq", "128", "--epochs", "1",
                 "--json")  # fmt: skip
    assert p["tokens"] == d["tokens"]
    note = next(n for n in p["notes"] if n.startswith(mixed))
    assert f"{d['rows']:,} rows, {d['tokens']:,} tokens" in note and "tokenizer" in note


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("bin.jsonl", b'{"text": "ok"}\n\xff\xfe\n',
         ":2: not UTF-8 text (byte 15 of the file is 0xff): save it as UTF-8 JSON lines"),
        ("list.jsonl", b"[1, 2]\n", ":1: a JSON list where a row object belongs"),
        ("cut.jsonl", b'{"text": "ok"}\n{"text": "o', ":2: not JSON (Unterminated string"),
        ("nul.csv", b"text\na\x00b\n", ":2: a NUL byte (byte 6 of the file): not a text file"),
        ("latin.csv", b"text\ncaf\xe9\n", ":2: not UTF-8 text (byte 8 of the file is 0xe9)"),
        ("fake.parquet", b"PAR1 not really", ": not a readable Parquet file (Could not open"),
    ],
)  # fmt: skip
def test_unreadable_files_get_one_line_with_the_place_and_the_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, content: bytes, needle: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    msg = run_error(capsys, "data", "check", str(path), "--model", TINY)
    assert msg.startswith(f"error: {path}") and needle in msg and "\n" not in msg.strip(), msg


# -- classification ------------------------------------------------------------------------

SENTIMENT = str(ROOT / "examples" / "sentiment" / "train.jsonl")


def test_classification_data_counts_its_classes_and_finds_what_would_mislead(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Label counts and imbalance, rows repeated, a text given two labels, texts longer
    than --seq (a pair counts both texts, as the tokenizer joins them)."""
    rows = [{"text": "good", "label": "pos"}] * 2 + [{"text": "bad", "label": "neg"},
            {"text": "good", "label": "neg"}] + [{"text": f"fine {i}", "label": "pos"}
                                                  for i in range(6)]  # fmt: skip
    d = check(capsys, write_jsonl(tmp_path / "c.jsonl", rows), "--task", "classification",
              "--seq", "6")  # fmt: skip
    assert d["task"] == "classification" and d["rows"] == 10 and d["classes"] == 2
    assert d["counts"] == {"neg": 2, "pos": 8} and d["imbalance"] == 4.0
    assert d["duplicates"] == 1 and d["conflicting_texts"] == 1
    assert d["conflicts"] == [{"text": "good", "labels": ["neg", "pos"]}]
    assert d["over_length"] == 6  # "fine N": BOS + 6 characters
    said = " ".join(d["warnings"])
    assert "imbalanced" in said and "repeat an earlier row" in said
    assert "two or more labels" in said and "longer than --seq 6" in said
    pairs = [
        {"text_a": "aaaa", "text_b": "bbbb", "label": 1},
        {"text_a": "c", "text_b": "d", "label": 0},
    ]
    p = check(capsys, write_jsonl(tmp_path / "p.jsonl", pairs), "--task", "classification")
    assert p["counts"] == {"0": 1, "1": 1} and p["length"]["max"] >= 8  # both texts counted
    assert p["warnings"] == []


def test_the_shipped_sentiment_data_is_clean_and_balanced(
    capsys: pytest.CaptureFixture[str],
) -> None:
    d = check(capsys, SENTIMENT, "--task", "classification", "--seq", "128")
    assert d["classes"] == 2 and d["imbalance"] < 1.5 and d["warnings"] == []
    from frugal.cli.main import main

    assert main(["data", "check", SENTIMENT, "--model", TINY, "--task", "classification"]) == 0
    assert "negative" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        ([{"text": "a"}], ":1: no `label`"),
        ([{"text": "a", "label": "x"}, {"text": "b", "label": 1}], "mix class names"),
        ([{"text": "a", "label": "x"}, {"text": "b", "label": "x"}], "1 class"),
        ([{"text": "a", "label": -1}, {"text": "b", "label": 1}], "label -1"),
        ([{"text": "a", "label": True}, {"text": "b", "label": 1}], "label True"),
        ([{"prompt": "a", "label": 1}, {"text": "b", "label": 0}], "needs `text` and `label`"),
        # it built that many class names (MemoryError, exit 1)
        (
            [{"text": "a", "label": 0}, {"text": "b", "label": 99_999_999_999}],
            ":2: label id 99,999,999,999: ids number the classes from 0, at most 9,999",
        ),
    ],
)
def test_bad_classification_rows_are_one_line_with_the_place(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rows: list[dict[str, Any]], said: str
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    msg = run_error(capsys, "data", "check", path, "--model", TINY, "--task", "classification")
    assert said in msg and msg.count("\n") == 0
    assert "--task" in run_error(capsys, "data", "check", path, "--model", TINY, "--task", "x")


def test_a_validation_file_keeps_the_training_files_classes(tmp_path: Path) -> None:
    from frugal.data.labels import read_labelled
    from frugal.errors import FrugalError

    _, classes = read_labelled(SENTIMENT)
    assert classes.names == ("negative", "positive")
    val = write_jsonl(tmp_path / "v.jsonl", [{"text": "meh", "label": "positive"}])
    (one,), same = read_labelled(val, classes)
    assert one.label == 1 and same == classes  # a file with one class, read with the train's
    odd = write_jsonl(tmp_path / "o.jsonl", [{"text": "x", "label": "neutral"}])
    with pytest.raises(FrugalError, match="'neutral' is no class of the training data"):
        read_labelled(odd, classes)


def test_a_null_or_blank_text_is_an_empty_row_not_a_row_of_special_tokens(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A null text read as "" was tokenized to BOS and EOS and trained: it is empty, said
    and dropped, and two of them are not a repeat. So is a blank completion."""
    rows = [{"text": "hello"}, {"text": None}, {"text": "  "}, {"text": "world"}]
    d = check(capsys, write_jsonl(tmp_path / "t.jsonl", rows))
    assert (d["empty"], d["duplicates"]) == (2, 0)
    assert any("2 rows have no tokens to train on" in w for w in d["warnings"])
    pc = [{"prompt": "ab", "completion": "cd"}, {"prompt": "ab", "completion": None}]
    assert check(capsys, write_jsonl(tmp_path / "pc.jsonl", pc))["empty"] == 1
