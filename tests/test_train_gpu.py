"""`frugal train` on a CUDA GPU (skipped without one): QLoRA, bf16, 8-bit optimizers, the
estimator's micro-batch and measured peaks beside the estimate."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_cfg

from frugal.run import recipe, training_loop

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "over",
    [
        ("job.method=lora", "job.precision=bf16-mixed"),
        ("job.method=qlora", "job.precision=bf16-mixed", "job.optimizer=paged-adamw-8bit"),
        ("job.method=full", "job.precision=bf16-true", "job.optimizer=adamw-8bit"),
    ],
)
def test_dry_run_on_cuda_reports_measured_and_predicted(
    tmp_path: Path, over: tuple[str, ...]
) -> None:
    s = recipe.train(make_cfg(tmp_path / "r", "data.epochs=3", *over), dry_run=3, quiet=True)
    assert s.precision.startswith("bf16")
    a, p = s.actual, s.predicted
    assert (
        a.peak_allocated_gib and a.peak_reserved_gib and a.peak_reserved_gib >= a.peak_allocated_gib
    )
    assert (
        p.peak_allocated_gib and p.peak_allocated_gib > 0
    )  # the estimator's figure for this GPU and micro-batch
    assert "estimator" in s.notes[0]  # the micro-batch came from the estimator


def test_qlora_trains_and_saves_an_adapter_on_cuda(tmp_path: Path) -> None:
    s = recipe.train(
        make_cfg(tmp_path / "r", "job.method=qlora", "job.precision=bf16-mixed", "data.epochs=2",
                 "training.eval_every=5"), quiet=True,
    )  # fmt: skip
    assert s.outcome == "completed"
    assert (tmp_path / "r" / "final" / "adapter_model.safetensors").exists()


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_random_weights_are_drawn_on_the_gpu_and_leave_nothing_cached(
    tmp_path: Path, method: str
) -> None:
    import torch

    from frugal.run.build import load_model

    cfg = make_cfg(tmp_path / "r", f"job.method={method}", "job.precision=bf16-mixed")
    model, _ = load_model(cfg, "bf16-mixed")
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    # QLoRA's bf16 draw was quantized and freed: the allocator keeps none of it cached
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < 2**21 * 8


def test_the_peak_a_run_reports_leaves_out_an_attempt_that_ran_out_of_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    real, calls = training_loop.train_step, []

    def first_runs_out(run: recipe.TrainingRun, step: int) -> dict[str, float]:
        calls.append(step)
        if len(calls) == 1:
            big = torch.empty(2**30, dtype=torch.uint8, device="cuda")  # 1 GiB, then OOM
            assert big.numel()  # held by the traceback until the except block ends
            raise torch.OutOfMemoryError("CUDA out of memory (a stand-in attempt)")
        return real(run, step)

    monkeypatch.setattr(training_loop, "train_step", first_runs_out)
    s = recipe.train(
        make_cfg(tmp_path / "r", "job.precision=bf16-mixed", "data.epochs=3"), dry_run=3,
        quiet=True,
    )  # fmt: skip
    assert len(calls) == 4  # the attempt that ran out, then the three steps
    assert s.actual.peak_allocated_gib is not None and s.actual.peak_allocated_gib < 0.5
