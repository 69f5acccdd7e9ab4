"""The training settings a plan chooses (frugal.plan.hyper): pinned over a grid of model
sizes, methods, tasks and data sizes; what the user gives is kept as theirs."""

from __future__ import annotations

from typing import Any

import pytest

from frugal.models.specs import load_spec
from frugal.plan.hyper import SOURCES, WHERE, choose

SMALL, LARGE, HUGE = "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", 2e9


def _pick(model: str, method: str, task: str = "causal", tokens: float = 50e6,
          **given: Any) -> dict[str, Any]:  # fmt: skip
    got = choose(load_spec(model).config, method, task, tokens, 2048, given)  # type: ignore[arg-type]
    shape = {c.name: c.value for c in choose(load_spec(model).config, "lora", task, tokens,  # type: ignore[arg-type]
                                             2048, given)}  # fmt: skip
    # what shapes the step is the same whichever method: methods compare on the same steps
    assert all(shape[k] == c.value for c in got for k in ("effective_batch", "epochs")
               if c.name == k)  # fmt: skip
    return {c.name: c.value for c in got}


GRID = [
    # model, method, task, tokens: the settings
    (SMALL, "lora", "causal", 50e6, dict(lora_targets="all-linear", lora_r=16, lora_alpha=32,
     lora_dropout=0.0, learning_rate=2e-4, schedule="cosine", warmup_ratio=0.03,
     effective_batch=16, epochs=1.0)),
    (SMALL, "qlora", "causal", 5e6, dict(lora_r=16, learning_rate=2e-4, epochs=3.0,
     effective_batch=16)),
    (LARGE, "qlora", "causal", 50e6, dict(lora_r=16, learning_rate=1e-4, epochs=1.0)),
    (LARGE, "lora", "causal", HUGE, dict(lora_r=64, learning_rate=1e-4, epochs=1.0)),
    (SMALL, "full", "causal", 50e6, dict(learning_rate=2e-5, effective_batch=16, epochs=1.0,
     schedule="cosine", warmup_ratio=0.03)),
    (LARGE, "full", "causal", 50e6, dict(learning_rate=1e-5, effective_batch=16)),
    (SMALL, "full", "classification", 2e6, dict(learning_rate=2e-5, effective_batch=32,
     epochs=3.0, schedule="linear", warmup_ratio=0.06)),
    (SMALL, "lora", "classification", 2e6, dict(lora_r=8, lora_alpha=16, learning_rate=4e-4,
     effective_batch=32, epochs=3.0, warmup_ratio=0.06)),
    # a tiny dataset: the batch halves until an epoch still has 8 steps
    (SMALL, "full", "causal", 100 * 2048, dict(effective_batch=8, epochs=3.0)),
]  # fmt: skip


@pytest.mark.parametrize(("model", "method", "task", "tokens", "want"), GRID)
def test_the_settings_follow_the_model_the_method_the_task_and_the_data(
    model: str, method: str, task: str, tokens: float, want: dict[str, Any]
) -> None:
    got = _pick(model, method, task, tokens)
    assert {k: got[k] for k in want} == want
    adapters = {"lora_r", "lora_alpha", "lora_dropout", "lora_targets"}
    assert (method == "full") == adapters.isdisjoint(got)  # no adapter settings for full


def test_each_choice_says_why_and_where_it_comes_from() -> None:
    for method in ("lora", "full"):
        for c in choose(load_spec(SMALL).config, method, "causal", 5e6, 2048, {}):
            assert c.source in SOURCES and c.reason and c.name in WHERE and not c.yours
            assert f"[{SOURCES[c.source]}]" in c.line and c.name in c.line
            assert c.to_json()["setting"] == f"{WHERE[c.name]}.{c.name}"


def test_what_the_user_gives_wins_and_is_shown_as_theirs() -> None:
    got = choose(load_spec(SMALL).config, "lora", "causal", 5e6, 2048,
                 {"lora_r": 4, "epochs": 1.0, "learning_rate": None})  # fmt: skip
    by = {c.name: c for c in got}
    assert by["lora_r"].value == 4 and by["lora_r"].yours
    # yours, and what frugal would have chosen, with its reason and source
    assert by["lora_r"].line.startswith("job.lora_r 4: yours (frugal would choose 16: the rank")
    assert by["lora_r"].line.endswith("[QLoRA])")
    assert by["epochs"].value == 1.0 and by["epochs"].yours
    assert by["learning_rate"].value == 2e-4 and not by["learning_rate"].yours  # None: not given
    assert by["lora_r"].to_json()["frugal_would_choose"] == 16
    assert "frugal_would_choose" not in by["learning_rate"].to_json()
    # the user's epochs decide whether the data is large enough for a larger rank
    big = {c.name: c.value for c in choose(load_spec(SMALL).config, "lora", "causal", 600e6,
                                           2048, {"epochs": 2.0})}  # fmt: skip
    assert big["lora_r"] == 64
