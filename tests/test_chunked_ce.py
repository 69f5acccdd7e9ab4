"""Chunked linear cross-entropy: equal to the plain head + loss, without the whole logits."""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from conftest import run_json
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from frugal.errors import FrugalError
from frugal.models.specs import ModelSpec
from frugal.step.chunked_ce import chunked_ce_bytes, chunked_linear_cross_entropy
from frugal.step.job import make_job
from frugal.step.loss import IGNORE, causal_lm_loss

# "128K-vocabulary shaped": Llama-3's vocabulary, a tiny hidden size
B, T, H, V = 2, 33, 64, 128256


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    hidden = torch.randn(B, T, H, generator=g)
    weight = torch.randn(V, H, generator=g) * 0.1
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[0, :10] = IGNORE  # a prompt
    labels[1, :4] = IGNORE
    labels[1, -3:] = IGNORE  # padding
    labels[torch.rand(B, T, generator=g) < 0.1] = IGNORE
    return hidden, weight, labels


def _run(fn: Any, hidden: torch.Tensor, weight: torch.Tensor, train_weight: bool = True) -> Any:
    """(sum, count, hidden grad, weight grad) of fn(hidden, weight) on fresh leaves."""
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_(train_weight)
    total, count = fn(h, w)
    total.backward()
    return total.detach(), count, h.grad, w.grad


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest error relative to the reference's largest magnitude."""
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def _plain(labels: torch.Tensor, bias: torch.Tensor | None = None) -> Any:
    def fn(h: torch.Tensor, w: torch.Tensor) -> Any:
        logits = h @ w.T
        return causal_lm_loss(logits if bias is None else logits + bias, labels)

    return fn


def _chunked(labels: torch.Tensor, chunk: int, bias: torch.Tensor | None = None) -> Any:
    def fn(h: torch.Tensor, w: torch.Tensor) -> Any:
        return chunked_linear_cross_entropy(h, w, labels, chunk_tokens=chunk, bias=bias)

    return fn


@pytest.mark.parametrize("chunk", [7, 64, 4096])  # many chunks, a ragged last one, one chunk
def test_equals_plain_loss_fp32(chunk: int) -> None:
    hidden, weight, labels = _inputs()
    ref = _run(_plain(labels), hidden, weight)
    got = _run(_chunked(labels, chunk), hidden, weight)
    assert got[1].dtype == torch.int64 and got[1].item() == ref[1].item()
    assert got[0].dtype == torch.float32
    assert abs(got[0].item() - ref[0].item()) <= 1e-5 * abs(ref[0].item())
    # gradients against the fp64 truth: each hidden gradient sums 128,256 fp32 products, in
    # an order the CPU's GEMM kernel picks by shape (a 7-token chunk on AVX2: 1.7e-5 of the
    # largest value; the plain fp32 path 8e-7; a wrong gradient is off by its own size)
    exact = _run(_plain(labels), hidden.double(), weight.double())
    assert _rel(got[2], exact[2]) <= 3e-5
    assert _rel(got[3], exact[3]) <= 1e-5
    torch.testing.assert_close(got[3], ref[3], rtol=1e-5, atol=1e-7)


def test_bias_equals_plain_loss() -> None:
    hidden, weight, labels = _inputs(1)
    bias = (torch.randn(V, generator=_gen(2)) * 0.1).requires_grad_()
    ref_total, _ = causal_lm_loss(hidden @ weight.T + bias, labels)
    (ref_grad,) = torch.autograd.grad(ref_total, bias)
    total, _ = chunked_linear_cross_entropy(hidden, weight, labels, chunk_tokens=16, bias=bias)
    (grad,) = torch.autograd.grad(total, bias)
    assert abs(total.item() - ref_total.item()) <= 1e-5 * abs(ref_total.item())
    assert _rel(grad, ref_grad) <= 1e-5


def test_frozen_weight_has_no_grad() -> None:
    """The LM head of LoRA / QLoRA: no weight gradient, the hidden one unchanged."""
    hidden, weight, labels = _inputs(3)
    ref = _run(_plain(labels), hidden, weight, train_weight=False)
    got = _run(_chunked(labels, 16), hidden, weight, train_weight=False)
    assert got[3] is None
    assert _rel(got[2], ref[2]) <= 1e-5


def test_bf16_inputs_close_to_fp32() -> None:
    """bf16 hidden and weight (matmul in bf16, loss in fp32): within 1e-2 of the fp32
    reference, relative to the largest value (bf16 keeps 8 bits of mantissa, 4e-3 per
    rounding; measured 2e-5 on the loss, 5e-3 on the gradients, the same as the plain
    bf16 head + loss), and no farther from it than the plain bf16 path (x2)."""
    hidden, weight, labels = _inputs(4)
    ref = _run(_plain(labels), hidden, weight)
    hb, wb = hidden.bfloat16(), weight.bfloat16()
    plain = _run(_plain(labels), hb, wb)
    got = _run(_chunked(labels, 16), hb, wb)
    assert got[2].dtype == torch.bfloat16 and got[3].dtype == torch.bfloat16
    assert abs(got[0].item() - ref[0].item()) <= 1e-2 * abs(ref[0].item())
    for i in (2, 3):
        assert _rel(got[i], ref[i]) <= 1e-2
        assert _rel(got[i], ref[i]) <= 2 * _rel(plain[i], ref[i]) + 1e-3


def test_autocast_bf16_matches_plain_autocast() -> None:
    """fp32 weights under bf16 autocast: the matmul in bf16 as the plain head's, so the loss
    agrees to fp32 precision; the weight gradient to 1e-3 (each chunk's bf16 product is
    rounded before its fp32 accumulation; measured 1e-4)."""
    hidden, weight, labels = _inputs(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = _run(_plain(labels), hidden, weight)
        got = _run(_chunked(labels, 16), hidden, weight)
    assert got[2].dtype == torch.float32 and got[3].dtype == torch.float32
    assert abs(got[0].item() - plain[0].item()) <= 1e-5 * abs(plain[0].item())
    assert _rel(got[2], plain[2]) <= 1e-3
    assert _rel(got[3], plain[3]) <= 1e-3


def test_all_ignored_gives_zero() -> None:
    hidden, weight, _ = _inputs(6)
    labels = torch.full((B, T), IGNORE)
    total, count, grad_h, grad_w = _run(_chunked(labels, 16), hidden, weight)
    assert total.item() == 0.0 and count.item() == 0
    assert not grad_h.isnan().any() and not grad_w.isnan().any()
    assert grad_h.abs().max().item() == 0.0 and grad_w.abs().max().item() == 0.0


def test_runs_on_fake_tensors() -> None:
    """The estimator's simulation: fake inputs, under bf16 autocast as its engine runs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        hidden = torch.empty(B, T, H, dtype=torch.bfloat16, requires_grad=True)
        weight = torch.empty(V, H, requires_grad=True)
        labels = torch.zeros(B, T, dtype=torch.int64)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            total, count = chunked_linear_cross_entropy(hidden, weight, labels, chunk_tokens=7)
        total.backward()
        assert total.shape == () and total.dtype == torch.float32
        assert count.shape == () and count.dtype == torch.int64
        assert hidden.grad is not None and weight.grad is not None
        assert hidden.grad.shape == hidden.shape and hidden.grad.dtype == torch.bfloat16
        assert weight.grad.shape == weight.shape and weight.grad.dtype == torch.float32


class _Allocations(TorchDispatchMode):
    """Records the shape of every tensor an aten op allocates (views, which share their
    base's storage, are not allocations), and the live bytes of the storages created under
    it (a weakref finalizer notes when each is freed)."""

    def __init__(self, inputs: tuple[torch.Tensor, ...]) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []
        self.live = 0
        self.peak = 0
        self._seen = {id(t.untyped_storage()) for t in inputs}  # existed before: not counted

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if id(st) not in self._seen and st.nbytes() > 0:  # a new storage
                    self.shapes.append(tuple(t.shape))
                    self._seen.add(id(st))
                    self.live += st.nbytes()
                    weakref.finalize(st, self._free, id(st), st.nbytes())
        self.peak = max(self.peak, self.live)
        return out


@contextmanager
def _allocations(*inputs: torch.Tensor) -> Iterator[_Allocations]:
    with _Allocations(inputs) as mode:
        yield mode


@pytest.mark.parametrize("train_weight", [False, True])
def test_never_materializes_the_logits(train_weight: bool) -> None:
    """Method: a TorchDispatchMode sees every tensor the aten ops of forward and backward
    return. No tensor other than the [V, H] weight gradient holds more than chunk x V
    elements (the plain loss makes B x T x V ones), and the live bytes created stay within
    `chunked_ce_bytes` plus the gradients (hidden's; the weight's fp32 accumulator and the
    returned gradient when it is trained)."""
    hidden, weight, labels = _inputs(7)
    chunk = 8
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_(train_weight)
    with _allocations(h, w, labels) as seen:
        total, _ = chunked_linear_cross_entropy(h, w, labels, chunk_tokens=chunk)
        total.backward()
    big = [s for s in seen.shapes if math.prod(s) > chunk * V]
    assert all(s == (V, H) for s in big), big
    assert (V, H) in big if train_weight else not big
    largest = max(math.prod(s) for s in seen.shapes if s != (V, H))
    assert largest == chunk * V  # one fp32 logits chunk, 8 / 66 of the plain loss's
    grad_w = V * H * 4 if train_weight else 0  # fp32: the accumulator is the gradient
    assert seen.peak <= chunked_ce_bytes(B * T, V, chunk, matmul_bytes=4) + B * T * H * 4 + grad_w

    with _allocations(h, w, labels) as plain:
        ref, _ = causal_lm_loss(h @ w.T, labels)
        ref.backward()
    assert max(math.prod(s) for s in plain.shapes) == B * T * V
    assert plain.peak > 20 * (seen.peak - grad_w)  # the loss's own bytes: 4.1 MB vs 102 MB


def test_bytes_formula() -> None:
    # Llama-3 vocabulary, 32K tokens: 4096-token chunks in bf16 vs the plain loss's N x V x 10
    n = 32768
    assert chunked_ce_bytes(n, V, 4096) == 4096 * V * 6 + 24 * n
    assert chunked_ce_bytes(n, V, 4096, matmul_bytes=4) == 4096 * V * 4 + 24 * n
    assert chunked_ce_bytes(100, V, 4096) == 100 * V * 6 + 2400  # one short chunk
    assert n * V * 10 / chunked_ce_bytes(n, V, 4096) > 13


def _tiny(vocab: int = 1000, **extra: object) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, **extra)  # fmt: skip
    return LlamaForCausalLM(cfg)


def test_the_steps_chunked_loss_is_the_plain_loss() -> None:
    """tasks.causal.token_ce with --loss-chunks: the model gives no logits; the loss and
    every weight's gradient equal the plain step's (fp32, 1e-5)."""
    from frugal.step.tasks.causal import TokenLoss, token_ce

    model = _tiny()
    ids = torch.randint(0, 1000, (2, 17))
    labels = ids.clone()
    labels[:, :5] = IGNORE  # a prompt
    b = {"input_ids": ids, "labels": labels}
    grads = []
    head_out: list[torch.Size] = []
    model.lm_head.register_forward_hook(lambda m, a, out: head_out.append(out.shape))
    for chunks in (0, 3):
        model.zero_grad(set_to_none=True)
        _, ce = token_ce(model, b, TokenLoss(chunks=chunks))
        ce.backward()
        if chunks:
            assert head_out[-1][1] == 0  # the model materialized no logits
        grads.append((ce.detach(), [p.grad.clone() for p in model.parameters()]))
    (plain, g0), (chunked, g1) = grads
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-6)
    for a, c in zip(g0, g1, strict=True):
        torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-6)


def test_soft_capped_logits_refuse_the_chunked_loss() -> None:
    from frugal.errors import FrugalError
    from frugal.step.forward import lm_head

    model = _tiny()
    model.config.final_logit_softcapping = 30.0  # Gemma 2's
    with pytest.raises(FrugalError, match="soft-caps its logits"):
        lm_head(model)


def test_the_job_checks_its_loss_chunks() -> None:
    from frugal.errors import FrugalError
    from frugal.step.job import make_job

    assert make_job(loss_chunks=16).loss_chunks == 16
    with pytest.raises(FrugalError, match="--loss-chunks -1: give a whole number from 0"):
        make_job(loss_chunks=-1)
    with pytest.raises(FrugalError, match="use --sharding ddp or zero2"):
        make_job(loss_chunks=8, gpus=2, sharding="fsdp")


@pytest.mark.slow
def test_plan_turns_the_chunked_loss_on_where_the_plain_loss_does_not_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "meta-llama/Llama-3.1-8B", "--tokens", "20M", "--methods", "qlora",
            "--seq", "16384", "--effective-batch", "8", "--local", "RTX 4090",
            "--providers", "local"]  # fmt: skip
    rec = run_json(capsys, *args, "--json")["recommendation"]
    assert rec["device_total_gib"] <= rec["usable_gib"]
    assert any("loss in 16 chunks" in r and "does not fit" in r for r in rec["reasons"])
    # asked for the plain loss: no plan on a 24 GB card at this length (the search alone:
    # the command's error would also try every relaxation)
    from frugal.errors import FrugalError
    from frugal.hardware.catalog import select_offers
    from frugal.models.specs import load_spec
    from frugal.plan.constraints import Constraints
    from frugal.plan.search import search
    from frugal.step.job import make_job

    plain = make_job(method="qlora", seq=16384)
    k = Constraints(
        tokens=20e6,
        effective_batch=8,
        methods=("qlora",),
        auto_loss_chunks=False,
        auto_offload=False,
    )
    offers = select_offers(local=["RTX 4090"], providers_csv="local")
    with pytest.raises(FrugalError, match="nothing fits"):
        search(load_spec("meta-llama/Llama-3.1-8B"), plain, offers, k)


def test_a_plan_never_turns_the_chunked_loss_on_for_soft_capped_logits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Gemma 2 caps its logits, which the chunked loss cannot: a plan whose logits hold the
    micro-batch down (a 256k vocabulary on a 6 GB GPU) goes on to the other techniques.
    It used to simulate the chunked loss, which refused, and the plan ended in that error."""
    from frugal.cli.main import main

    args = ["plan", "google/gemma-2-2b", "--tokens", "5M", "--local", "RTX 4050 Laptop",
            "--providers", "local", "--methods", "lora", "--json"]  # fmt: skip
    rc = main(args)
    out, err = capsys.readouterr()
    assert "--loss-chunks" not in err and "chunks" not in out, err
    assert rc == 0 or err.startswith("error: nothing fits"), err


@pytest.mark.parametrize("chunks", [16, 48, 96, 128, 256])
def test_the_simulated_lengths_give_every_chunk_its_share_of_tokens(
    tiny_llama: ModelSpec, monkeypatch: pytest.MonkeyPatch, chunks: int
) -> None:
    """The profile is fitted from three simulated lengths: each must split into `chunks`
    chunks of s / chunks tokens, growing with s as at the real length. At 64 tokens, 128
    chunks held 1, 1 and 2 tokens and the fit found 7.9 GiB of gradients for 4.9M weights."""
    from frugal.estimate import core, simulate

    seen: list[list[tuple[int, int]]] = []

    def record(config: Any, job: Any, n: int, shapes: list[tuple[int, int]]) -> Any:
        seen.append(shapes)
        raise RuntimeError("recorded")

    monkeypatch.setattr(simulate, "simulate", record)
    monkeypatch.setattr(core.cache, "load", lambda key: None)
    job = make_job(loss_chunks=chunks, seq=2048)
    with pytest.raises(RuntimeError, match="recorded"):
        core.get_profile(tiny_llama, job, 2048)
    tokens = [b * s for b, s in seen[0]]
    assert all(n % chunks == 0 for n in tokens), tokens  # whole tokens per chunk
    per = [n // chunks for n in tokens]
    assert per == [per[0], 2 * per[0], 3 * per[0]] and per[0] >= 1


def test_more_chunks_than_tokens_or_than_256_is_refused() -> None:
    with pytest.raises(FrugalError, match="more chunks than the 100 tokens"):
        make_job(loss_chunks=200, seq=100)
    with pytest.raises(FrugalError, match="--loss-chunks 512: give a whole number from 0 to 256"):
        make_job(loss_chunks=512)
