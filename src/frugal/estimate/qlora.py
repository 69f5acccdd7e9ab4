"""A stand-in for bitsandbytes' 4-bit linear layer that fake tensors can run.

bitsandbytes' `Linear4bit` keeps the weight packed two values per byte (NF4) with one
absmax per 64-value block. With double quantization (QLoRA's default) the absmax values are
themselves quantized to 8 bits with one fp32 scale per 256 of them. In training it does not
use a 4-bit kernel: `MatMul4Bit.forward` dequantizes the whole weight to the compute dtype,
runs a dense matmul and drops the buffer; backward dequantizes it again to get the input
gradient (bitsandbytes/autograd/_functions.py). It keeps only the packed weight, not the
input; releases before 0.43.2 also kept the input (`ctx.tensors = (A, B)`, dropped by
bitsandbytes PR #1270), as a context attribute that checkpointing does not free, and
`keeps_input` reproduces that. This module reproduces exactly those allocations, so the
tracker sees the packed weight as frozen weights and the dequantized copies as temporaries.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

BLOCK = 64  # values per absmax block
DQ_BLOCK = 256  # absmax values per second-level scale (double quantization)


def packed_bytes(numel: int, double_quant: bool = True) -> int:
    """Bytes bitsandbytes keeps for a 4-bit weight of `numel` values."""
    blocks = -(-numel // BLOCK)
    if double_quant:
        return numel // 2 + blocks + 4 * -(-blocks // DQ_BLOCK) + 4
    return numel // 2 + 4 * blocks


class _Dequantized(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, packed: torch.Tensor, shape: tuple[int, int], keeps_input: bool
    ) -> Any:
        from frugal.estimate.tracker import as_temporaries, function_forward

        ctx.shape = shape
        ctx.tensors = (x if keeps_input else None, packed)  # as bitsandbytes holds them
        with function_forward():
            with as_temporaries():
                weight = torch.empty(shape, dtype=x.dtype, device=x.device)  # dequantize_4bit
            out = torch.nn.functional.linear(x, weight)
            del weight
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        from frugal.estimate.tracker import as_temporaries

        with as_temporaries():
            weight = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)
        grad_x = grad @ weight
        del weight
        return grad_x, None, None, None


class Linear4bitSim(nn.Linear):
    """Packed NF4 weight + quantization state; dequantize-in-forward and -in-backward."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        compute_dtype: torch.dtype,
        device: Any = None,
        keeps_input: bool = False,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features = in_features
        self.out_features = out_features
        self.compute_dtype = compute_dtype
        self.keeps_input = keeps_input
        numel = in_features * out_features
        self.weight = nn.Parameter(
            torch.empty((numel // 2, 1), dtype=torch.uint8, device=device), requires_grad=False
        )
        extra = packed_bytes(numel) - numel // 2
        self.register_buffer("quant_state", torch.empty(extra, dtype=torch.uint8, device=device))
        self.bias: nn.Parameter | None = None  # type: ignore[assignment]
        self.original_numel = numel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.compute_dtype)
        shape = (self.out_features, self.in_features)
        out = _Dequantized.apply(x, self.weight, shape, self.keeps_input)
        return out if self.bias is None else out + self.bias


def quantize_linears(
    model: nn.Module, compute_dtype: torch.dtype, skip: set[str], keeps_input: bool = False
) -> int:
    """Swap every nn.Linear (except `skip`, e.g. the LM head) for the 4-bit stand-in.

    Returns the number of original parameters now held in 4 bits.
    """
    count = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and child_name not in skip and full not in skip:
                q = Linear4bitSim(
                    child.in_features,
                    child.out_features,
                    compute_dtype,
                    child.weight.device,
                    keeps_input,
                )
                if child.bias is not None:  # bitsandbytes keeps the bias unquantized
                    q.bias = nn.Parameter(
                        torch.empty(
                            child.out_features, dtype=compute_dtype, device=child.weight.device
                        ),
                        requires_grad=False,
                    )
                setattr(module, child_name, q)
                count += q.original_numel
    return count
