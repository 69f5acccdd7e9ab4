"""What a served model's weights weigh in each format, and the FLOPs and bytes of a forward.

Parameters come from the training side's closed form (frugal.estimate.closed_form), split
into what a quantization method packs (the decoder's linear layers, experts included) and
what stays in 16 bit (embeddings, the LM head, norms, biases, the router). Bits per packed
weight (docs/serve.md, with sources):

    bf16 / fp16      16
    fp8              8  (+ one fp32 scale per output channel; vLLM's fp8 checkpoints)
    awq / gptq       4 + 20/128: int32-packed 4-bit weights, an fp16 scale and a 4-bit zero
                     per group of 128 (vllm/model_executor/layers/quantization/awq.py)
    nf4              4 + 0.127: bitsandbytes NF4 with double-quantized absmax (QLoRA paper)
    gguf-q4_k_m      4.89 over the whole file, embeddings included (llama.cpp quantize:
    gguf-q8_0        8.5   Llama-3-8B Q4_K_M 4.58 GiB, Q8_0 7.95 GiB)

A token's forward costs 2 FLOPs per active weight it meets (Kaplan et al. 2020, C_forward
~ 2N): the decoder's linears (for a mixture of experts, the shared part and top-k experts)
for every token, the LM head only where logits are wanted (the last position of a prompt,
every decoded token), and attention 4 x layers x heads x head_dim FLOPs per token of
context (QK^T and AV).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frugal.errors import FrugalError
from frugal.estimate.closed_form import _dims, counts
from frugal.hardware.gpus import GPU
from frugal.models.specs import ModelSpec, experts_per_token, routed_experts


@dataclass(frozen=True)
class Format:
    name: str
    linear_bits: float  # per packed weight, scales and zeros included
    other_bits: float  # embeddings, LM head, norms (16 unless the format packs them too)
    compute: str  # the GEMM dtype: bf16 | fp16 | fp8 (fp8 only on GPUs with FP8 tensor cores)
    dequant: bool  # weights are unpacked to 16 bit on the fly
    quality: str  # the published quality cost, or that none is in our sources


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("bf16", 16, 16, "bf16", False, "the reference"),
        Format("fp16", 16, 16, "fp16", False, "the reference"),
        Format("fp8", 8 + 32 / 4096, 16, "fp8", False, "no published figure in our sources"),
        Format("awq", 4 + 20 / 128, 16, "fp16", True, "no published figure in our sources"),
        Format("gptq", 4 + 20 / 128, 16, "fp16", True, "no published figure in our sources"),
        Format("nf4", 4 + 0.127, 16, "bf16", True, "no published figure in our sources"),
        Format(
            "gguf-q4_k_m",
            4.89,
            4.89,
            "fp16",
            True,
            "+0.1754 perplexity on Llama-3-8B (llama.cpp tools/quantize)",
        ),
        Format(
            "gguf-q8_0",
            8.5,
            8.5,
            "fp16",
            True,
            "+0.0026 perplexity on Llama-3-8B (llama.cpp tools/quantize)",
        ),
    )
}
KV_DTYPES = {"auto": 2, "fp8": 1}  # bytes per KV element: the model's 16-bit dtype, or FP8


def find_format(name: str) -> Format:
    f = FORMATS.get(name.lower())
    if f is None:
        raise FrugalError(f"--quant {name!r}: use one of {', '.join(FORMATS)}")
    return f


def compute_dtype(fmt: Format, gpu: GPU) -> str:
    """The dtype the GEMMs run in on `gpu`: FP8 needs FP8 tensor cores (else weight-only FP8
    computes in bf16); bf16 needs bf16 support (T4, V100: fp16)."""
    if fmt.compute == "fp8" and gpu.fp8_tflops is None:
        return "bf16" if gpu.bf16 else "fp16"
    if fmt.compute == "bf16" and not gpu.bf16:
        return "fp16"
    return fmt.compute


@dataclass(frozen=True)
class Params:
    """A decoder's parameters by how they are stored and used."""

    linear: int  # packed by a quantization method: attention and MLP linears, all experts
    embed: int  # the input embedding (read one row per token)
    head: int  # the LM head (0 when tied to the embedding: then the embedding is read)
    other: int  # norms, biases, routers
    active_linear: int  # linear weights one token meets (MoE: shared part + top-k experts)
    expert_linear: int  # of `linear`, the routed experts' weights (0 for dense models)
    experts: int
    top_k: int
    tied: bool

    @property
    def total(self) -> int:
        return self.linear + self.embed + self.head + self.other


def params(spec: ModelSpec) -> Params:
    """Parameters of a decoder (Llama family, its mixtures of experts, DeepSeek's latent
    attention), from the training side's closed form."""
    c = spec.config
    if spec.model_type in ("phi", "gpt2", "gpt_neox", "bloom", "falcon"):
        raise FrugalError(
            f"{spec.id}: serving estimates cover Llama-family decoders (Llama, Mistral, Qwen, "
            f"Gemma, Phi-3, their MoE models, DeepSeek-V3); {spec.model_type} is not one of "
            "them yet"
        )
    n = counts(c)
    experts = routed_experts(c)
    return Params(
        linear=n.linear + n.experts,
        embed=n.embed,
        head=n.head,
        other=n.router + n.other,
        active_linear=n.linear + n.active_experts,
        expert_linear=n.experts,
        experts=experts,
        top_k=experts_per_token(c) if experts else 0,
        tied=n.head == 0,
    )


@dataclass(frozen=True)
class WeightBytes:
    linear: float
    embed: float
    head: float  # the LM head as read by decoding (the embedding when tied)
    other: float

    @property
    def total(self) -> float:
        return self.linear + self.embed + (0 if self.head_is_embed else self.head) + self.other

    head_is_embed: bool = False


def weight_bytes(p: Params, fmt: Format) -> WeightBytes:
    """Bytes of the stored weights in `fmt` (all GPUs together)."""
    other = fmt.other_bits / 8
    return WeightBytes(
        linear=p.linear * fmt.linear_bits / 8,
        embed=p.embed * other,
        head=(p.head or p.embed) * other,
        other=p.other * 2.0,
        head_is_embed=p.tied,
    )


def attention_flops_per_context_token(c: dict[str, Any], attn_layers: float) -> float:
    """FLOPs one query token spends per token of context it attends to (QK^T and AV)."""
    x = _dims(c)
    return 4.0 * attn_layers * x["a"] * x["d"]
