"""Sequence classification (issue 31): `job.task: classification` through the one step
builder: the trainer learns the shipped example data on CPU, the estimate prices the same
step without logits over the vocabulary, and bad settings are one line."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import ROOT, make_cfg, run_json

from frugal.cli.main import main
from frugal.config import validate_run_config
from frugal.data.labels import balanced_weights, class_metrics, read_labelled
from frugal.errors import FrugalError
from frugal.estimate.core import estimate
from frugal.models.specs import load_spec
from frugal.run import recipe
from frugal.step.job import make_job
from frugal.step.loss import classification_loss

EXAMPLES = ROOT / "examples"


def example_cfg(name: str, out: Path, **training: Any) -> Any:
    raw = yaml.safe_load((EXAMPLES / name / "run.yaml").read_text())
    for key in ("model",):
        raw[key] = str(ROOT / raw[key])
    for key in ("path", "val_path"):
        raw["data"][key] = str(ROOT / raw["data"][key])
    raw["output_dir"] = str(out)
    raw["training"].update(training)
    return validate_run_config(raw, name)


def test_a_classifier_learns_the_sentiment_data_well_above_the_majority_in_a_minute(
    tmp_path: Path,
) -> None:
    val, _ = read_labelled(str(EXAMPLES / "sentiment" / "val.jsonl"))
    majority = max(Counter(e.label for e in val).values()) / len(val)
    start = time.monotonic()
    s = recipe.train(example_cfg("sentiment", tmp_path), quiet=True)
    assert time.monotonic() - start < 60
    assert s.outcome == "completed"
    assert s.best_metrics["accuracy"] >= majority + 0.3, s.best_metrics
    assert s.best_metrics["macro_f1"] >= 0.75
    assert {"precision/positive", "recall/negative"} <= set(s.best_metrics)
    # the predictions of the validation file, by the best weights, with the class names
    lines = [json.loads(x) for x in Path(s.outputs["predictions"]).read_text().splitlines()]
    assert len(lines) == len(val)
    assert {x["label"] for x in lines} == {"negative", "positive"}
    right = sum(x["label"] == x["predicted"] for x in lines) / len(lines)
    assert right == pytest.approx(s.best_metrics["accuracy"])
    assert all(sum(x["probabilities"].values()) == pytest.approx(1, abs=1e-4) for x in lines)
    # the exported model knows its classes
    config = json.loads((Path(s.outputs["model"]) / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["architectures"] == ["LlamaForSequenceClassification"]


def test_a_lora_classifier_saves_its_head_with_the_adapter(tmp_path: Path) -> None:
    """PEFT's sequence-classification task: the new head is trained whole and saved."""
    from safetensors import safe_open

    cfg = make_cfg(
        tmp_path, "job.task=classification", "job.num_labels=3", "job.seq=64",
        f"data.path={EXAMPLES / 'trades' / 'train.jsonl'}", "training.max_steps=3",
        "training.class_weights=balanced",
    )  # fmt: skip
    s = recipe.train(cfg, quiet=True)
    adapter = Path(s.outputs["adapter"])
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        assert any(k.endswith("score.weight") for k in f.keys())  # noqa: SIM118
    assert json.loads((adapter / "adapter_config.json").read_text())["task_type"] == "SEQ_CLS"


def test_the_weighted_loss_sums_like_the_step_and_means_like_torch() -> None:
    torch.manual_seed(0)
    logits, labels = torch.randn(6, 3), torch.tensor([0, 1, 2, 2, 2, 1])
    w = torch.tensor(balanced_weights(labels.tolist(), 3))
    total, count = classification_loss(logits, labels, w)
    assert float(total / count) == pytest.approx(float(F.cross_entropy(logits, labels, weight=w)))
    # two micro-batches summed, divided once: the whole batch's weighted mean
    halves = [classification_loss(logits[i : i + 3], labels[i : i + 3], w) for i in (0, 3)]
    mean = sum(float(t) for t, _ in halves) / sum(float(c) for _, c in halves)
    assert mean == pytest.approx(float(total / count))
    assert balanced_weights([0, 0, 0, 1], 3) == (4 / 9, 4 / 3, 0.0)


def test_metrics_from_a_confusion_matrix() -> None:
    # true rows, predicted columns: 10 of a (8 right), 5 of b (3 right), c never seen nor said
    m = class_metrics([[8, 2, 0], [2, 3, 0], [0, 0, 0]], ("a", "b", "c"))
    assert m["accuracy"] == pytest.approx(11 / 15)
    assert m["precision/a"] == pytest.approx(0.8) and m["recall/b"] == pytest.approx(0.6)
    assert "f1/c" not in m  # no row of c and none predicted: not in the macro mean
    assert m["macro_f1"] == pytest.approx((0.8 + 0.6) / 2)


def test_a_7b_class_classifier_holds_less_for_logits_than_its_causal_lm_and_says_why() -> None:
    spec = load_spec("meta-llama/Llama-3.1-8B")
    causal = estimate(spec, make_job(packing=False)).to_json()
    classifier = estimate(spec, make_job(task="classification")).to_json()
    assert causal["breakdown_gib"]["logits_and_loss"] > 1.0
    assert classifier["breakdown_gib"]["logits_and_loss"] < 0.01
    assert classifier["peak_allocated_gib"] < causal["peak_allocated_gib"]
    assert any("no logits over the vocabulary" in n for n in classifier["notes"])
    # the head: 4,096 x 2 weights, trained whole beside the adapters
    assert classifier["trainable_params"] - causal["trainable_params"] == 4096 * 2


def test_plan_counts_a_classifiers_classes_and_writes_a_config_train_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "frugal.yaml"
    got = run_json(
        capsys, "plan", "meta-llama/Llama-3.2-1B", "--task", "classification", "--seq", "128",
        "--dataset", str(EXAMPLES / "trades" / "train.jsonl"), "--providers", "aws",
        "--write", str(out), "--json",
    )  # fmt: skip
    rec = got["recommendation"]
    assert (rec["task"], rec["num_labels"], rec["loss_chunks"]) == ("classification", 3, 0)
    assert any("240 rows of 3 classes" in n for n in got["notes"])
    written = yaml.safe_load(out.read_text())
    assert (written["job"]["task"], written["job"]["packing"]) == ("classification", False)
    validate_run_config(written, str(out))  # the config train reads


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            ["training.best_metric=accuracy"],
            "is for job.task=classification: set job.task=classification, or best_metric=eval_loss",
        ),
        (["training.class_weights=balanced"], "job.task=classification, or class_weights=none"),
        (["job.task=classification", "job.loss_chunks=4"], "use --loss-chunks 0"),
        (["job.task=classification", "job.loss=ce+contrastive"], "(--loss ce)"),
    ],
)
def test_settings_a_classifier_cannot_take_are_one_line(
    tmp_path: Path, overrides: list[str], says: str
) -> None:
    with pytest.raises(FrugalError, match=None) as e:
        make_cfg(tmp_path, *overrides)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_config_whose_classes_differ_from_the_data_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = example_cfg("trades", tmp_path / "run")
    path = tmp_path / "c.yaml"
    raw = cfg.model_dump(mode="json")
    raw["job"]["num_labels"] = 2
    path.write_text(yaml.safe_dump(raw))
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has 3 classes (buy, hold, sell): set job.num_labels=3" in err[0]


def test_the_quality_report_ranks_classifiers_by_their_metric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from frugal.ledger.quality import quality
    from frugal.ledger.store import Ledger

    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    monkeypatch.setenv("FRUGAL_DB_URL", url)
    got = {}
    for lr in (1e-5, 3e-3):  # the first barely moves: the sweep has a loser
        cfg = make_cfg(
            tmp_path / f"lr{lr}", "job.task=classification", "job.num_labels=3",
            "job.seq=64", "job.method=full", f"training.learning_rate={lr}",
            f"data.path={EXAMPLES / 'trades' / 'train.jsonl'}", "data.val_ratio=0.2",
            "training.max_steps=8", "training.eval_every=4", "training.best_metric=macro_f1",
            "tags={sweep: cls}",
        )  # fmt: skip
        got[lr] = recipe.train(cfg, quiet=True).best_metrics
    rep = quality(Ledger(url), {"sweep": "cls"}, "macro_f1")
    assert {r.settings["learning_rate"]: r.value for r in rep.runs} == pytest.approx(
        {lr: m["macro_f1"] for lr, m in got.items()}, abs=1e-6
    )
    assert rep.runs[0].value == max(m["macro_f1"] for m in got.values())  # higher is better
    assert got[3e-3]["macro_f1"] > got[1e-5]["macro_f1"]
    (effect,) = rep.effects
    assert effect.moved == pytest.approx(got[3e-3]["macro_f1"] - got[1e-5]["macro_f1"], abs=1e-6)
    assert main(["costs", "quality", "--scope", "sweep=cls", "--metric", "accuracy"]) == 0
    assert "learning_rate moved the best accuracy by" in capsys.readouterr().out
