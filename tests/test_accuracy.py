"""Predicted vs third-party measured peaks (benchmarks/data/measured_memory.csv).

Target on the rows frugal's stack reproduces (scope core): median |error| <= 10% and no row
under-predicted by more than 10% (an under-prediction is an OOM for the user).
"""

from __future__ import annotations

import csv
import statistics

import pytest
from conftest import ROOT, load_benchmark

from frugal.estimate.core import GIB, estimate
from frugal.models.specs import load_spec
from frugal.step.job import make_job

acc = load_benchmark("estimate_accuracy")

CORE = [r for r in acc.rows() if r["scope"] == "core"]


@pytest.fixture(scope="module")
def errors() -> dict[str, float]:
    out = {}
    for r in CORE:
        pred, meas = acc.predict(r)
        out[r["id"]] = (pred - meas) / meas
    return out


@pytest.mark.slow
def test_core_rows_within_target(errors: dict[str, float]) -> None:
    assert len(errors) >= 8
    assert statistics.median(abs(e) for e in errors.values()) <= 0.10
    under = {k: e for k, e in errors.items() if e < -0.10}
    assert not under, f"under-predicted by more than 10%: {under}"


def test_every_row_is_estimable() -> None:
    rows = acc.rows()
    assert len(rows) >= 20
    for r in rows:
        assert r["kind"] in acc.KIND_KEY and r["unit"] in ("GB", "GiB")


# -- frugal's own step on a GPU (benchmarks/gpu_truth.py, docs/accuracy.md) ----------------

GPU_TRUTH = ROOT / "benchmarks" / "data" / "gpu_truth-2026-11-26-h200.csv"


def _gpu_rows() -> dict[str, dict[str, str]]:
    with GPU_TRUTH.open() as f:
        return {r["id"]: r for r in csv.DictReader(f)}


@pytest.mark.parametrize(
    "row_id",
    [
        # the logits-heavy row the old reserve model under-predicted most (-18% device)
        "Qwen3-0.6B-lora-bf16-mixed-ckpt-s2048-mb1",
        # no checkpointing: activations the old model counted into the reserve (+8%)
        "SmolLM2-360M-full-bf16-mixed-nockpt-s2048-mb1",
    ],
)
def test_the_estimate_of_frugals_step_against_an_h200(row_id: str) -> None:
    """Peaks of frugal's own step measured on an H200, re-estimated with today's code: the
    allocated peak within -2%..+8%, reserved and device total (nvidia-smi) within
    -8%..+10% (the calibrated CUDA context and allocator reserve, docs/accuracy.md)."""
    r = _gpu_rows()[row_id]
    job = make_job(
        method=r["method"], precision=r["precision"], batch=int(r["micro_batch"]),
        seq=int(r["seq"]), grad_checkpointing=r["checkpointing"] == "True",
        grad_accum=int(r["grad_accum"]),
        **({"lora_r": int(r["lora_r"])} if r["method"] != "full" else {}),
    )  # fmt: skip
    m = estimate(load_spec(r["model"]), job).memory
    err = {
        "allocated": m.peak_allocated / GIB / float(r["measured_allocated_gib"]) - 1,
        "reserved": m.peak_reserved / GIB / float(r["measured_reserved_gib"]) - 1,
        "device": m.device_total / GIB / float(r["measured_device_gib"]) - 1,
    }
    assert -0.02 <= err["allocated"] <= 0.08, err
    assert -0.08 <= err["reserved"] <= 0.10 and -0.08 <= err["device"] <= 0.10, err


def test_the_cuda_context_is_what_the_h200_measured() -> None:
    """Device memory in use minus PyTorch's reserved, beside each row that ran at the
    micro-batch it asked for (the OOM back-off row's reading is after its smaller steps):
    0.749 GiB at the median, never less; bitsandbytes' optimizers and cuBLAS's bf16-true
    handles add ~0.1 GiB to some. The constant the estimate adds is that median."""
    from frugal.estimate.overheads import Overheads

    gaps = [
        float(r["measured_device_gib"]) - float(r["measured_reserved_gib"])
        for r in _gpu_rows().values()
        if "-mb" not in r["id"] or r["id"].split("-mb")[1].split("-")[0] == r["micro_batch"]
    ]
    assert len(gaps) >= 12
    context = Overheads().cuda_context_gib
    assert abs(statistics.median(gaps) - context) < 0.01
    assert min(gaps) > context - 0.01, gaps
