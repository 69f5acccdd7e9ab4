"""benchmarks/gpu_truth.py, the script a lent GPU runs: its matrices are well formed (its
`--smoke` run takes the same path through `frugal train` on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY, load_benchmark

gt = load_benchmark("gpu_truth")


def test_the_matrices_name_each_config_once() -> None:
    for name in ("smoke", "first", "core", "long", "moe"):
        ids = [c.id for c in gt.matrix(name)]
        assert len(ids) == len(set(ids)), name
    long = gt.matrix("long")
    fused = [c for c in long if c.in_backward]
    assert fused and all(c.effective == c.micro for c in fused)  # one micro-batch a step
    # steps near the longest sequence take a minute each: two of them, last on a short loan
    edges = [c for c in long if c.max_seq_share]
    assert len(edges) == 2 and all(c.steps == 2 for c in edges)
    assert gt.matrix("first")[-2:] == edges


@pytest.mark.slow
def test_the_hf_runner_trains_the_emitted_trainer_script(tmp_path: Path) -> None:
    """`runner="hf"` runs `frugal plan --emit hf`'s script of the same run on saved random
    weights and times its optimizer steps: the row frugal's own loop is compared with."""
    cfg = gt.Config(str(TINY), "lora", "fp32", True, 64, 2, runner="hf")
    row = gt._run(cfg, steps=2, effective=4, work=tmp_path, out=tmp_path)
    assert (row["micro_batch"], row["grad_accum"]) == (2, 2)
    assert row["measured_tokens_per_s"] > 0 and row["error"] is None
    assert (tmp_path / "train_hf.py").exists() and (tmp_path / "weights").is_dir()


def test_the_moe_rows_are_reduced_in_depth_and_first_on_a_short_loan() -> None:
    moe = gt.matrix("moe")
    assert all(c.layers for c in moe)
    assert {c.method for c in moe} == {"lora", "qlora"}
    assert any(c.targets != "all-linear" for c in moe)  # attention only, beside the experts
    assert set(moe[:3]) <= set(gt.matrix("first"))


@pytest.mark.slow
def test_a_row_reduced_in_depth_trains_the_reduced_config(tmp_path: Path) -> None:
    cfg = gt.Config(str(TINY), "lora", "fp32", True, 64, 2, layers=1)
    assert "-L1-" in cfg.id
    row = gt._run(cfg, steps=2, effective=2, work=tmp_path, out=tmp_path)
    assert row["error"] is None and row["measured_tokens_per_s"] > 0
    import json

    assert json.loads((tmp_path / "model" / "config.json").read_text())["num_hidden_layers"] == 1
