"""Preference tuning (`step/tasks/preference.py`): each method's loss as its paper writes
it, the reference as the adapter off, a frozen copy or precomputed log-probabilities, the
rows as TRL reads them, and the tiny model learning a toy preference on the CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, TINY, make_cfg

from frugal.cli.main import main
from frugal.data.pairs import (
    pair_stats,
    read_preferences,
    tokenize_preferences,
)
from frugal.errors import FrugalError
from frugal.estimate.simulate import simulate
from frugal.models.specs import load_spec
from frugal.run import recipe
from frugal.step.job import make_job
from frugal.step.loss import IGNORE
from frugal.step.tasks.preference import METHODS, Logps, PreferenceLoss, sequence_logps

PAIRS = ROOT / "examples" / "preference" / "train.jsonl"
VAL = ROOT / "examples" / "preference" / "val.jsonl"
KTO = ROOT / "examples" / "preference" / "kto.jsonl"


# -- the losses, against their papers' formulas ---------------------------------------------


def test_sequence_logps_sum_the_completions_tokens() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    labels = torch.tensor([[IGNORE, IGNORE, 3, 4, 1], [IGNORE, 6, 2, IGNORE, IGNORE]])
    got, n = sequence_logps(logits, labels)
    lp = logits.log_softmax(-1)
    want = [lp[0, 1, 3] + lp[0, 2, 4] + lp[0, 3, 1], lp[1, 0, 6] + lp[1, 1, 2]]
    torch.testing.assert_close(got, torch.stack(want))
    assert n.tolist() == [3, 2]


LOGP = torch.tensor([-4.0, -6.0, -9.0, -5.0])  # chosen 0, 1; rejected 0, 1
REF = torch.tensor([-5.0, -6.5, -8.0, -5.5])
N = torch.tensor([2, 3, 4, 2])


@pytest.mark.parametrize("method", ["dpo", "ipo", "simpo", "orpo"])
def test_each_paired_loss_is_its_papers(method: str) -> None:
    beta, gamma = 0.2, 0.3
    loss = PreferenceLoss(METHODS[method], beta=beta, gamma=gamma)
    per, stats = loss.method.losses(Logps(LOGP, N, REF), loss, {})
    w, l_, rw, rl = LOGP[:2], LOGP[2:], REF[:2], REF[2:]
    nw, nl = N[:2].float(), N[2:].float()
    if method == "dpo":  # Rafailov et al. eq. 7
        want = -F.logsigmoid(beta * ((w - rw) - (l_ - rl)))
    elif method == "ipo":  # Azar et al. eq. 17, average log-probabilities
        want = (((w - rw) / nw - (l_ - rl) / nl) - 1 / (2 * beta)) ** 2
    elif method == "simpo":  # Meng et al. eq. 6
        want = -F.logsigmoid(beta * (w / nw - l_ / nl) - gamma)
    else:  # Hong et al. eq. 6-7: odds of the average probability
        pw, pl = torch.exp(w / nw), torch.exp(l_ / nl)
        ratio = torch.log(pw / (1 - pw)) - torch.log(pl / (1 - pl))
        want = -w / nw - beta * F.logsigmoid(ratio)
    torch.testing.assert_close(per, want)
    # rewards: beta (log pi - log pi_ref); without a reference, beta x the average log pi
    assert stats["correct"].item() == (1.0 if method in ("dpo", "ipo") else 2.0)


def test_kto_weighs_each_row_against_the_kl_of_the_mismatched_rows() -> None:
    """Ethayarajh et al. eq. 8: z from the mismatched half, clamped at 0, not trained."""
    logp = torch.tensor([-4.0, -6.0, -3.0, -5.0], requires_grad=True)
    ref = torch.tensor([-5.0, -5.0, -4.0, -6.0])
    good = torch.tensor([True, False])
    loss = PreferenceLoss(METHODS["kto"], 0.5, desirable_weight=1.0, undesirable_weight=2.0)
    per, stats = loss.method.losses(Logps(logp, N, ref), loss, {"desirable": good})
    z = ((logp[2:] - ref[2:]).mean()).clamp(min=0).detach()  # 1.0
    r = logp[:2] - ref[:2]
    want = torch.stack(
        [1 - torch.sigmoid(0.5 * (r[0] - z)), 2 * (1 - torch.sigmoid(0.5 * (z - r[1])))]
    )
    torch.testing.assert_close(per, want)
    per.sum().backward()
    assert logp.grad is not None and logp.grad[2:].abs().sum() == 0  # z is not trained
    assert stats["desirable"].item() == 1.0


# -- the reference: no second copy under LoRA, a frozen copy under full, none precomputed ----


def _frozen_and_flops(**job: object) -> tuple[float, float]:
    spec = load_spec("HuggingFaceTB/SmolLM2-135M")
    t = simulate(spec.config, make_job(seq=64, **job), 2, [(1, 64)])[0]
    return float(t.live[:, 0].max()), float(t.flops["forward"])


def test_the_reference_is_the_adapter_off_a_frozen_copy_or_precomputed() -> None:
    lora, lora_fwd = _frozen_and_flops(task="preference")
    causal, _ = _frozen_and_flops()
    assert lora == causal  # the adapter off: no second copy of the weights
    full, full_fwd = _frozen_and_flops(task="preference", method="full")
    pre, pre_fwd = _frozen_and_flops(task="preference", method="full", reference="precomputed")
    orpo, orpo_fwd = _frozen_and_flops(task="preference", method="full", preference="orpo")
    assert pre == orpo < 1024  # buffers only
    assert full == pytest.approx(lora, rel=0.01)  # the copy, in bf16 as LoRA's frozen base
    # the reference's forward: a second forward of both sequences, none when precomputed
    assert full_fwd == pytest.approx(2 * pre_fwd, rel=0.01) and pre_fwd == orpo_fwd
    assert lora_fwd == pytest.approx(full_fwd, rel=0.05)


# -- rows -------------------------------------------------------------------------------------


def _write(tmp_path: Path, *rows: dict[str, object]) -> str:
    p = tmp_path / "rows.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ([{"prompt": "a", "answer": "b"}], "needs prompt, chosen and rejected"),
        ([{"prompt": "a", "chosen": "b", "rejected": "c"},
          {"prompt": "a", "completion": "b", "label": True}], "give one kind per file"),
        ([{"prompt": "a", "completion": "b", "label": "maybe"}], "give true (desirable)"),
        ([{"prompt": "a", "chosen": "", "rejected": "c"}], "'chosen' is empty"),
        ([{"prompt": "a", "chosen": 3, "rejected": "c"}], "'chosen' is a number"),
    ],
)  # fmt: skip
def test_a_bad_preference_row_is_one_line_naming_it(
    tmp_path: Path, rows: list[dict[str, object]], says: str
) -> None:
    with pytest.raises(FrugalError) as e:
        read_preferences(_write(tmp_path, *rows))
    assert says in str(e.value) and "row" in str(e.value) and "\n" not in str(e.value)


def test_only_the_completion_is_trained_and_a_cut_prompt_drops_its_row(tmp_path: Path) -> None:
    from frugal.data.examples import load_tokenizer

    tok = load_tokenizer(str(TINY), "")
    path = _write(tmp_path, {"prompt": "hi", "chosen": "yes", "rejected": "no"},
                  {"prompt": "x" * 50, "chosen": "a", "rejected": "b"})  # fmt: skip
    rows = tokenize_preferences(read_preferences(path), tok, seq=20)
    assert len(rows) == 1 and rows.dropped == 1
    (ids, labels), (rids, rlabels) = rows.sequences(0)
    prompt = tok("hi")["input_ids"]
    assert ids[: len(prompt)] == prompt and labels[: len(prompt)] == [IGNORE] * len(prompt)
    assert labels[len(prompt):] == tok("yes", add_special_tokens=False)["input_ids"] + [
        tok.eos_token_id]  # fmt: skip
    assert rids[: len(prompt)] == prompt and rlabels[-1] == tok.eos_token_id


def test_conversational_rows_train_the_assistant_turn(tmp_path: Path) -> None:
    from frugal.data.examples import load_tokenizer

    tok = load_tokenizer(str(TINY), "")
    user = [{"role": "user", "content": "hi"}]
    path = _write(tmp_path, {"prompt": user, "chosen": [{"role": "assistant", "content": "hello"}],
                             "rejected": [{"role": "assistant", "content": "go"}]})  # fmt: skip
    rows = tokenize_preferences(read_preferences(path), tok, seq=256)
    head = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert rows.prompts[0] == tok(head, add_special_tokens=False)["input_ids"]
    assert "hello" in tok.decode(rows.chosen[0]) and "go" in tok.decode(rows.rejected[0])


def test_data_check_names_identical_pairs_and_prompts_in_completions(tmp_path: Path) -> None:
    from frugal.data.examples import load_tokenizer

    tok = load_tokenizer(str(TINY), "")
    rows = read_preferences(_write(
        tmp_path, {"prompt": "Say hi", "chosen": "Say hi there", "rejected": "Say hi there"},
        {"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "a", "chosen": "b",
                                                          "rejected": "c"},
    ))  # fmt: skip
    st = pair_stats(rows, tok, 2048)
    assert (st["identical_pairs"], st["prompt_in_completion"], st["duplicates"]) == (1, 1, 1)
    text = " ".join(st["warnings"])
    assert "drop them" in text and "keep the prompt out" in text and "dedupe" in text
    kto = read_preferences(_write(tmp_path, *[{"prompt": "p", "completion": f"c{i}",
                                               "label": i == 0} for i in range(8)]))  # fmt: skip
    assert any("kto_desirable_weight" in w for w in pair_stats(kto, tok, 64)["warnings"])


def test_data_check_of_the_example_pairs(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["data", "check", str(PAIRS), "--task", "preference", "--model", str(TINY),
                 "--seq", "192", "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["rows"] == 200 and out["kind"] == "pairs" and not out["warnings"]


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["job.preference=orpo", "job.reference=precomputed"], "ORPO has no reference"),
        (["job.sharding=fsdp", "job.gpus=2"], "not run under sharded weights"),
        (["job.loss_chunks=4"], "use --loss-chunks 0"),
    ],
)
def test_settings_preference_tuning_cannot_take_are_one_line(
    tmp_path: Path, overrides: list[str], says: str
) -> None:
    with pytest.raises(FrugalError) as e:
        make_cfg(tmp_path, "job.task=preference", f"data.path={PAIRS}", *overrides)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_preference_setting_on_a_causal_job_says_its_task(tmp_path: Path) -> None:
    with pytest.raises(FrugalError, match=r"training\.beta=0\.5 is for job\.task=preference"):
        make_cfg(tmp_path, "training.beta=0.5")


def test_kto_rows_under_a_paired_method_are_refused(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path / "run", "job.task=preference", f"data.path={KTO}")
    with pytest.raises(FrugalError, match=r"give job\.preference=kto"):
        recipe.train(cfg, quiet=True)


# -- training ---------------------------------------------------------------------------------


def _train(out: Path, *overrides: str) -> list[dict[str, float]]:
    cfg = make_cfg(
        out, "job.task=preference", "job.method=full", "job.seq=192", "job.batch=8",
        f"data.path={PAIRS}", f"data.val_path={VAL}", "data.epochs=2",
        "training.effective_batch=16", "training.learning_rate=0.001", "training.eval_every=0",
        *overrides,
    )  # fmt: skip
    recipe.train(cfg, quiet=True)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_tiny_model_learns_the_toy_preference_on_cpu(tmp_path: Path) -> None:
    """DPO of the example's random tiny model against its frozen copy: held-out pairs are
    ranked as the data ranks them (chance: 50%), with a margin, in seconds."""
    rows = _train(tmp_path / "dpo", "data.epochs=1")
    steps = [r for r in rows if "loss" in r]
    ev = rows[-1]
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)  # policy = reference
    assert steps[-1]["loss"] < 0.2 and ev["eval_preference_accuracy"] >= 0.9
    assert ev["eval_reward_margin"] > 1 and ev["eval_reward_chosen"] > ev["eval_reward_rejected"]
    assert {"reward_margin", "preference_accuracy", "reward_chosen"} <= set(steps[-1])


def test_a_precomputed_reference_trains_as_the_live_one(tmp_path: Path) -> None:
    """The same log-probabilities, from one pass before training: the same run, step for
    step; a resumed session reads the saved ones, not the trained model's."""
    one = ("job.method=lora", "job.lora_r=8", "data.epochs=1")
    live = _train(tmp_path / "live", *one)
    pre = _train(tmp_path / "pre", *one, "job.reference=precomputed")
    losses = [[r.get("loss", r.get("eval_loss")) for r in rows] for rows in (live, pre)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    saved = list((tmp_path / "pre" / "passes").glob("reference-*/ref_logps.npy"))
    assert len(saved) == 2 and all(np.load(p).shape[1] == 2 for p in saved)


@pytest.mark.parametrize("method", ["ipo", "simpo", "orpo", "kto"])
def test_every_method_trains_and_reports_its_rewards(tmp_path: Path, method: str) -> None:
    data = [f"data.path={KTO}", "data.val_path=null"] if method == "kto" else []
    rows = _train(tmp_path / method, f"job.preference={method}", "data.epochs=1", *data)
    steps = [r for r in rows if "loss" in r]
    assert steps[-1]["loss"] < steps[0]["loss"] and steps[-1]["reward_margin"] > 0
    assert ("kl" in steps[-1]) == (method == "kto")


def test_estimate_shows_the_reference_copy_only_for_full_fine_tuning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Llama-3.1-8B DPO: LoRA's reference is its adapter off (frozen weights as a causal
    LoRA's), full fine-tuning's a bf16 copy (2 bytes a parameter: 14.96 GiB)."""

    def frozen(*args: str) -> float:
        assert main(["estimate", "meta-llama/Llama-3.1-8B", "--json", *args]) == 0
        return float(json.loads(capsys.readouterr().out)["breakdown_gib"]["frozen_weights"])

    assert frozen("--task", "preference") == frozen()
    assert frozen("--task", "preference", "--method", "full") == pytest.approx(
        8_030_261_248 * 2 / 2**30, rel=0.002
    )
    assert frozen("--task", "preference", "--method", "full", "--reference", "precomputed") == 0


def test_the_plan_prices_the_reference_both_ways_and_keeps_the_cheaper(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Full DPO of Llama-3.1-8B over three epochs: the frozen copy's memory and its forward
    every step cost more than one pass before training; a reference given is kept."""

    def plan(*more: str) -> dict[str, object]:
        argv = [
            "plan",
            "meta-llama/Llama-3.1-8B",
            "--task",
            "preference",
            "--dataset",
            str(PAIRS),
            "--seq",
            "256",
            "--method",
            "full",
            "--epochs",
            "3",
            "--json",
        ]
        assert main(argv + list(more)) == 0  # fmt: skip
        return dict(json.loads(capsys.readouterr().out))

    chosen = plan()
    rec, notes = chosen["recommendation"], chosen["notes"]
    assert isinstance(rec, dict) and isinstance(notes, list)
    assert rec["reference"] == "precomputed"
    said = next(n for n in notes if n.startswith("--reference precomputed: $"))
    assert "saves $" in said and "frozen copy leaves memory" in said
    asked = plan("--reference", "auto")
    rec, notes = asked["recommendation"], asked["notes"]
    assert isinstance(rec, dict) and isinstance(notes, list)
    assert rec["reference"] == "auto" and not any(n.startswith("--reference") for n in notes)
    assert rec["est_cost_usd"] > chosen["recommendation"]["est_cost_usd"]  # type: ignore[index]


def test_data_check_reads_kto_rows_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "check", str(KTO), "--task", "preference", "--model", str(TINY),
                 "--seq", "192"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "198 KTO rows" in out and "desirable: 50%" in out and "warning" not in out
