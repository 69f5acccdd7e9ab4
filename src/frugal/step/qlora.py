"""QLoRA's 4-bit layers: the real bitsandbytes ones for training, and a stand-in that fake
tensors can run for the estimate. Both replace the same modules (`quantizable`).

bitsandbytes' `Linear4bit` keeps the weight packed two values per byte (NF4) with one
absmax per 64-value block. With double quantization (QLoRA's default) the absmax values are
themselves quantized to 8 bits with one fp32 scale per 256 of them, and each layer keeps
its own code tables (16 NF4 values, 256 for the absmax code) and an fp32 offset
(`bitsandbytes.functional.QuantState`). In training the matmul does not run on 4 bits:
`MatMul4Bit.forward` rebuilds the fp32 absmax (two buffers of one value per block), the
whole weight in the compute dtype, runs a dense matmul and drops them; backward rebuilds
the absmax (one buffer) and the weight again for the input gradient
(bitsandbytes/autograd/_functions.py, backends/*/ops.py). It keeps only the packed weight
for backward. Releases before 0.43.2 also kept the input (`ctx.tensors = (A, B)`, dropped
by bitsandbytes PR #1270), as a context attribute that checkpointing does not free;
`keeps_input` reproduces that. On CUDA, micro-steps of at most 1536 tokens may take a fused
kernel that skips the dequantized weight; the stand-in always counts it (conservative).

`Linear4bitSim` reproduces exactly those allocations: the tracker sees the packed weight
and quantization state as frozen weights, the rebuilt absmax and weight as temporaries.
`tests/test_qlora_standin.py` compares it with the real layer's tensors on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from frugal.step import marks

BLOCK = 64  # values per absmax block
DQ_BLOCK = 256  # absmax values per second-level scale (double quantization)
CODE_BYTES = 4 * 16 + 4 * 256  # the NF4 code and the absmax code, fp32, per layer
# kept in the compute dtype, as transformers' quantizer does: the LM head, a classifier's head
SKIP = frozenset({"lm_head", "score"})
# modules whose linear layers stay in the compute dtype: their code reads the weights
# directly (Jamba's and other hybrids' Mamba layers: transformers' Jamba guide quantizes with
# `llm_int8_skip_modules=["mamba"]`; Gemma 3n's AltUp coefficients, F.linear on the weight)
KEEP_WHOLE = frozenset({"mamba", "altup"})


def packed_bytes(numel: int, double_quant: bool = True) -> int:
    """Bytes bitsandbytes keeps for a 4-bit weight of `numel` values: packed values,
    absmax (uint8 with double quantization, fp32 without), second-level scales, the
    offset and the two code tables."""
    blocks = -(-numel // BLOCK)
    if double_quant:
        return numel // 2 + blocks + 4 * -(-blocks // DQ_BLOCK) + 4 + CODE_BYTES
    return numel // 2 + 4 * blocks + 4 * 16


def quantizable(model: nn.Module) -> Iterator[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) of every nn.Linear that QLoRA stores in 4 bits: not the
    heads, nor those in `KEEP_WHOLE` modules."""
    for name, module in list(model.named_modules()):
        if any(part in KEEP_WHOLE for part in name.split(".")):
            continue
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and child_name not in SKIP and full not in SKIP:
                yield module, child_name, child


def bnb_config(compute_dtype: torch.dtype) -> Any:
    """The transformers quantization config of frugal's QLoRA (NF4, double quantization)."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
        llm_int8_skip_modules=sorted(SKIP | KEEP_WHOLE),
    )


def quantize(model: nn.Module, compute_dtype: torch.dtype, device: torch.device) -> None:
    """Quantize the model's (random) weights in place with bitsandbytes, as loading a
    checkpoint with `bnb_config` would: each layer is moved to `device`, which packs it."""
    import bitsandbytes as bnb

    for parent, attr, lin in quantizable(model):
        q = bnb.nn.Linear4bit(
            lin.in_features,
            lin.out_features,
            bias=lin.bias is not None,
            compute_dtype=compute_dtype,
            compress_statistics=True,
            quant_type="nf4",
            device="meta",
        )
        q.weight = bnb.nn.Params4bit(
            lin.weight.data, requires_grad=False, compress_statistics=True, quant_type="nf4"
        )
        if lin.bias is not None:
            q.bias = nn.Parameter(lin.bias.data, requires_grad=False)
        setattr(parent, attr, q.to(device))


def quant_state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The tensors of every real 4-bit layer's quantization state (not module buffers)."""
    out = []
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        if qs is None:
            continue
        out += [qs.absmax, qs.code]
        if qs.nested:
            out += [qs.offset, qs.state2.absmax, qs.state2.code]
    return [t for t in out if isinstance(t, torch.Tensor)]


class _Dequantized(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, packed: torch.Tensor, shape: tuple[int, int], keeps_input: bool
    ) -> Any:
        ctx.shape = shape
        ctx.tensors = (x if keeps_input else None, packed)  # as bitsandbytes holds them
        blocks = -(-shape[0] * shape[1] // BLOCK)
        with marks.function_forward():
            with marks.temporaries():  # absmax, absmax + offset, dequantize_4bit
                absmax = torch.empty(blocks, dtype=torch.float32, device=x.device)
                shifted = absmax + 0.0
                weight = torch.empty(shape, dtype=x.dtype, device=x.device)
            out = torch.nn.functional.linear(x, weight)
            del weight, absmax, shifted
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        blocks = -(-ctx.shape[0] * ctx.shape[1] // BLOCK)
        with marks.temporaries():  # dequantize_4bit: the absmax is gone before the matmul
            absmax = torch.empty(blocks, dtype=torch.float32, device=grad.device)
            weight = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)
            del absmax
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
        dtype = x.dtype
        x = x.to(self.compute_dtype)
        shape = (self.out_features, self.in_features)
        out = _Dequantized.apply(x, self.weight, shape, self.keeps_input)
        out = out if self.bias is None else out + self.bias
        return out.to(dtype)  # bitsandbytes returns the input's dtype


def quantize_standins(model: nn.Module, compute_dtype: torch.dtype, keeps_input: bool) -> int:
    """Swap each layer `quantizable` names for the 4-bit stand-in (on the layer's device,
    the meta device in the simulation). Returns the number of values now held in 4 bits."""
    count = 0
    for parent, attr, lin in quantizable(model):
        q = Linear4bitSim(
            lin.in_features, lin.out_features, compute_dtype, lin.weight.device, keeps_input
        )
        if lin.bias is not None:  # bitsandbytes keeps the bias unquantized
            q.bias = nn.Parameter(
                torch.empty(lin.out_features, dtype=compute_dtype, device=lin.weight.device),
                requires_grad=False,
            )
        setattr(parent, attr, q)
        count += q.original_numel
    return count
