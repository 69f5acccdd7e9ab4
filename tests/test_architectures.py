"""Every architecture answers with defaults: each bundled model's first estimate (from its
shipped profile, its parameters as bundled), and the step of the architectures people
fine-tune beside them (MoE, hybrid Mamba, Gemma 3n's AltUp), simulated from their config
class's own defaults under LoRA and QLoRA: an answer, or one line naming the fix, never an
internal error.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from frugal.errors import FrugalError
from frugal.estimate.simulate import shallow_depths, simulate
from frugal.models.specs import bundled_model_ids, load_spec
from frugal.step.job import TrainJob

# transformers model types beyond the bundle, each a family fine-tuned today
COMMON = ["glm4_moe", "olmoe", "qwen2_moe", "phimoe", "granitemoe", "ernie4_5_moe",
          "minimax", "jamba", "falcon_h1", "granitemoehybrid", "qwen3_next", "gemma3n_text",
          "cohere2", "olmo2", "exaone4", "lfm2"]  # fmt: skip


def _defaults(model_type: str) -> dict[str, Any]:
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]().to_dict()
    config.pop("transformers_version", None)
    return config


@pytest.mark.parametrize("model_type", COMMON)
@pytest.mark.slow
def test_a_common_architecture_runs_the_step(model_type: str) -> None:
    config = _defaults(model_type)
    for method in ("lora", "qlora"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trace = simulate(config, TrainJob(method=method, seq=32),
                             shallow_depths(config)[0], [(1, 32)])[0]  # fmt: skip
        assert trace.flops["forward"] > 0 and trace.lora_targets, (model_type, method)


@pytest.mark.parametrize(
    ("model_type", "said"),
    [
        ("deepseek_v2", "how many a token meets"),  # its class defaults name no top-k
        ("hunyuan_v1_moe", "transformers cannot build a hunyuan_v1_moe model"),
        ("jetmoe", "use --no-grad-checkpointing"),
    ],
)
def test_a_config_the_step_cannot_take_is_one_line(model_type: str, said: str) -> None:
    from frugal.step.model import build_model

    with pytest.raises(FrugalError, match=said):
        build_model(_defaults(model_type), TrainJob(), "meta", n_layers=2)


def test_every_bundled_model_answers_from_its_shipped_profile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A user's first estimate of each bundled model simulates nothing, and counts the
    parameters (and a MoE model's active ones) the bundle carries."""
    import frugal.estimate.simulate as sim
    from frugal.estimate import cache
    from frugal.estimate.core import estimate

    index = cache.shipped_dir() / "index.json"
    import json

    if json.loads(index.read_text())["versions"] != cache.versions():
        pytest.skip("the shipped profiles are not this step format's: run `make profiles`")
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sim, "simulate", lambda *a, **k: pytest.fail("simulated"))
    for model in bundled_model_ids():
        spec = load_spec(model)
        est = estimate(spec, TrainJob())
        assert est.total_params == spec.source["params"], model
        assert est.active_params == spec.source.get("active_params", est.total_params), model
