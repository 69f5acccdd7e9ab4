"""Phantoms (CPU tensors with meta bodies): what the simulation runs the step on.

The rules that make a phantom behave as a real CPU tensor would, each on a trivial program,
and the whole step: a simulation on phantoms gives the trace, op for op and byte for byte,
that torch's FakeTensorMode gives, across the jobs and architectures that take different
paths through the step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from frugal.estimate.phantom import Phantom, PhantomMode, phantom_like, storage
from frugal.estimate.simulate import simulate
from frugal.estimate.tracker import StepTracker, tracking
from frugal.models.specs import load_spec
from frugal.step.job import make_job

aten = torch.ops.aten


def test_a_phantom_says_cpu_holds_no_data_and_shares_storage_with_its_views() -> None:
    with PhantomMode():
        x = torch.empty(1000, 1000)  # asked for the CPU: made on meta, no 4 MB
        assert type(x) is Phantom and x.device.type == "cpu" and x.elem.device.type == "meta"
        v = x.view(-1)[10:]
        assert storage(v) is storage(x)
        assert storage(x.clone()) is not storage(x)
        assert storage(x).nbytes() == 4_000_000
        pinned = torch.empty(10, pin_memory=False, device="cpu")
        assert type(pinned) is Phantom


def test_an_op_that_writes_returns_its_argument_and_a_view_its_schema_hides_is_a_view() -> None:
    with PhantomMode():
        x = torch.empty(4, 8)
        assert x.mul_(2) is x
        out = torch.empty(4, 4)
        assert torch.mm(x, x.t(), out=out) is out
        # _unsafe_view's schema says nothing of aliasing; it is a view all the same
        y = torch.empty(6, 8)
        for _ in range(2):  # the second call comes from the remembered shapes
            z = aten._unsafe_view.default(y, [48])
            assert storage(z) is storage(y)


def test_remembered_outputs_are_new_storages_of_the_same_shapes() -> None:
    with PhantomMode():
        a, b = torch.empty(3, 5, dtype=torch.bfloat16), torch.empty(5, 7, dtype=torch.bfloat16)
        first, second = a @ b, a @ b
        assert storage(first) is not storage(second)
        for t in (first, second):
            assert t.shape == (3, 7) and t.dtype == torch.bfloat16 and t.stride() == (7, 1)
            assert storage(t).nbytes() == 3 * 7 * 2
        for _ in range(2):  # an op with several outputs, run and then remembered
            out, mean, rstd = aten.native_layer_norm.default(a, [5], None, None, 1e-5)
            assert out.shape == (3, 5) and mean.shape == rstd.shape == (3, 1)
            assert len({id(storage(t)) for t in (a, out, mean, rstd)}) == 4


def test_the_remembered_shapes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from frugal.estimate import phantom

    monkeypatch.setattr(phantom, "_OUTPUTS", {})
    monkeypatch.setattr(phantom, "_MOST_OUTPUTS", 5)
    with PhantomMode():
        for n in range(1, 20):  # 19 shapes, each a new entry
            t = torch.empty(n, 3) @ torch.empty(3, 2)
            assert t.shape == (n, 2)
            assert 1 <= len(phantom._OUTPUTS) <= 5


def test_autocast_and_layer_norm_take_the_cpu_path() -> None:
    x = torch.zeros(4, 16, dtype=torch.bfloat16)
    w = torch.zeros(16, dtype=torch.bfloat16)
    real = [t.dtype for t in aten.native_layer_norm.default(x, [16], w, w, 1e-5)]
    assert real[1] == torch.bfloat16  # the CPU kernel saves its statistics in bf16
    with PhantomMode():
        xp, wp = phantom_like(x), phantom_like(w)
        got = [t.dtype for t in aten.native_layer_norm.default(xp, [16], wp, wp, 1e-5)]
        assert got == real  # on meta they would be fp32
        a = torch.empty(8, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert (a @ a).dtype == torch.bfloat16


def test_transformers_treats_a_phantom_as_a_fake_tensor_only_while_the_mode_is_on() -> None:
    import transformers.utils.import_utils as iu

    before = iu.is_fake_tensor
    mode = PhantomMode()
    with mode:
        p = torch.empty(2)
        assert iu.is_tracing(p)
        with mode:  # entered again, as it does to run a decomposition
            pass
        assert iu.is_tracing(p)
    assert iu.is_fake_tensor is before


def test_the_tracker_counts_phantoms_as_it_counts_real_tensors() -> None:
    tr = StepTracker(vocab_size=512)
    with PhantomMode(), tracking(tr):
        x = torch.empty(100, 100)
        y = x.to(torch.bfloat16)
        view = y.t()
        assert tr.timeline()[-1].sum() == 100 * 100 * (4 + 2)
        del x, y
        z = torch.empty(10)  # the next op sees the fp32 storage gone, the bf16 one kept
        assert tr.timeline()[-1].sum() == 100 * 100 * 2 + 40
        del view, z


CASES = [
    ("HuggingFaceTB/SmolLM2-135M", {"method": "lora"}),
    ("HuggingFaceTB/SmolLM2-135M", {"method": "qlora", "optimizer": "paged-adamw-8bit"}),
    ("HuggingFaceTB/SmolLM2-135M", {"method": "full", "precision": "bf16-true",
                                    "optimizer": "adamw-8bit", "grad_accum": 3}),
    ("HuggingFaceTB/SmolLM2-135M", {"method": "lora", "grad_checkpointing": False,
                                    "attention": "eager", "packing": True}),
    ("HuggingFaceTB/SmolLM2-135M", {"method": "qlora", "offload_activations": True,
                                    "loss_chunks": 4, "loss": "ce+contrastive"}),
    ("HuggingFaceTB/SmolLM2-135M", {"method": "full", "optimizer_in_backward": True}),
    ("microsoft/phi-2", {"method": "lora", "lora_dropout": 0.1}),  # layer norm, dropout
    ("google/gemma-3-4b-pt", {"method": "full", "precision": "fp16-mixed"}),
    ("Qwen/Qwen3-30B-A3B", {"method": "lora"}),  # experts
]  # fmt: skip


@pytest.mark.parametrize(("model", "job"), CASES, ids=[f"{m}-{j}" for m, j in CASES])
def test_a_step_on_phantoms_is_the_step_on_fake_tensors(model: str, job: dict) -> None:
    config = load_spec(model).config
    tj = make_job(batch=1, seq=512, **job)
    shapes = [(1, 32), (2, 48)]
    fake = simulate(config, tj, 2, shapes, tensors="fake")
    phantom = simulate(config, tj, 2, shapes, tensors="phantom")
    for f, p in zip(fake, phantom, strict=True):
        assert np.array_equal(f.op_ids, p.op_ids)
        assert np.array_equal(f.live, p.live)
        assert np.array_equal(f.segments, p.segments)
        assert np.array_equal(f.micro, p.micro)
        assert (f.flops, f.attn_flops) == (p.flops, p.attn_flops)
        assert (f.total_params, f.trainable_params, f.lora_targets) == (
            p.total_params,
            p.trainable_params,
            p.lora_targets,
        )
