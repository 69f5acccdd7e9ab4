"""The estimate is of the step `frugal train` runs (benchmarks/step_consistency.py).

For a matrix of tiny models (Llama-style dense, Llama-3.1-8B's own architecture scaled
down, MoE: Qwen3-MoE's shape with adapters on its experts and gpt-oss's, Gemma 2),
methods, precisions, optimizers, checkpointing, packed and padded
batches and the contrastive loss: real trainer steps on CPU and the estimator's simulation,
measured by the same tracker, agree in every category at the peak of every segment of the
step: weights, gradients and optimizer state exactly, the transient ones within 2%. The last
tests show the suite fails when either side alone goes back to a different step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import load_benchmark

sc = load_benchmark("step_consistency")

Case = sc.Case


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sc.make_workdir(tmp_path_factory.mktemp("consistency"))


@pytest.mark.parametrize("case", sc.CASES, ids=[c.id for c in sc.CASES])
@pytest.mark.slow
def test_estimate_is_the_trainers_step(case: Case, workdir: Path, tmp_path: Path) -> None:
    cfg = sc.make_cfg(case, workdir, tmp_path / "run")
    problems = list(sc.mismatches(sc.measure(cfg).peaks, sc.predicted(cfg)))
    assert not problems, "\n".join(problems)


def test_the_matrix_covers_what_the_step_varies() -> None:
    seen = {f: {getattr(c, f) for c in sc.CASES} for f in sc.Case.__dataclass_fields__}
    assert seen["model"] >= {"llama", "llama31-8b", "moe", "gpt-oss", "gemma"}
    assert seen["method"] == {"full", "lora"}
    assert seen["precision"] == {"fp32", "bf16-true", "bf16-mixed"}
    assert seen["optimizer"] == {"adamw", "sgd", "adafactor"}
    for flag in ("checkpointing", "packing", "contrastive", "offload", "in_backward", "classify"):
        assert seen[flag] == {True, False}, flag
    assert seen["accum"] == {1, 2}
    preference = {(c.preference, c.method) for c in sc.CASES if c.preference}
    assert preference >= {("dpo", "lora"), ("dpo", "full"), ("orpo", "lora")}
    assert {c.method for c in sc.CASES if c.distill} == {"lora", "full"}
    assert 0 in seen["loss_chunks"] and len(seen["loss_chunks"]) > 1


# -- the suite fails when either side alone changes its step ----------------------------------


@pytest.mark.slow
def test_a_trainer_that_loads_the_lora_base_in_fp32_is_caught(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `frugal train` did before: the frozen base of a bf16-mixed LoRA run in fp32."""
    import frugal.step.model as model

    cfg = sc.make_cfg(Case("llama31-8b", "lora", "bf16-mixed", "adamw", True), workdir, tmp_path)
    sim = sc.predicted(cfg)
    with monkeypatch.context() as m:
        m.setattr(model, "weight_dtypes", lambda job: (torch.float32, torch.float32))
        real = sc.measure(cfg)
    problems = list(sc.mismatches(real.peaks, sim))
    assert any(p.startswith("fwd/frozen_weights") for p in problems), problems


@pytest.mark.slow
def test_an_estimate_without_sgd_momentum_is_caught(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the estimate did before: SGD without its momentum buffer."""
    import frugal.step.optim as optim

    case = Case("llama", "lora", "fp32", "sgd", True, packing=False)
    cfg = sc.make_cfg(case, workdir, tmp_path)
    real = sc.measure(cfg)
    with monkeypatch.context() as m:
        m.setenv("FRUGAL_CACHE_DIR", str(tmp_path / "fresh"))  # simulate, do not reuse
        m.setattr(optim, "SGD_MOMENTUM", 0.0)
        sim = sc.predicted(cfg)
    problems = list(sc.mismatches(real.peaks, sim))
    assert any("/optimizer_state" in p for p in problems), problems


@pytest.mark.slow
def test_a_trainer_that_does_not_offload_is_caught(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer whose layer inputs stay on the device while the estimate offloads them."""
    import frugal.step.offload as offload

    case = Case("llama31-8b", "lora", "bf16-mixed", "adamw", True, offload=True)
    cfg = sc.make_cfg(case, workdir, tmp_path)
    sim = sc.predicted(cfg)
    with monkeypatch.context() as m:
        m.setattr(offload, "_pack", lambda t: t)
        real = sc.measure(cfg)
    problems = list(sc.mismatches(real.peaks, sim))
    assert any("/offloaded_activations" in p for p in problems), problems
    assert any("/activations" in p for p in problems), problems


@pytest.mark.slow
def test_a_trainer_that_keeps_every_gradient_to_the_end_is_caught(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer whose optimizer steps after backward while the estimate's steps in it."""
    import frugal.step.optim as optim

    case = Case("llama", "full", "bf16-mixed", "adamw", True, in_backward=True)
    cfg = sc.make_cfg(case, workdir, tmp_path)
    sim = sc.predicted(cfg)
    whole = optim.make_optimizer
    with monkeypatch.context() as m:
        m.setattr(optim, "make_optimizer", lambda *a, in_backward=False, **k: whole(*a, **k))
        real = sc.measure(cfg)
    problems = list(sc.mismatches(real.peaks, sim))
    assert any("/gradients" in p for p in problems), problems
