"""The optimizer in backward (--optimizer-in-backward): each weight updated, and its gradient
freed, as soon as the gradient is complete; the same update as the step after backward."""

from __future__ import annotations

import copy
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import UNTIED_LLAMA, assert_same_weights, losses, make_cfg, run_error, run_json

from frugal.errors import FrugalError
from frugal.estimate.categories import CATEGORIES
from frugal.estimate.tracker import StepTracker, tracking
from frugal.run import recipe, training_loop
from frugal.step.job import make_job
from frugal.step.loop import PlainEngine, UpdateRule, optimizer_step
from frugal.step.model import build_model
from frugal.step.optim import PerParameter, make_optimizer
from frugal.step.tasks import task_of
from frugal.step.tasks.causal import TokenLoss

TINY = UNTIED_LLAMA
B, S = 2, 40


def _steps(in_backward: bool, method: str, optimizer: str, tracker: Any = None) -> Any:
    """Three real steps on CPU: each step's loss and gradient norm, and the final weights."""
    torch.manual_seed(0)
    job = make_job(method=method, precision="fp32", seq=S)
    model = build_model(TINY, job, "random")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(optimizer, params, lr=1e-2, weight_decay=0.1, in_backward=in_backward)
    g = torch.Generator().manual_seed(1)
    out = []
    for step in range(3):
        ids = torch.randint(3, TINY["vocab_size"], (B, S), generator=g)
        batch = {"input_ids": ids, "labels": ids.clone()}
        watch = tracking(tracker) if tracker is not None and step == 2 else torch.enable_grad()
        hooks = tracker.watch(model, opt) if tracker is not None and step == 2 else []
        with watch:
            sums = optimizer_step(
                model,
                opt,
                params,
                [batch],
                PlainEngine("fp32"),
                UpdateRule(task_of("causal"), TokenLoss(), 1 / (B * S), 1.0, 0.0),
            )
        for h in hooks:
            h.remove()
        out.append((float(sums.ce), float(sums.grad_norm)))
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return out, weights


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "optimizer"), [("full", "adamw"), ("lora", "adamw"), ("full", "sgd")]
)
def test_the_update_is_the_one_after_backward(method: str, optimizer: str) -> None:
    """Losses, gradient norms and weights after three steps: bit-identical updates (each
    weight's update reads only its own gradient and state), norms to float rounding (one
    norm of norms instead of one over all gradients)."""
    plain, w0 = _steps(False, method, optimizer)
    fused, w1 = _steps(True, method, optimizer)
    for (ce0, n0), (ce1, n1) in zip(plain, fused, strict=True):
        assert ce0 == ce1
        assert n1 == pytest.approx(n0, rel=1e-6) and n0 > 0
    assert w0.keys() == w1.keys() and w0
    for name in w0:
        assert torch.equal(w0[name], w1[name]), name


def test_no_step_holds_more_than_one_weights_gradient() -> None:
    """The gradients' peak is the largest weight's gradient, not the sum of all of them."""
    sizes = {}
    gradient = CATEGORIES.index("gradients")
    for in_backward in (False, True):
        tracker = StepTracker(TINY["vocab_size"])
        _, w = _steps(in_backward, "full", "adamw", tracker)
        sizes[in_backward] = tracker.timeline()[:, gradient].max()
    every = sum(t.numel() * 4 for t in w.values())
    largest = max(t.numel() * 4 for t in w.values())
    assert sizes[False] == every
    assert sizes[True] == largest


def test_the_state_round_trips_per_weight() -> None:
    """state_dict / load_state_dict (accelerate's device placement, checkpoints) keep each
    weight's state and the scheduler's view of the groups."""
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, 2))
    opt = make_optimizer("adamw", [a, b], lr=0.5, in_backward=True)
    assert isinstance(opt, PerParameter) and len(opt.param_groups) == 2
    for p in (a, b):
        p.grad = torch.full_like(p, 0.1)
    opt.step()  # updates the weights whose gradient is still there
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    saved = opt.state_dict()
    fresh = make_optimizer("adamw", [a, b], lr=0.5, in_backward=True)
    fresh.load_state_dict(copy.deepcopy(saved))
    assert isinstance(fresh, PerParameter)
    assert torch.equal(fresh.state[a]["exp_avg"], opt.state[a]["exp_avg"])
    assert fresh.inner[1].state is fresh.state
    assert fresh.inner[1].param_groups[0] is fresh.param_groups[1]
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.25]  # the scheduler set each group
    assert sched.get_last_lr() == [0.25, 0.25]


def test_it_refuses_what_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    base = ("estimate", "Qwen/Qwen2.5-0.5B", "--method", "full", "--optimizer-in-backward")
    assert "--gpus 1" in run_error(capsys, *base, "--gpus", "2")
    assert "--grad-accum 1" in run_error(capsys, *base, "--grad-accum", "2")
    assert "bf16-mixed" in run_error(capsys, *base, "--precision", "fp16-mixed")
    with pytest.raises(FrugalError, match="max_grad_norm=0"):
        make_cfg(Path("x"), "job.optimizer_in_backward=true", "job.batch=8")
    with pytest.raises(FrugalError, match=r"job.batch to training.effective_batch \(8\)"):
        make_cfg(Path("x"), "job.optimizer_in_backward=true", "training.max_grad_norm=0")
    p = torch.nn.Parameter(torch.ones(2))
    opt = make_optimizer("sgd", [p], in_backward=True)
    with pytest.raises(FrugalError, match="one micro-batch"):
        optimizer_step(
            None,
            opt,
            [p],
            [{}, {}],
            PlainEngine("fp32"),
            UpdateRule(task_of("causal"), TokenLoss(), 1, 1, 0.0),
        )


@pytest.mark.slow
def test_the_estimate_drops_the_gradients(capsys: pytest.CaptureFixture[str]) -> None:
    """Full fine-tuning of Qwen2.5-0.5B, where the gradients are 1.84 GiB at the peak."""
    args = ["estimate", "Qwen/Qwen2.5-0.5B", "--method", "full", "--batch", "4", "--seq", "1024"]
    args += ["--loss-chunks", "16", "--json"]
    plain = run_json(capsys, *args)
    fused = run_json(capsys, *args, "--optimizer-in-backward")
    assert plain["breakdown_gib"]["gradients"] == pytest.approx(494_032_768 * 4 / 2**30, abs=1e-3)
    assert fused["breakdown_gib"]["gradients"] < 0.6  # one weight's at most: the embedding
    assert fused["device_total_gib"] < plain["device_total_gib"] - 0.9
    assert fused["job"]["optimizer_in_backward"] is True


@pytest.mark.slow
def test_frugal_train_runs_it_and_resumes(tmp_path: Path) -> None:
    """The trainer's step with the optimizer in backward: the same run as the step after
    backward (no clipping, one micro-batch), through a checkpoint and a resume."""
    over = ("job.method=full", "job.batch=8", "training.max_grad_norm=0", "training.max_steps=4")
    plain, fused = tmp_path / "plain", tmp_path / "fused"
    recipe.train(make_cfg(plain, *over), quiet=True)

    def kill_at_2(step: int, m: dict[str, Any]) -> None:
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    cfg = make_cfg(fused, *over, "job.optimizer_in_backward=true")
    assert recipe.train(cfg, on_step=kill_at_2, quiet=True).outcome == "preempted"
    s = recipe.train(cfg, quiet=True)
    assert s.outcome == "completed" and "resumed from step-00000002 (step 2)" in s.notes
    assert_same_weights(plain, fused)
    la, lb = losses(plain), losses(fused)
    assert la.keys() == lb.keys() == {1, 2, 3, 4}
    assert all(abs(la[k] - lb[k]) < 1e-6 for k in la)


@pytest.mark.slow
def test_plan_turns_it_on_where_nothing_else_fits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Full fine-tuning of Qwen3-0.6B in bf16 on a 6 GB laptop GPU: the chunked loss alone
    does not fit, with the optimizer in backward it does; the run config it writes runs it
    (one micro-batch, no clipping)."""
    from frugal.config import load_run_config

    out = tmp_path / "run.yaml"
    args = ["plan", "Qwen/Qwen3-0.6B", "--method", "full", "--precision", "bf16-true",
            "--optimizers", "adamw", "--tokens", "5M", "--seq", "512", "--effective-batch", "8",
            "--local", "RTX 4050 Laptop", "--providers", "local"]  # fmt: skip
    rec = run_json(capsys, *args, "--write", str(out), "--json")["recommendation"]
    assert rec["optimizer_in_backward"] and rec["loss_chunks"] == 16
    assert not rec["offload_activations"]  # offloading comes after: it costs time
    why = [r for r in rec["reasons"] if "--optimizer-in-backward" in r]
    assert why and "does not fit" in why[0] and "no clipping" in why[0]
    cfg = load_run_config(out)
    assert cfg.job.optimizer_in_backward and cfg.job.batch == cfg.training.effective_batch == 8
    assert cfg.training.max_grad_norm == 0


def test_an_error_offers_it_back_for_full_fine_tuning_only() -> None:
    from frugal.models.specs import load_spec
    from frugal.plan.constraints import Constraints
    from frugal.plan.relax import Ask, _unpinned

    spec = load_spec("Qwen/Qwen3-0.6B")
    pinned = Constraints(tokens=1e6, methods=("full",), auto_in_backward=False)
    (trial,) = _unpinned(Ask(spec, make_job(method="full"), [], pinned))
    assert trial.flags == {"--no-optimizer-in-backward": None} and trial.ask.k.auto_in_backward
    lora = pinned.model_copy(update={"methods": ("lora",)})
    assert _unpinned(Ask(spec, make_job(method="lora"), [], lora)) == []


def test_what_cannot_split_or_export_the_step_says_so() -> None:
    """An OOM cannot halve the one micro-batch; the Trainer script has no such step."""
    from types import SimpleNamespace

    from frugal.plan.emit import hf_script

    over = ("job.method=full", "job.batch=8", "training.max_grad_norm=0")
    cfg = make_cfg(Path("x"), *over, "job.optimizer_in_backward=true")
    p = torch.nn.Parameter(torch.ones(2))
    run = SimpleNamespace(world=1, cfg=cfg, micro=8, optimizer=torch.optim.SGD([p]))
    with pytest.raises(FrugalError, match=r"cannot split: lower training\.effective_batch"):
        training_loop._back_off(run, None)
    with pytest.raises(FrugalError, match="--no-optimizer-in-backward"):
        hf_script(cfg, 1.0)
