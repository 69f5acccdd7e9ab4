"""The closed form and the simulation agree where both are exact: parameters and state bytes."""

from __future__ import annotations

import pytest

from frugal.estimate.categories import CATEGORIES, SEGMENTS
from frugal.estimate.closed_form import counts, lora_params, model_params, state_bytes
from frugal.estimate.core import get_profile
from frugal.models.specs import bundled_model_ids, load_spec
from frugal.step.job import TrainJob
from frugal.step.model import build_model, count_params

DENSE = [
    m
    for m in bundled_model_ids()
    if load_spec(m).model_type not in ("phi",) and "405B" not in m and "70B" not in m
]


@pytest.mark.parametrize("model_id", DENSE)
def test_parameter_count_matches_simulated_model(model_id: str) -> None:
    spec = load_spec(model_id)
    total, _ = count_params(
        build_model(spec.config, TrainJob(method="full"), "meta", n_layers=spec.num_layers)
    )
    assert model_params(spec.config) == total


@pytest.mark.parametrize(
    ("model_id", "targets"),
    [
        ("meta-llama/Llama-3.1-8B", "all-linear"),
        ("meta-llama/Llama-3.1-8B", "q_proj,v_proj"),
        ("meta-llama/Llama-3.1-8B", "k_proj,down_proj"),
        ("Qwen/Qwen3-30B-A3B", "all-linear"),  # the experts' adapters at rank 16 / 8
        ("moonshotai/Moonlight-16B-A3B-Instruct", "all-linear"),  # latent attention, shared
        ("moonshotai/Moonlight-16B-A3B-Instruct", "q_proj,experts"),
    ],
)
def test_lora_count_matches_peft(model_id: str, targets: str) -> None:
    spec = load_spec(model_id)
    job = TrainJob(method="lora", lora_r=16, lora_targets=targets)
    _, trainable = count_params(build_model(spec.config, job, "meta", n_layers=spec.num_layers))
    assert lora_params(spec.config, job) == trainable


MOE = [m for m in bundled_model_ids() if load_spec(m).is_moe]


@pytest.mark.parametrize("model_id", MOE)
def test_active_parameters_match_the_bundled_figure(model_id: str) -> None:
    """A token meets k of E routed experts: the closed form's active count is the one the
    bundle carries, counted on the meta-built model (`step.moe.inactive_params`)."""
    spec = load_spec(model_id)
    n = counts(spec.config)
    assert n.total == spec.source["params"]
    assert n.active == spec.source["active_params"]


@pytest.mark.parametrize(
    ("model_id", "job"),
    [
        ("HuggingFaceTB/SmolLM2-135M", TrainJob(method="full")),
        ("HuggingFaceTB/SmolLM2-135M", TrainJob(method="full", precision="bf16-true")),
        ("Qwen/Qwen2.5-0.5B", TrainJob(method="full", optimizer="sgd")),
        ("meta-llama/Llama-3.1-8B", TrainJob(method="lora")),
        ("meta-llama/Llama-3.1-8B", TrainJob(method="qlora", lora_targets="q_proj,v_proj")),
    ],
)
@pytest.mark.slow
def test_state_bytes_match_simulation(model_id: str, job: TrainJob) -> None:
    spec = load_spec(model_id)
    prof = get_profile(spec, job, job.seq)
    opt = prof.segment_peaks(1, 256)[SEGMENTS.index("opt")]
    sim = dict(zip(CATEGORIES, opt, strict=True))
    trainable = prof.trainable_params
    expect = state_bytes(trainable, job)
    assert sim["trainable_weights"] == pytest.approx(expect["trainable_weights"], rel=1e-12)
    # torch's AdamW also keeps a 4-byte step counter per tensor (a few KiB in all)
    assert sim["optimizer_state"] == pytest.approx(expect["optimizer_state"], rel=1e-9, abs=4096)
    # gradients are alive during the optimizer step (clipping, step)
    assert sim["gradients"] == pytest.approx(expect["gradients"], rel=1e-9, abs=64)


@pytest.mark.slow
def test_eight_bit_optimizer_state_is_a_quarter() -> None:
    spec = load_spec("meta-llama/Llama-3.1-8B")
    full = get_profile(spec, TrainJob(method="lora"), 2048)
    small = get_profile(spec, TrainJob(method="lora", optimizer="adamw-8bit"), 2048)
    i = CATEGORIES.index("optimizer_state")
    ratio = small.segment_peaks(1, 2048)[-1][i] / full.segment_peaks(1, 2048)[-1][i]
    assert 0.24 < ratio < 0.27  # 2 bytes + absmax/256 vs 8 bytes
