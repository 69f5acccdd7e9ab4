"""QLoRA's routed experts in 4 bits: a MoE layer's fused expert weights stored as bitsandbytes
stores a linear layer's, and dequantized for each product.

bitsandbytes' `Linear4bit` leaves transformers 5's fused experts (3D parameters, `moe.py`)
in 16 bits, which for a MoE model is most of the weights (Qwen3-30B-A3B: 28.3B of 30.5B).
`Experts4bit` takes their place: each expert stack (E, out, in) is quantized whole with
`bitsandbytes.functional.quantize_4bit` (NF4, blocks of 64 values, double quantization),
which is each expert's matrix quantized as a linear weight of its own (a matrix holds a
whole number of blocks, so no block spans two experts). For each product the stack is
dequantized (`dequantize_4bit`: the absmax in fp32, then the stack in the compute dtype),
multiplied with the tokens routed to each expert (torch's grouped GEMM, as transformers'
`grouped_mm` experts run) and dropped; backward dequantizes it again for the input's
gradient. Only the packed stack stays for backward, as in bitsandbytes' `MatMul4Bit`.

The trainer's layer (`quantize_experts`) and the estimate's stand-in (`standin_experts`, on
tensors without data) are one class: they differ only in how a stack is dequantized, and
the stand-in allocates what `dequantize_4bit` allocates (`tests/test_step_standins.py`
compares them on the CPU). The routed experts carry no LoRA adapters under QLoRA: PEFT
adapts a fused stack by adding B·A to its 16-bit weight, which a 4-bit stack does not have.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from frugal.step import marks
from frugal.step.moe import expert_weights, experts
from frugal.step.qlora import BLOCK, packed_bytes

BIAS = "_bias"  # a stack's bias is the parameter of the stack's name and this suffix


class Experts4bit(nn.Module):
    """A MoE layer's routed experts with their weight stacks in 4 bits.

    It keeps the experts module it replaces (`base`, its weights gone) for what the stack
    does between products: the gate (`_apply_gate`) or activation, and a norm after the
    experts. Called as transformers calls its experts: (tokens, top-k ids, top-k weights),
    or, for Llama 4's, (tokens of every expert,)."""

    def __init__(self, base: nn.Module, compute_dtype: torch.dtype) -> None:
        super().__init__()
        self.num_experts = int(getattr(base, "num_experts"))  # noqa: B009 (an int, for mypy)
        self.compute_dtype = compute_dtype
        self.routed = hasattr(base, "has_gate")  # transformers' experts kernels (not Llama 4's)
        self.has_gate = getattr(base, "has_gate", True)
        self.transposed = getattr(base, "is_transposed", False) or not self.routed
        self.packed_values: dict[str, int] = {}  # values each packed stack stands for
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.quant_states: dict[str, Any] = {}  # bitsandbytes' QuantState (the real layer)
        for name in expert_weights(base):
            bias = getattr(base, name + BIAS, None)
            if isinstance(bias, nn.Parameter):  # gpt-oss: kept in 16 bits, as bitsandbytes does
                delattr(base, name + BIAS)
                self.register_parameter(name + BIAS, bias)
        self.base = base

    # -- the stacks ----------------------------------------------------------------------
    def pack(self, name: str, weight: torch.Tensor, device: torch.device) -> None:
        """Quantize the stack `name` with bitsandbytes on `device`."""
        import bitsandbytes.functional as bnbf

        packed, state = bnbf.quantize_4bit(
            weight.to(device), blocksize=BLOCK, compress_statistics=True, quant_type="nf4"
        )
        param = nn.Parameter(packed, requires_grad=False)
        param.quant_state = state  # type: ignore[attr-defined]  # as bitsandbytes' Params4bit
        self._hold(name, weight.shape, param)
        self.quant_states[name] = state

    def stand_in(self, name: str, weight: torch.Tensor) -> None:
        """The stack `name` as the bytes bitsandbytes would keep, without values."""
        numel = weight.numel()
        packed = torch.empty((numel // 2, 1), dtype=torch.uint8, device=weight.device)
        self._hold(name, weight.shape, nn.Parameter(packed, requires_grad=False))
        extra = packed_bytes(numel) - numel // 2
        state = torch.empty(extra, dtype=torch.uint8, device=weight.device)
        self.register_buffer(name + "_quant_state", state)

    def _hold(self, name: str, shape: torch.Size, packed: nn.Parameter) -> None:
        delattr(self.base, name)
        self.register_parameter(name, packed)
        self.shapes[name] = tuple(shape)
        self.packed_values[name] = int(torch.Size(shape).numel())

    def dequantized(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """The stack `name` in `dtype`, oriented (E, in, out) for `tokens @ stack`."""
        state = self.quant_states.get(name)
        if state is not None:
            import bitsandbytes.functional as bnbf

            w = bnbf.dequantize_4bit(getattr(self, name), state).to(dtype)
        else:  # the stand-in: what dequantize_4bit allocates (absmax in fp32, the stack)
            shape, device = self.shapes[name], getattr(self, name).device
            with marks.temporaries():
                absmax = torch.empty(-(-self.packed_values[name] // BLOCK), device=device)
                w = torch.empty(shape, dtype=dtype, device=device)
                del absmax
        return w if self.transposed else w.transpose(-2, -1)

    # -- forward -------------------------------------------------------------------------
    def forward(
        self, hidden: torch.Tensor, top_k_index: Any = None, top_k_weights: Any = None
    ) -> torch.Tensor:
        if not self.routed:
            return self._every_expert(hidden)
        k = top_k_index.size(-1)
        ids, order = torch.sort(top_k_index.reshape(-1))  # the routed copies, by expert
        x = hidden[order // k]
        counts = torch.histc(ids.float(), bins=self.num_experts, min=0, max=self.num_experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        first = "gate_up_proj" if self.has_gate else "up_proj"
        h = self._product(x, first, offsets, ids)
        h = self._between(h)
        out = self._product(h, "down_proj", offsets, ids)
        if getattr(self.base, "has_post_expert_norm", False):
            norm: Any = self.base.post_expert_norm
            out = norm(out)
        out = out * top_k_weights.reshape(-1)[order].unsqueeze(-1)
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        out = out[back].view(hidden.shape[0], k, hidden.shape[-1]).sum(dim=1)
        return out.to(hidden.dtype)

    def _between(self, h: torch.Tensor) -> torch.Tensor:
        """The gate (transformers' `_apply_gate`, gpt-oss's own) or the activation."""
        act: Any = self.base._apply_gate if self.has_gate else self.base.act_fn
        return act(h)

    def _product(
        self, x: torch.Tensor, name: str, offsets: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        out = _Dequantized.apply(x.to(self.compute_dtype), self, name, offsets)
        bias = getattr(self, name + BIAS, None)
        return out if bias is None else out + bias[ids]

    def _every_expert(self, hidden: torch.Tensor) -> torch.Tensor:
        """Llama 4's experts: the tokens, repeated for each expert and scaled by its router
        score, through every expert (a batched matmul per stack)."""
        x = hidden.view(self.num_experts, -1, hidden.shape[-1]).to(self.compute_dtype)
        gate, up = _Dequantized.apply(x, self, "gate_up_proj", None).chunk(2, dim=-1)
        act: Any = self.base.act_fn
        out = _Dequantized.apply(up * act(gate), self, "down_proj", None)
        return out.view(-1, hidden.shape[-1]).to(hidden.dtype)


def _times(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
    """x times the expert stack w (E, in, out): each expert's rows by `offsets` (a grouped
    GEMM, transformers' dispatcher: torch's kernel in bf16, its fallback otherwise), or a
    batched matmul (x is (E, tokens, in))."""
    if offsets is None:
        return torch.bmm(x, w)
    from transformers.integrations.moe import _grouped_mm

    return _grouped_mm(x, w, offsets)


class _Dequantized(torch.autograd.Function):
    """tokens @ a 4-bit stack: the stack dequantized for the product and dropped; again in
    backward for the input's gradient (a frozen stack needs no gradient of its own)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: Experts4bit, name: str, offsets: Any) -> Any:
        ctx.layer, ctx.name = layer, name
        ctx.save_for_backward(offsets)
        with marks.function_forward():
            w = layer.dequantized(name, x.dtype)
            out = _times(x, w, offsets)
            del w
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (offsets,) = ctx.saved_tensors
        w = ctx.layer.dequantized(ctx.name, grad.dtype)
        grad_x = _times(grad, w.transpose(-2, -1), offsets)
        del w
        return grad_x, None, None, None


def _swap(model: nn.Module, compute_dtype: torch.dtype, fill: Any) -> int:
    """Replace every experts module with an `Experts4bit` whose stacks `fill(layer, name,
    weight)` packs; returns the values now held in 4 bits."""
    count = 0
    for name, module in list(experts(model)):
        parent_name, _, attr = name.rpartition(".")
        layer = Experts4bit(module, compute_dtype)
        for w in expert_weights(module):
            fill(layer, w, getattr(module, w).data)
        setattr(model.get_submodule(parent_name), attr, layer)
        count += sum(layer.packed_values.values())
    return count


def quantize_experts(model: nn.Module, compute_dtype: torch.dtype, device: torch.device) -> int:
    """QLoRA's routed experts of `model`, quantized with bitsandbytes on `device` (one stack
    at a time there: the 16-bit stack is freed as its packed form is made)."""
    return _swap(model, compute_dtype, lambda layer, name, w: layer.pack(name, w, device))


def standin_experts(model: nn.Module, compute_dtype: torch.dtype) -> int:
    """The estimate's 4-bit experts: the same layer, its stacks bytes without values."""
    return _swap(model, compute_dtype, lambda layer, name, w: layer.stand_in(name, w))
