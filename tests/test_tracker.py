"""StepTracker's storage and FLOP accounting, and the 4-bit stand-in, on trivial programs."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from frugal.estimate.categories import CAT_INDEX, CATEGORIES
from frugal.estimate.tracker import StepTracker, tracking
from frugal.step import marks
from frugal.step.qlora import CODE_BYTES, Linear4bitSim, packed_bytes, quantize_standins

ACT = CAT_INDEX["activations"]


def live(tr: StepTracker) -> np.ndarray:
    """Live bytes per category after the last op."""
    return tr.timeline()[-1]


def test_alloc_view_free() -> None:
    tr = StepTracker(vocab_size=512)
    with FakeTensorMode(), tracking(tr):
        x = torch.empty(1000, 1000)  # fp32
        assert live(tr).sum() == 4e6
        assert live(tr)[ACT] == 4e6
        ops = tr.op
        y = x.view(-1)
        z = x[:10]
        w = x.t()
        assert tr.op == ops  # views run no allocating op
        assert live(tr).sum() == 4e6
        del x, y, z, w
        small = torch.empty(10)  # the next op sees the big storage gone
        assert live(tr).sum() == 40
        # the timeline keeps the history: 4 MB after the first op, 40 B after the last
        tl = tr.timeline().sum(axis=1)
        assert tl[0] == 0 and tl.max() == 4e6 and tl[-1] == 40
        del small


def test_copy_adds_a_storage() -> None:
    tr = StepTracker(vocab_size=512)
    with FakeTensorMode(), tracking(tr):
        x = torch.empty(100, 100)
        y = x.to(torch.bfloat16)
        assert live(tr).sum() == 100 * 100 * (4 + 2)
        z = x.clone()
        assert live(tr).sum() == 100 * 100 * (4 + 2 + 4)
        del y, z


def test_mm_flops() -> None:
    tr = StepTracker(vocab_size=512)
    with FakeTensorMode():
        a = torch.empty(64, 128, requires_grad=True)
        b = torch.empty(128, 32, requires_grad=True)
        with tracking(tr):
            c = a @ b
            assert tr.flops == {"forward": 2 * 64 * 128 * 32, "backward": 0, "recompute": 0}
            tr.set_segment("bwd_head")
            c.sum().backward()
            # input and weight gradients: two matmuls of the same size
            assert tr.flops["backward"] == 2 * (2 * 64 * 128 * 32)
            assert tr.flops["forward"] == 2 * 64 * 128 * 32
            assert tr.flops["recompute"] == 0
            assert sum(tr.attn_flops.values()) == 0
            tr.count_flops = False
            _ = a @ b
            assert tr.flops["forward"] == 2 * 64 * 128 * 32
    assert set(tr.segments()) == {"setup", "fwd", "bwd_head"}
    assert len(tr.segments()) == tr.op + 1 == len(tr.timeline())


def test_adopt_relabel_and_logits() -> None:
    tr = StepTracker(vocab_size=512)
    with FakeTensorMode():
        w = torch.empty(256, 64)  # fp32, 64 KiB
        tr.adopt(w, "frozen_weights")
        with tracking(tr):
            g = torch.empty(32, 16)
            logits = torch.empty(2, 8, 512)  # vocabulary last: logits
            not_logits = torch.empty(512, 8)
            tr.relabel([g], "gradients")
            with marks.temporaries():
                t = torch.empty(4, 4)
            row = dict(zip(CATEGORIES, live(tr), strict=True))
    assert row["frozen_weights"] == 256 * 64 * 4
    assert row["gradients"] == 32 * 16 * 4
    assert row["logits_and_loss"] == 2 * 8 * 512 * 4
    assert row["activations"] == 512 * 8 * 4
    assert row["temporaries"] == 4 * 4 * 4
    # adopted storages were alive before the first op
    assert tr.timeline()[0][CAT_INDEX["frozen_weights"]] == 256 * 64 * 4
    del g, logits, not_logits, t


def test_packed_bytes() -> None:
    n = 4096 * 4096
    # packed values, uint8 absmax, fp32 second-level scales and offset, two code tables
    assert packed_bytes(n) == n // 2 + n // 64 + 4 * math.ceil(n / 64 / 256) + 4 + CODE_BYTES
    assert CODE_BYTES == 4 * (16 + 256)
    assert packed_bytes(n, double_quant=False) == n // 2 + 4 * (n // 64) + 4 * 16
    # a block count that does not divide evenly rounds up
    assert packed_bytes(100) == 50 + 2 + 4 * 1 + 4 + CODE_BYTES
    # about 4.13 bits per value
    assert 4.1 < 8 * packed_bytes(n) / n < 4.2


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(64, 32, bias=True)
        self.down_proj = nn.Linear(32, 64, bias=False)
        self.norm = nn.LayerNorm(64)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Block(), _Block()])
        self.lm_head = nn.Linear(64, 100, bias=False)


def test_quantize_standins_skips_lm_head() -> None:
    with torch.device("meta"):
        model = _Model()
        n = quantize_standins(model, torch.bfloat16, keeps_input=False)
    assert n == 2 * (64 * 32 + 32 * 64)
    assert type(model.lm_head) is nn.Linear
    for block in model.layers:
        assert isinstance(block, _Block)
        assert isinstance(block.norm, nn.LayerNorm)
        assert isinstance(block.q_proj, Linear4bitSim)
        for lin, numel in ((block.q_proj, 64 * 32), (block.down_proj, 32 * 64)):
            assert isinstance(lin, Linear4bitSim)
            assert lin.original_numel == numel
            assert lin.weight.dtype == torch.uint8 and lin.weight.numel() == numel // 2
            assert not lin.weight.requires_grad
            assert lin.quant_state.numel() == packed_bytes(numel) - numel // 2
        assert block.q_proj.bias is not None and block.q_proj.bias.dtype == torch.bfloat16
        assert not block.q_proj.bias.requires_grad
        assert block.down_proj.bias is None


def test_quantized_linear_dequantizes_into_temporaries() -> None:
    tr = StepTracker(vocab_size=512)
    tokens, d_in, d_out = 8, 64, 32
    with FakeTensorMode():
        lin = Linear4bitSim(d_in, d_out, torch.bfloat16)
        x = torch.empty(tokens, d_in, dtype=torch.bfloat16, requires_grad=True)
        tr.adopt(lin.weight, "frozen_weights")
        tr.adopt(lin.quant_state, "frozen_weights")
        with tracking(tr):
            y = lin(x)
            marker = torch.empty(1, dtype=torch.uint8)  # an op after the forward
            tl = tr.timeline()
            temp = tl[:, CAT_INDEX["temporaries"]]
            # the bf16 weight and two fp32 absmax buffers exist only while the matmul runs
            absmax = 4 * math.ceil(d_in * d_out / 64)
            assert temp.max() == d_out * d_in * 2 + 2 * absmax
            assert temp[-1] == 0
            assert tr.flops["forward"] == 2 * tokens * d_in * d_out
            tr.set_segment("bwd_head")
            y.sum().backward()
            del marker
            # backward dequantizes again for the input gradient only (frozen weight)
            assert tr.flops["backward"] == 2 * tokens * d_in * d_out
    assert tr.timeline()[0][CAT_INDEX["frozen_weights"]] == packed_bytes(d_in * d_out)
    assert tr.timeline()[:, CAT_INDEX["temporaries"]].max() == d_out * d_in * 2 + 2 * absmax
