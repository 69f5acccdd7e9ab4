"""Training-run diagnostics: each finding fires on its symptom and stays quiet otherwise."""

from __future__ import annotations

import math
import random

import pytest

from frugal.run.diagnose import Diagnostics, Finding


def _diag(precision: str = "bf16-mixed") -> Diagnostics:
    return Diagnostics(learning_rate=2e-4, precision=precision, max_grad_norm=1.0)


def _one_line(findings: list[Finding]) -> None:
    for f in findings:
        assert "\n" not in f.message


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_loss_is_fatal_and_names_lr(bad: float) -> None:
    d = _diag()
    assert d.on_step(1, 2.0, 1.0) == []
    (f,) = d.on_step(2, bad, 1.0)
    assert f.kind == "nonfinite_loss" and f.fatal and f.step == 2
    assert "training.learning_rate=2e-05" in f.message
    for knob in ("training.learning_rate", "job.precision", "training.max_grad_norm"):
        assert knob in f.message
    _one_line([f])


def test_nonfinite_grad_norm_is_fatal() -> None:
    (f,) = _diag().on_step(1, 2.0, math.nan)
    assert f.kind == "nonfinite_loss" and f.fatal


def test_fp16_mentions_bf16() -> None:
    (f,) = _diag("fp16-mixed").on_step(1, math.nan, None)
    assert "bf16" in f.message and "fp16" in f.message
    (g,) = _diag("bf16-mixed").on_step(1, math.nan, None)
    assert "fp16 overflow" not in g.message


def test_grad_spike_after_steady_norms() -> None:
    d = _diag()
    for s in range(20):
        assert d.on_step(s, 2.0 - 0.01 * s, 1.0 + 0.01 * (s % 3)) == []
    found = d.on_step(20, 1.8, 50.0)
    assert [f.kind for f in found] == ["grad_spike"]
    f = found[0]
    assert not f.fatal and "49.5x" in f.message  # 50 / median 1.01
    assert "training.learning_rate" in f.message and "training.warmup_ratio" in f.message
    assert "training.max_grad_norm" in f.message and "now 1" in f.message
    _one_line(found)
    # not repeated on the next step, even though it spikes again
    assert d.on_step(21, 1.79, 60.0) == []


def test_no_grad_spike_with_too_little_history() -> None:
    d = _diag()
    for s in range(9):  # window // 2 == 10 needed
        d.on_step(s, 2.0, 1.0)
    assert d.on_step(9, 2.0, 100.0) == []


def test_falling_noisy_loss_gives_no_findings() -> None:
    rng = random.Random(0)
    d = _diag()
    findings: list[Finding] = []
    for s in range(200):
        loss = 3.0 - 0.005 * s + rng.gauss(0.0, 0.05)
        findings += d.on_step(s, loss, 1.0 + rng.gauss(0.0, 0.1))
        if s % 25 == 24:
            findings += d.on_eval(s, 3.1 - 0.004 * s + rng.gauss(0.0, 0.01), None)
    assert findings == []


def test_overfitting_reported_once() -> None:
    d = _diag()
    out: list[Finding] = []
    for i, (ev, tr) in enumerate([(1.0, 1.2), (1.1, 1.0), (1.2, 0.9), (1.3, 0.8), (1.4, 0.7)]):
        out += d.on_eval(100 * i, ev, tr)
    assert [f.kind for f in out] == ["overfitting"]
    assert out[0].step == 200 and not out[0].fatal
    for knob in ("data.epochs", "training.early_stopping_patience", "job.lora_dropout"):
        assert knob in out[0].message
    _one_line(out)
    # eval falls, then rises twice again: a new streak is reported again
    out = []
    for i, (ev, tr) in enumerate([(1.0, 0.6), (1.1, 0.5), (1.2, 0.4)]):
        out += d.on_eval(600 + 100 * i, ev, tr)
    assert [f.kind for f in out] == ["overfitting"]


def test_overfitting_uses_moving_train_loss() -> None:
    d = _diag()
    out: list[Finding] = []
    loss = 2.0
    for i, ev in enumerate([1.0, 1.1, 1.2]):
        for s in range(10):
            loss -= 0.01
            d.on_step(10 * i + s, loss, 1.0)
        out += d.on_eval(10 * i + 9, ev, None)
    assert [f.kind for f in out] == ["overfitting"]


def test_no_overfitting_when_train_also_rises() -> None:
    d = _diag()
    out: list[Finding] = []
    for i, (ev, tr) in enumerate([(1.0, 0.9), (1.1, 1.0), (1.2, 1.1), (1.3, 1.2)]):
        out += d.on_eval(100 * i, ev, tr)
    assert out == []


def test_flat_loss_is_plateau() -> None:
    rng = random.Random(1)
    d = _diag()
    out: list[Finding] = []
    for s in range(1, 41):
        out += d.on_step(s, 1.5 + rng.gauss(0.0, 0.005), 1.0)
    assert [f.kind for f in out] == ["plateau"]
    assert out[0].step == 40 and "1.5" in out[0].message
    for knob in ("training.learning_rate", "training.schedule", "training.max_steps"):
        assert knob in out[0].message
    _one_line(out)
    # not reported again within 2 * window steps
    for s in range(41, 80):
        out += d.on_step(s, 1.5, 1.0)
    assert len(out) == 1
    out += d.on_step(80, 1.5, 1.0)
    assert len(out) == 2


def test_decreasing_loss_is_no_plateau() -> None:
    d = _diag()
    out: list[Finding] = []
    for s in range(1, 201):
        out += d.on_step(s, 2.0 * 0.995**s + 0.1, 1.0)
    assert [f for f in out if f.kind == "plateau"] == []


def test_state_round_trip_continues_like_an_uninterrupted_run() -> None:
    """A resumed run restores the windows: the findings match a run never stopped."""
    import json

    rng = random.Random(3)
    losses = [1.5 + rng.gauss(0.0, 0.005) for _ in range(60)]
    norms = [1.0] * 30 + [50.0] + [1.0] * 29
    evals = [(10, 1.0), (20, 1.1), (30, 1.2)]

    def feed(d: Diagnostics, steps: range) -> list[Finding]:
        out: list[Finding] = []
        for s in steps:
            out += d.on_step(s, losses[s - 1], norms[s - 1])
            for at, ev in evals:
                if at == s:
                    out += d.on_eval(s, ev, None)
        return out

    whole = feed(_diag(), range(1, 61))
    first = _diag()
    part = feed(first, range(1, 26))
    resumed = _diag()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # via the checkpoint
    part += feed(resumed, range(26, 61))
    assert [(f.kind, f.step) for f in part] == [(f.kind, f.step) for f in whole]
    assert {"plateau", "grad_spike", "overfitting"} <= {f.kind for f in whole}
    # without the state, the second half misses what needed the first half's history
    late = [(f.kind, f.step) for f in whole if f.step >= 26]
    fresh = feed(_diag(), range(26, 61))
    assert late and [(f.kind, f.step) for f in fresh] != late
