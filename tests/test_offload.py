"""Activation offloading (--offload-activations): the same step, its layer inputs in host memory."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import UNTIED_LLAMA, run_error, run_json

from frugal.estimate.categories import CATEGORIES
from frugal.estimate.throughput import SpeedConstants
from frugal.estimate.tracker import StepTracker, tracking
from frugal.models.specs import load_spec
from frugal.step.job import make_job
from frugal.step.loop import PlainEngine, UpdateRule, optimizer_step
from frugal.step.model import build_model
from frugal.step.offload import _pack, _unpack
from frugal.step.optim import make_optimizer
from frugal.step.tasks import task_of
from frugal.step.tasks.causal import TokenLoss

TINY = UNTIED_LLAMA
B, S = 2, 40


def _step(offload: bool, method: str = "lora", tracker: StepTracker | None = None) -> Any:
    """One real step on CPU: the loss, every trainable weight's gradient (before the update)
    and the updated weights."""
    torch.manual_seed(0)
    job = make_job(method=method, precision="fp32", offload_activations=offload, seq=S)
    model = build_model(TINY, job, "random")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    grads: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(
                lambda p, name=name: grads.__setitem__(name, p.grad.clone())
            )
    opt = make_optimizer("adamw", params)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, TINY["vocab_size"], (B, S), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone()}
    run = tracking(tracker) if tracker is not None else torch.enable_grad()
    with run:
        sums = optimizer_step(
            model,
            opt,
            params,
            [batch],
            PlainEngine("fp32"),
            UpdateRule(task_of("causal"), TokenLoss(), 1 / (B * S), 1.0, 1.0),
        )
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return sums.ce, grads, weights


@pytest.mark.parametrize("method", ["lora", "full"])
def test_offloading_changes_no_number_of_the_step(method: str) -> None:
    """Host copies are bit-for-bit: the loss, the gradients and the update are identical."""
    ce0, g0, w0 = _step(False, method)
    ce1, g1, w1 = _step(True, method)
    assert torch.equal(ce0, ce1)
    assert g0.keys() == g1.keys() and g0
    for name in g0:
        assert torch.equal(g0[name], g1[name]), name
        assert torch.equal(w0[name], w1[name]), name


def test_the_layer_inputs_wait_in_host_memory() -> None:
    """At the end of the forward, host memory holds each layer's input (b x s x hidden,
    fp32 here) and the device all but the first of them fewer (the decoder holds the
    embeddings' output, the first layer's input, anyway)."""
    host_i, act_i = CATEGORIES.index("offloaded_activations"), CATEGORIES.index("activations")
    peaks = {}
    for offload in (False, True):
        tracker = StepTracker(TINY["vocab_size"])
        _step(offload, tracker=tracker)
        live, segs = tracker.timeline(), tracker.segments()
        end = live[segs == "fwd"][-1]
        peaks[offload] = (end[host_i], end[act_i])
    layers, layer_input = TINY["num_hidden_layers"], B * S * TINY["hidden_size"] * 4
    assert peaks[True][0] == layers * layer_input
    assert peaks[False][0] == 0
    assert peaks[False][1] - peaks[True][1] == (layers - 1) * layer_input


def test_weights_and_constants_are_not_offloaded() -> None:
    w = torch.nn.Parameter(torch.ones(3))
    const = torch.ones(3)
    assert _pack(w) is w and _pack(const) is const
    x = torch.ones(3, requires_grad=True) * 2  # an activation
    packed = _pack(x)
    back = _unpack(packed)
    assert back is not x and torch.equal(back, x)  # a fresh copy, as on a GPU


def test_offloading_needs_checkpointing(capsys: pytest.CaptureFixture[str]) -> None:
    err = run_error(
        capsys, "estimate", "meta-llama/Llama-3.1-8B", "--offload-activations",
        "--no-grad-checkpointing",
    )  # fmt: skip
    assert "turn on --grad-checkpointing" in err and "\n" not in err.strip()


@pytest.mark.slow
def test_four_times_the_plain_context_at_24_gb(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 18's bar: Llama-3.1-8B QLoRA r32, batch 1, a 24 GB card: the loss in chunks,
    the offloaded layer inputs and the 8-bit optimizer fit at least 4x the plain step's
    longest sequence; the host holds the offloaded inputs, priced in the step time."""
    base = ["estimate", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--lora-r", "32",
            "--gpu-memory", str(24e9 / 2**30)]  # fmt: skip
    plain = run_json(capsys, *base, "--json")
    every = ["--loss-chunks", "16", "--offload-activations", "--optimizer", "adamw-8bit"]
    both = run_json(capsys, *base, *every, "--json")
    assert both["max_seq"] >= 4 * plain["max_seq"]
    on_4090 = [*base[:6], "--seq", "16384", "--loss-chunks", "16", "--gpu", "RTX 4090", "--json"]
    kept = run_json(capsys, *on_4090)
    off = run_json(capsys, *on_4090, "--offload-activations")
    # 32 layers x 16,384 tokens x 4,096 x 2 bytes (bf16), there and back over PCIe 4
    host = 32 * 16384 * 4096 * 2
    assert off["host_offload_gib"] == pytest.approx(host / 2**30, rel=1e-3)
    assert kept["host_offload_gib"] == 0
    assert off["device_total_gib"] < kept["device_total_gib"] - 3
    extra = off["step_time_s"] - kept["step_time_s"]
    # the copies over PCIe 4 at its fitted share (`offload_link_eff`), and the ops the
    # offloading step adds around them; never faster than the link itself
    link = 2 * host / 32e9
    assert link / SpeedConstants().offload_link_eff <= extra < 1.6 * link


def test_offloading_is_not_run_under_sharded_weights() -> None:
    from frugal.errors import FrugalError

    with pytest.raises(FrugalError, match="use --sharding ddp or zero2"):
        make_job(offload_activations=True, gpus=2, sharding="fsdp")
    assert make_job(offload_activations=True, gpus=2, sharding="zero2").offload_activations


@pytest.mark.slow
def test_plan_offloads_where_nothing_else_fits(capsys: pytest.CaptureFixture[str]) -> None:
    """24K tokens of 8B QLoRA on your own RTX 4090: the chunked loss alone does not fit, with
    the layer inputs offloaded it does; the reasons say so, with the host memory and the
    share of the step the copies take. At 34K, AdamW's states in 8 bits too (at 31K they were
    needed before the allocator reserve was fitted on an H200: it follows the logits, which
    the chunked loss never makes whole)."""
    args = ["plan", "meta-llama/Llama-3.1-8B", "--tokens", "20M", "--methods", "qlora",
            "--lora-r", "32", "--seq", "24576", "--effective-batch", "8",
            "--local", "RTX 4090", "--providers", "local"]  # fmt: skip
    rec = run_json(capsys, *args, "--json")["recommendation"]
    assert rec["offload_activations"] and rec["loss_chunks"] == 16
    assert rec["host_offload_gib"] == pytest.approx(32 * 24576 * 4096 * 2 / 2**30, rel=1e-3)
    why = [r for r in rec["reasons"] if "--offload-activations" in r]
    assert why and "GiB pinned" in why[0] and "does not fit" in why[0]
    # longer still: AdamW's states in 8 bits too
    longer = run_json(capsys, *args[:-8], "--seq", "34000", *args[-6:], "--json")
    rec = longer["recommendation"]
    assert rec["optimizer"] == "adamw-8bit" and rec["offload_activations"]
    assert any("AdamW's states in 8 bits" in r and "does not fit" in r for r in rec["reasons"])


def test_the_plans_techniques_come_one_at_a_time_cheapest_in_time_first() -> None:
    from frugal.plan.constraints import Constraints
    from frugal.plan.fit import TECHNIQUES, _next_technique

    spec = load_spec("meta-llama/Llama-3.1-8B")
    k = Constraints(tokens=1e6)
    job, seen = make_job(method="qlora"), []
    while (nxt := _next_technique(spec, job, k, "qlora")) is not None:
        seen.append(
            {f: getattr(nxt, f) for f in ("loss_chunks", "offload_activations", "optimizer")}
        )
        job = nxt
    assert seen == [
        {"loss_chunks": 16, "offload_activations": False, "optimizer": "adamw"},
        {"loss_chunks": 16, "offload_activations": True, "optimizer": "adamw"},
        {"loss_chunks": 16, "offload_activations": True, "optimizer": "adamw-8bit"},
    ]
    # full fine-tuning: the optimizer in backward before offloading (it costs no time), and
    # no 8-bit rung (every listed optimizer is tried anyway)
    job, seen = make_job(method="full"), []
    while (nxt := _next_technique(spec, job, k, "full")) is not None:
        seen.append(next(f for f in TECHNIQUES if getattr(nxt, f) != getattr(job, f)))
        job = nxt
    assert seen == ["loss_chunks", "optimizer_in_backward", "offload_activations"]
    # pinned or unlisted techniques stay off
    pinned = Constraints(tokens=1e6, auto_loss_chunks=False, optimizers=("adamw",))
    only = _next_technique(spec, make_job(method="qlora"), pinned, "qlora")
    assert only is not None and only.offload_activations and not only.loss_chunks
    assert _next_technique(spec, only, pinned, "qlora") is None
    # a model that soft-caps its logits (Gemma 2) skips the chunked loss
    capped = _next_technique(load_spec("google/gemma-2-2b"), make_job(method="qlora"), k, "qlora")
    assert capped is not None and capped.offload_activations and not capped.loss_chunks


def test_an_error_offers_back_the_techniques_pinned_off() -> None:
    from frugal.models.specs import load_spec
    from frugal.plan.constraints import Constraints
    from frugal.plan.relax import Ask, _unpinned

    spec = load_spec("meta-llama/Llama-3.1-8B")
    pinned = Constraints(tokens=1e6, auto_loss_chunks=False, auto_offload=False)
    (trial,) = _unpinned(Ask(spec, make_job(method="qlora"), [], pinned))
    assert trial.flags == {"--loss-chunks": None, "--no-offload-activations": None}
    assert trial.ask.k.auto_loss_chunks and trial.ask.k.auto_offload
    free = Constraints(tokens=1e6)
    assert _unpinned(Ask(spec, make_job(method="qlora"), [], free)) == []
    asked = make_job(method="qlora", offload_activations=True)  # pinned on: nothing to offer
    assert (
        _unpinned(Ask(spec, asked, [], pinned.model_copy(update={"auto_loss_chunks": True}))) == []
    )
