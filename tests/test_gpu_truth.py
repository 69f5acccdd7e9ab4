"""benchmarks/gpu_truth.py, the script a lent GPU runs: its matrices are well formed (its
`--smoke` run takes the same path through `frugal train` on CPU)."""

from __future__ import annotations

from conftest import load_benchmark

gt = load_benchmark("gpu_truth")


def test_the_matrices_name_each_config_once() -> None:
    for name in ("smoke", "first", "core", "long"):
        ids = [c.id for c in gt.matrix(name)]
        assert len(ids) == len(set(ids)), name
    long = gt.matrix("long")
    fused = [c for c in long if c.in_backward]
    assert fused and all(c.effective == c.micro for c in fused)  # one micro-batch a step
