"""The estimate's stand-ins against the real bitsandbytes layers and optimizers, on the CPU.

The estimate swaps two things fake tensors cannot run: bitsandbytes' 4-bit linear layer
(`Linear4bitSim`) and 8-bit AdamW (`AdamW8bitState`). Each must hold and allocate what the
real one does. bitsandbytes runs both on the CPU, so these tests build the real thing and
compare tensors: the 4-bit layer's stored bytes, what it keeps for backward and what its
backward allocates (its forward dequantizes inside one custom op, invisible to a
dispatch-level tracker on either device; the stand-in follows the source there), and the
8-bit optimizer's state, tensor by tensor.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from frugal.estimate.categories import CATEGORIES
from frugal.estimate.tracker import StepTracker, tracking
from frugal.step.optim import AdamW8bitState, make_optimizer, optimizer_tensors
from frugal.step.qlora import Linear4bitSim, packed_bytes, quant_state_tensors, quantize

bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")

IN, OUT, TOKENS = 192, 320, 24  # 61,440 values: 960 absmax blocks, 4 second-level scales


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def _real_layer() -> nn.Module:
    model = nn.Sequential(nn.Linear(IN, OUT, bias=False, dtype=torch.bfloat16))
    quantize(model, torch.bfloat16, torch.device("cpu"))
    layer = model[0]
    assert isinstance(layer, bnb.nn.Linear4bit)
    return layer


def test_4bit_layer_stores_what_bitsandbytes_stores() -> None:
    layer = _real_layer()
    real = _storage_bytes([layer.weight, *quant_state_tensors(layer)])
    assert real == packed_bytes(IN * OUT)
    with torch.device("meta"):
        sim = Linear4bitSim(IN, OUT, torch.bfloat16)
    assert sim.weight.numel() + sim.quant_state.numel() == real
    assert sim.weight.dtype == layer.weight.dtype == torch.uint8


def _trace(layer: nn.Module, x: torch.Tensor) -> tuple[StepTracker, torch.Tensor]:
    """The layer's forward and backward under the tracker; returns it and the output."""
    tr = StepTracker(vocab_size=7)
    for p in layer.parameters():
        tr.adopt(p, "frozen_weights")
    for t in [*layer.buffers(), *quant_state_tensors(layer)]:
        tr.adopt(t, "frozen_weights")
    with tracking(tr):
        y = layer(x)
        torch.empty(0)  # an op after the forward: what it made and dropped is gone by then
        tr.set_segment("bwd_head")
        y.backward(torch.ones_like(y))
    return tr, y


def _phases(tr: StepTracker) -> dict[str, float]:
    """Bytes beyond the weights: kept between forward and backward, and backward's peak."""
    live = tr.timeline()
    weights = CATEGORIES.index("frozen_weights")
    other = live.sum(axis=1) - live[:, weights]
    segs = tr.segments()
    fwd = [i for i, s in enumerate(segs) if s == "fwd"]
    bwd = [i for i, s in enumerate(segs) if s == "bwd_head"]
    return {"kept": float(other[fwd[-1]]), "backward_peak": float(other[bwd].max())}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_4bit_layer_allocates_what_bitsandbytes_allocates(dtype: torch.dtype) -> None:
    layer = _real_layer()
    x = torch.randn(TOKENS, IN, dtype=dtype, requires_grad=True)
    real_tr, real_y = _trace(layer, x)
    with FakeTensorMode():
        sim = Linear4bitSim(IN, OUT, torch.bfloat16)
        fx = torch.empty(TOKENS, IN, dtype=dtype, requires_grad=True)
        sim_tr, sim_y = _trace(sim, fx)
    assert (sim_y.shape, sim_y.dtype) == (real_y.shape, real_y.dtype)  # the input's dtype
    real, stand_in = _phases(real_tr), _phases(sim_tr)
    assert stand_in == real, (stand_in, real)
    # backward rebuilds the fp32 absmax and the whole weight in the compute dtype
    weight, absmax = IN * OUT * 2, 4 * math.ceil(IN * OUT / 64)
    assert real["backward_peak"] >= weight + absmax


def _real_and_standin_state(sizes: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    real_params = [nn.Parameter(torch.randn(n)) for n in sizes]
    real = make_optimizer("adamw-8bit", real_params)
    sim_params = [nn.Parameter(torch.randn(n)) for n in sizes]
    sim = make_optimizer("adamw-8bit", sim_params, stand_in=True)
    assert isinstance(sim, AdamW8bitState)
    for params, opt in ((real_params, real), (sim_params, sim)):
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
    return optimizer_tensors(real), optimizer_tensors(sim)


def test_8bit_adamw_state_is_bitsandbytes_state() -> None:
    sizes = [100, 4095, 4096, 5000, 70_000]  # either side of the 8-bit threshold
    real, sim = _real_and_standin_state(sizes)
    # every state tensor but bitsandbytes' per-weight step counters (Python ints)
    real_tensors = sorted((str(t.dtype), tuple(t.shape)) for t in real)
    sim_tensors = sorted((str(t.dtype), tuple(t.shape)) for t in sim)
    assert sim_tensors == real_tensors
    # and the two quantization maps are shared by all weights, as bitsandbytes shares them
    assert _storage_bytes(sim) == _storage_bytes(real)


# -- a MoE layer's routed experts in 4 bits ---------------------------------------------------

MOE = {"model_type": "qwen3_moe", "hidden_size": 128, "intermediate_size": 256,
       "moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
       "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
       "head_dim": 32, "vocab_size": 100, "mlp_only_layers": []}  # fmt: skip


def _experts_pair() -> tuple[nn.Module, nn.Module]:
    """The same bf16 experts in bitsandbytes' 4 bits and as the estimate's stand-in."""
    import copy

    from transformers import AutoModelForCausalLM

    from frugal.step.experts4bit import quantize_experts, standin_experts
    from frugal.step.job import TrainJob
    from frugal.step.model import hf_config

    cfg = hf_config(MOE, TrainJob(method="qlora"))
    block = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).model.layers[0].mlp
    real, sim = block, copy.deepcopy(block)
    quantize_experts(real, torch.bfloat16, torch.device("cpu"))
    standin_experts(sim, torch.bfloat16)
    return real.experts, sim.experts


def test_4bit_experts_store_what_bitsandbytes_stores() -> None:
    real, sim = _experts_pair()
    stored = _storage_bytes([*real.parameters(), *quant_state_tensors(real)])
    values = sum(real.packed_values.values())
    assert stored == sum(packed_bytes(n) for n in real.packed_values.values())
    assert _storage_bytes([*sim.parameters(), *sim.buffers()]) == stored
    assert stored < values * 0.6  # 4 bits a value and the absmax: about a quarter of bf16


def test_4bit_experts_allocate_what_bitsandbytes_allocates() -> None:
    """Forward keeps no dequantized stack for backward; backward rebuilds one at a time."""
    real, sim = _experts_pair()
    tokens = 24
    index = torch.randint(0, MOE["num_experts"], (tokens, 2))
    weights = torch.rand(tokens, 2, dtype=torch.bfloat16)
    phases = []
    for layer in (real, sim):
        x = torch.randn(tokens, MOE["hidden_size"], dtype=torch.bfloat16, requires_grad=True)
        tr = StepTracker(vocab_size=7)
        for t in [*layer.parameters(), *layer.buffers(), *quant_state_tensors(layer)]:
            tr.adopt(t, "frozen_weights")
        with tracking(tr):
            y = layer(x, index, weights)
            torch.empty(0)
            tr.set_segment("bwd_head")
            y.backward(torch.ones_like(y))
        phases.append(_phases(tr))
    assert phases[1] == phases[0], phases
    stack = MOE["num_experts"] * 2 * MOE["moe_intermediate_size"] * MOE["hidden_size"] * 2
    assert phases[0]["backward_peak"] >= stack  # the gate/up stack in bf16, rebuilt
    assert phases[0]["kept"] < stack / 4  # but none kept between forward and backward
