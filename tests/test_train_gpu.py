"""`frugal train` on a CUDA GPU (skipped without one): QLoRA, bf16, 8-bit optimizers, the
estimator's micro-batch and measured peaks beside the estimate."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_cfg

from frugal.run import recipe

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
