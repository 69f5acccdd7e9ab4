"""Parameter counts of real models, against the numbers on their model cards."""

from __future__ import annotations

import pytest

from frugal.estimate.core import estimate
from frugal.models.specs import load_spec
from frugal.step.job import make_job
from frugal.step.model import build_model, count_params

LLAMA_31_8B = 8030261248
# r = 16 on q, k, v, o, gate, up, down of 32 layers: 16 * (in + out) per linear
LLAMA_31_8B_LORA_R16 = (
    32
    * 16
    * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 2 * (4096 + 14336) + (14336 + 4096))
)


def test_lora_golden_is_the_textbook_count() -> None:
    assert LLAMA_31_8B_LORA_R16 == 41943040


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("full", (LLAMA_31_8B, LLAMA_31_8B)),
        ("lora", (LLAMA_31_8B, 41943040)),
        ("qlora", (LLAMA_31_8B, 41943040)),
    ],
)
def test_llama31_8b_full_depth_counts(method: str, expected: tuple[int, int]) -> None:
    spec = load_spec("meta-llama/Llama-3.1-8B")
    job = make_job(method=method) if method == "full" else make_job(method=method, lora_r=16)
    model = build_model(spec.config, job, "meta", n_layers=spec.num_layers)
    assert count_params(model) == expected


@pytest.mark.slow
def test_llama31_8b_estimate_counts() -> None:
    spec = load_spec("meta-llama/Llama-3.1-8B")
    est = estimate(spec, make_job(method="lora"))
    assert est.total_params == LLAMA_31_8B == spec.source["params"]
    assert est.trainable_params == 41943040
    assert est.lora_targets == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


@pytest.mark.slow
def test_llama2_7b_total() -> None:
    spec = load_spec("meta-llama/Llama-2-7b-hf")
    est = estimate(spec, make_job(method="lora"))
    assert est.total_params == 6738415616 == spec.source["params"]
    # 32 layers x r16 x (4 x (4096+4096) + 3 x (4096+11008))
    assert est.trainable_params == 32 * 16 * (4 * 8192 + 3 * (4096 + 11008))
