"""Distillation (`step/tasks/distill.py`): Hinton et al.'s loss, the teacher priced at its
own depth beside the student's, one tokenizer, and a student that beats the same student
trained on its labels alone."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import ROOT, TINY

from frugal.cli.main import main
from frugal.config import validate_run_config
from frugal.errors import FrugalError
from frugal.run import recipe
from frugal.step.job import make_job
from frugal.step.loss import IGNORE
from frugal.step.tasks.distill import DistillLoss, distill_loss

DISTILL = ROOT / "examples" / "distill"


def test_the_loss_is_hintons_soft_targets_mixed_with_the_labels() -> None:
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 4, 6), torch.randn(2, 4, 6)
    labels = torch.tensor([[IGNORE, 1, 2, 3], [IGNORE, IGNORE, 5, 0]])
    alpha, t = 0.3, 2.5
    got, ce = distill_loss(student, teacher, labels, DistillLoss(alpha=alpha, temperature=t))
    want = want_ce = torch.zeros(())
    for r in range(2):
        for i in range(3):  # position i predicts labels[i + 1]
            y = int(labels[r, i + 1])
            if y == IGNORE:
                continue
            p = F.softmax(teacher[r, i] / t, -1)
            kl = (p * (p.log() - F.log_softmax(student[r, i] / t, -1))).sum()
            nll = -F.log_softmax(student[r, i], -1)[y]
            want = want + alpha * t * t * kl + (1 - alpha) * nll
            want_ce = want_ce + nll
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(ce, want_ce)


def test_a_distilled_job_needs_a_teacher_of_the_students_tokenizer() -> None:
    with pytest.raises(FrugalError, match="needs --teacher MODEL"):
        make_job(task="distill")
    with pytest.raises(FrugalError) as e:
        main_or_raise("estimate", "meta-llama/Llama-3.2-1B", "--task", "distill", "--teacher",
                      "Qwen/Qwen3-8B")  # fmt: skip
    assert "vocabulary of 151,936 tokens and the student 128,256" in str(e.value)


def main_or_raise(*argv: str) -> None:
    from frugal.cli.main import app

    app(list(argv), standalone_mode=False)


def test_the_teacher_is_priced_at_its_own_depth(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.2-1B (16 layers) learning from Llama-3.1-8B (32): the teacher's bf16
    weights beside the student's, and its forward in the step's FLOPs, though the estimate
    simulates shallow copies of the student."""

    def estimate(*args: str) -> dict[str, object]:
        assert main(["estimate", "meta-llama/Llama-3.2-1B", "--json", *args]) == 0
        return dict(json.loads(capsys.readouterr().out))

    alone = estimate()
    taught = estimate("--task", "distill", "--teacher", "meta-llama/Llama-3.1-8B")
    frozen = [d["breakdown_gib"]["frozen_weights"] for d in (alone, taught)]  # type: ignore[index]
    assert frozen[1] - frozen[0] == pytest.approx(8_030_261_248 * 2 / 2**30, rel=0.002)
    fwd = [d["flops_per_step"]["forward"] for d in (alone, taught)]  # type: ignore[index]
    assert fwd[1] - fwd[0] == pytest.approx(2 * 8_030_261_248 * 2048, rel=0.05)
    assert taught["trainable_params"] == alone["trainable_params"]


def test_a_teacher_of_another_tokenizer_is_refused_before_training(tmp_path: Path) -> None:
    teacher = tmp_path / "teacher"
    shutil.copytree(TINY, teacher)
    tok = json.loads((teacher / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[10], list(vocab)[11]  # the same size, two tokens swapped
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (teacher / "tokenizer.json").write_text(json.dumps(tok))
    cfg = _config(tmp_path / "run", teacher)
    with pytest.raises(FrugalError, match="another tokenizer than the student's"):
        recipe.train(cfg, quiet=True)


def _config(out: Path, teacher: Path, **training: object) -> object:
    raw = yaml.safe_load((DISTILL / "run.yaml").read_text())
    raw["job"]["teacher"] = str(teacher)
    raw["model"] = str(DISTILL / "student")
    raw["tokenizer"] = str(TINY)
    raw["data"]["path"] = str(ROOT / "examples" / "sentiment" / "train.jsonl")
    raw["training"].update(training)
    raw["output_dir"] = str(out)
    return validate_run_config(raw, "run.yaml")


@pytest.mark.slow
def test_the_distilled_student_beats_the_same_student_on_labels_alone(tmp_path: Path) -> None:
    """examples/distill: the tiny model trained on the reviews' texts teaches a student a
    third its size, whose held-out loss on the labels ends below the labels-only run's."""
    teacher = yaml.safe_load((DISTILL / "teacher.yaml").read_text())
    teacher["model"] = str(TINY)
    teacher["data"]["path"] = str(ROOT / "examples" / "sentiment" / "train.jsonl")
    teacher["output_dir"] = str(tmp_path / "teacher")
    recipe.train(validate_run_config(teacher, "teacher.yaml"), quiet=True)

    def last(out: Path) -> dict[str, float]:
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if "eval_loss" in r][-1]

    recipe.train(_config(tmp_path / "kd", tmp_path / "teacher" / "final"), quiet=True)
    alone = yaml.safe_load((DISTILL / "run.yaml").read_text())
    alone["job"] = {k: v for k, v in alone["job"].items() if k not in ("task", "teacher")}
    alone["training"] = {k: v for k, v in alone["training"].items() if "distill" not in k}
    alone.update(model=str(DISTILL / "student"), tokenizer=str(TINY),
                 output_dir=str(tmp_path / "labels"))  # fmt: skip
    alone["data"]["path"] = str(ROOT / "examples" / "sentiment" / "train.jsonl")
    recipe.train(validate_run_config(alone, "labels.yaml"), quiet=True)
    kd, labels = last(tmp_path / "kd")["eval_label_loss"], last(tmp_path / "labels")["eval_loss"]
    assert math.isfinite(kd) and kd < 0.9 * labels  # 1.09 against 1.38 on two cores


@pytest.mark.parametrize(
    ("teacher", "says"),
    [([], "--yes: give --teacher"),
     (["--teacher", "Qwen/Qwen3-8B"], "pick a teacher of the student's tokenizer")],
)  # fmt: skip
def test_init_asks_a_distillation_for_its_teacher(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], teacher: list[str], says: str
) -> None:
    argv = ["init", "--yes", "--task", "distill", "--dataset", str(ROOT / "examples" / "data" /
            "spell.jsonl"), "--model", "meta-llama/Llama-3.2-1B", "--output",
            str(tmp_path / "f.yaml"), *teacher]  # fmt: skip
    assert main(argv) == 2
    assert says in capsys.readouterr().err and not (tmp_path / "f.yaml").exists()


# -- teacher logits precomputed ---------------------------------------------------------------


def test_the_top_k_loss_is_the_kl_over_the_teachers_top_k_renormalized() -> None:
    """k = the vocabulary: Hinton's loss exactly; below it, the teacher's distribution over
    its top k, against the student's log-probabilities of those tokens."""
    torch.manual_seed(1)
    student, teacher = torch.randn(2, 4, 6), torch.randn(2, 4, 6)
    labels = torch.tensor([[IGNORE, 1, 2, 3], [IGNORE, IGNORE, 5, 0]])
    loss = DistillLoss(alpha=0.7, temperature=2.0)
    whole = distill_loss(student, teacher, labels, loss)
    top = teacher.topk(6, dim=-1)
    torch.testing.assert_close(distill_loss(student, top.values, labels, loss, top.indices), whole)
    top = teacher.topk(2, dim=-1)
    got, ce = distill_loss(student, top.values, labels, loss, top.indices)
    p = F.softmax(top.values / 2, -1)
    q = F.log_softmax(student / 2, -1).gather(-1, top.indices)
    kl = (p * (p.log() - q)).sum(-1)[:, :3]  # positions 0..2 predict labels 1..3
    trained = labels[:, 1:] != IGNORE
    want = (0.7 * 4 * kl + 0.3 * 0).where(trained, 0.0).sum() + 0.3 * whole[1]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(ce, whole[1])


def _teacher(tmp_path: Path) -> Path:
    """A random teacher of the tiny model's shape, saved with its weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY))
    model.save_pretrained(tmp_path / "teacher")
    return tmp_path / "teacher"


def _losses(out: Path) -> list[float]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r.get("loss", r.get("eval_loss")) for r in rows]


def test_precomputed_teacher_logits_train_as_the_online_teacher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The teacher's top k = its whole vocabulary (128), from one pass before training:
    the online run's losses step for step (the logits kept as fp16); a resumed session
    reads the files and never runs the teacher."""
    teacher = _teacher(tmp_path)
    short = {"max_steps": 4, "eval_every": 2}
    recipe.train(_config(tmp_path / "online", teacher, **short), quiet=True)
    pre = _config(tmp_path / "pre", teacher, **short)
    pre = pre.model_copy(update={"job": pre.job.model_copy(update={
        "teacher_logits": "precomputed", "teacher_top_k": 128})})  # fmt: skip
    recipe.train(pre, quiet=True)
    online, got = _losses(tmp_path / "online"), _losses(tmp_path / "pre")
    assert got == pytest.approx(online, rel=2e-3) and len(got) >= 4
    files = sorted((tmp_path / "pre" / "passes").glob("teacher-*/*.npy"))
    assert len(files) == 4  # ids and logits, of the training and the validation rows
    ids = np.load(files[0], mmap_mode="r")
    assert ids.shape[1:] == (128, 128)

    def no_teacher(*_: object) -> None:
        raise AssertionError("the teacher ran again")

    monkeypatch.setattr("frugal.run.passes._compute", no_teacher)
    recipe.train(pre, quiet=True, resume="auto")  # from its last checkpoint


def test_top_k_without_precomputed_logits_is_one_line() -> None:
    with pytest.raises(FrugalError, match="add --teacher-logits precomputed"):
        make_job(task="distill", teacher="meta-llama/Llama-3.1-8B", teacher_top_k=16)


def test_precomputed_logits_take_the_teacher_out_of_the_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def frozen(*args: str) -> float:
        assert main(["estimate", "meta-llama/Llama-3.2-1B", "--json", "--task", "distill",
                     "--teacher", "meta-llama/Llama-3.1-8B", *args]) == 0  # fmt: skip
        return float(json.loads(capsys.readouterr().out)["breakdown_gib"]["frozen_weights"])

    assert frozen() - frozen("--teacher-logits", "precomputed") == pytest.approx(
        8_030_261_248 * 2 / 2**30, rel=0.002
    )
