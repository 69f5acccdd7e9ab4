"""Predicted vs third-party measured peaks (benchmarks/data/measured_memory.csv).

Target on the rows frugal's stack reproduces (scope core): median |error| <= 10% and no row
under-predicted by more than 10% (an under-prediction is an OOM for the user).
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest
from conftest import ROOT, load_benchmark

from frugal.estimate.core import GIB, estimate
from frugal.models.specs import load_spec
from frugal.step.job import TrainJob, make_job

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
SECOND_LOAN = ROOT / "benchmarks" / "data" / "gpu_truth-2026-11-26-h200-loan2.csv"
THIRD_LOAN = ROOT / "benchmarks" / "data" / "gpu_truth-2026-11-27-h200-loan3.csv"


def _gpu_rows(path: Path = GPU_TRUTH) -> dict[str, dict[str, str]]:
    with path.open() as f:
        return {r["id"]: r for r in csv.DictReader(f)}


def _job(r: dict[str, str]) -> TrainJob:
    return make_job(
        method=r["method"], precision=r["precision"], batch=int(r["micro_batch"]),
        seq=int(r["seq"]), grad_checkpointing=r["checkpointing"] == "True",
        grad_accum=int(r["grad_accum"]), optimizer=r["optimizer"],
        loss_chunks=int(r["loss_chunks"]), offload_activations=r["offload"] == "True",
        optimizer_in_backward=r["in_backward"] == "True",
        **({"lora_r": int(r["lora_r"])} if r["method"] != "full" else {}),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("path", "row_id"),
    [
        # the logits-heavy row the old reserve model under-predicted most (-18% device)
        (GPU_TRUTH, "Qwen3-0.6B-lora-bf16-mixed-ckpt-s2048-mb1"),
        # no checkpointing: activations the old model counted into the reserve (+8%)
        (GPU_TRUTH, "SmolLM2-360M-full-bf16-mixed-nockpt-s2048-mb1"),
        # 16K tokens: the logits of the whole sequence at once (34 GiB)
        (SECOND_LOAN, "Llama-3.1-8B-qlora-bf16-mixed-ckpt-s16384-mb1-r32"),
        # the optimizer in backward: each weight stepped and its gradient freed in backward
        (SECOND_LOAN, "Llama-3.2-1B-full-bf16-mixed-ckpt-s2048-mb4-chunks16-inbwd"),
        # the same step with the optimizer after backward: the gradients held until it runs
        (THIRD_LOAN, "Llama-3.2-1B-full-bf16-mixed-ckpt-s2048-mb4-chunks16"),
    ],
)
def test_the_estimate_of_frugals_step_against_an_h200(path: Path, row_id: str) -> None:
    """Peaks of frugal's own step measured on an H200, re-estimated with today's code: the
    allocated peak within -2%..+8%, reserved and device total (nvidia-smi) within
    -8%..+10% (the calibrated CUDA context and allocator reserve, docs/accuracy.md)."""
    r = _gpu_rows(path)[row_id]
    m = estimate(load_spec(r["model"]), _job(r)).memory
    err = {
        "allocated": m.peak_allocated / GIB / float(r["measured_allocated_gib"]) - 1,
        "reserved": m.peak_reserved / GIB / float(r["measured_reserved_gib"]) - 1,
        "device": m.device_total / GIB / float(r["measured_device_gib"]) - 1,
    }
    assert -0.02 <= err["allocated"] <= 0.08, err
    assert -0.08 <= err["reserved"] <= 0.10 and -0.08 <= err["device"] <= 0.10, err


def test_offloaded_inputs_are_the_pinned_memory_an_h200_held() -> None:
    """With --offload-activations, the pinned host memory PyTorch's allocator held at every
    step of 8B QLoRA at 16K (4.0 GiB, one step's checkpointed layer inputs) is what the
    estimate's host_offload_gib says; it did not grow from step to step."""
    rows = [r for r in _gpu_rows(SECOND_LOAN).values() if r["offload"] == "True"]
    measured = [r for r in rows if r["measured_host_gib"]]
    assert len(measured) >= 2
    for r in measured:
        host = estimate(load_spec(r["model"]), _job(r)).to_json()["host_offload_gib"]
        assert host == pytest.approx(float(r["measured_host_gib"]), rel=0.02), r["id"]


@pytest.mark.parametrize("path", [SECOND_LOAN, THIRD_LOAN])
def test_frugals_step_holds_what_the_hf_trainer_holds(path: Path) -> None:
    """The same run through `frugal train` and through `--emit hf`'s Trainer script on an
    H200 (Llama-3.2-1B, LoRA and QLoRA; transformers 5.24 and PEFT 0.21.2 on the second
    loan, 5.17 and 0.21.0 on the third): the same allocated peak, reserved within 2%
    (docs/accuracy.md compares their tokens/s)."""
    rows = _gpu_rows(path)
    pairs = [(rows[k.removesuffix("-hf")], r) for k, r in rows.items() if k.endswith("-hf")]
    assert {ours["method"] for ours, _ in pairs} == {"lora", "qlora"}
    for ours, theirs in pairs:
        assert ours["measured_allocated_gib"] == theirs["measured_allocated_gib"]
        reserved = float(ours["measured_reserved_gib"]) / float(theirs["measured_reserved_gib"])
        assert abs(reserved - 1) < 0.02, ours["id"]


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
