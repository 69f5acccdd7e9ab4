"""Data truth: rows longer than the sequence are cut in training, and every place that reads
data says so (how many rows, how many tokens lost): `data check`, `plan --dataset` (which
bills the tokens a run reads, not those in the file) and `train`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_cfg, run_json

from frugal.data.count import count_tokens
from frugal.run import recipe

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny-llama")


@pytest.fixture
def long_rows(tmp_path: Path) -> Path:
    """Twenty short rows and four long ones."""
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"]
    rows = [" ".join(words[: 3 + i % 5]) for i in range(20)]
    rows += [" ".join(words * 30)] * 2 + [" ".join(words * 12), " ".join(words * 50)]
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    return path


def test_the_plan_bills_the_tokens_a_run_reads(long_rows: Path) -> None:
    full = count_tokens(str(long_rows), TINY, 1_000_000)
    cut = count_tokens(str(long_rows), TINY, 64)
    lengths = full.stats.lengths
    assert full.tokens == sum(lengths) and full.stats.over_length == 0
    assert cut.tokens == sum(min(n, 64) for n in lengths) < full.tokens
    assert cut.stats.over_length == sum(n > 64 for n in lengths) == 4
    note = cut.note("long.jsonl", 64)
    lost = full.tokens - cut.tokens
    assert f"4 of 24 rows are longer than --seq 64 and are cut to it: {lost:,} of" in note
    assert f"raise --seq to {max(lengths):,}" in note


def test_without_the_tokenizer_the_estimate_is_cut_too(long_rows: Path) -> None:
    est = count_tokens(str(long_rows), None, 64)
    assert not est.exact and est.stats.over_length == 4
    assert est.tokens == sum(min(n, 64) for n in est.stats.lengths) < est.stats.tokens


def test_plan_and_data_check_say_what_is_cut(
    capsys: pytest.CaptureFixture[str], long_rows: Path, tiny_llama_dir: Path
) -> None:
    check = run_json(capsys, "data", "check", str(long_rows), "--model", TINY, "--seq", "64",
                     "--json")  # fmt: skip
    assert check["over_length"] == 4
    assert check["kept_tokens"] + check["lost_tokens"] == check["tokens"]
    assert any("4 of 24 rows are longer than --seq 64" in w for w in check["warnings"])
    # the plan counts with the same tokenizer and cuts at the same --seq
    plan = run_json(capsys, "plan", TINY, "--dataset", str(long_rows), "--seq", "64",
                    "--epochs", "1", "--providers", "aws", "--json")  # fmt: skip
    assert plan["tokens"] == check["kept_tokens"]
    assert any("are cut to it" in n for n in plan["notes"])


def test_train_says_what_it_cuts(tmp_path: Path, long_rows: Path) -> None:
    s = recipe.train(
        make_cfg(tmp_path / "run", f"data.path={long_rows}", "job.seq=64",
                 "training.max_steps=1"),
        quiet=True,
    )  # fmt: skip
    assert any(n.startswith("4 of ") and "longer than job.seq 64" in n for n in s.notes)
