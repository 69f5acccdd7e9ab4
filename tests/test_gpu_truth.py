"""benchmarks/gpu_truth.py, the script a lent GPU runs: its matrices are well formed (its
`--smoke` run takes the same path through `frugal train` on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY, load_benchmark

gt = load_benchmark("gpu_truth")


def test_the_matrices_name_each_config_once() -> None:
    for name in ("smoke", "first", "speed", "core", "long", "moe"):
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


def test_the_speed_rows_come_in_pairs_of_micro_batches_of_one_step() -> None:
    """Issue 43: each small row at micro-batch 1 and 4 with the same sequences a step, so
    the host's share (the same per micro-step) and the GPU's (growing with the micro-batch)
    can be told apart."""
    from dataclasses import replace

    speed = gt.matrix("speed")
    assert len(speed) == 16 and all(c.effective == 4 for c in speed)
    for one, four in zip(speed[::2], speed[1::2], strict=True):
        assert (one.micro, four.micro) == (1, 4) and replace(one, micro=4) == four


def test_the_hosts_dispatch_cost_is_measured_per_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a loan's host CPU costs per dispatched op, measured before the rows: the factor
    that sets a launch-bound step's pace."""
    monkeypatch.syspath_prepend(str(Path(gt.__file__).parent))  # as when run as a script
    host = gt.host_dispatch(("Qwen/Qwen3-0.6B",), runs=1)
    r = host["models"]["Qwen/Qwen3-0.6B"]
    assert r["layers"] == 28 and r["ops"] > 28 * 100  # hundreds of ops a layer
    assert 0 < host["us_per_op"] == r["us_per_op"] < 1000
