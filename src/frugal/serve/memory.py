"""A serving engine's memory on each GPU: weights, its own reserve, and the KV cache left.

    vLLM     KV = total x gpu_memory_utilization - weights - activation peak - non-torch
    SGLang   KV = total x mem_fraction_static - weights
    TRT-LLM  KV = (total - weights - activation peak - non-torch) x free_gpu_memory_fraction

The activation peak is that of the engine's profiling forward at its batched-token limit T
with its sequence limit S (vllm/v1/worker/gpu_worker.py determine_available_memory), per GPU
at tensor parallel t, the largest layer's live tensors plus the sampler's logits:

    T x (2 x 2h  +  2(a + 2k)d / t  +  2ad / t  +  3 x 2 f_tok / t)  +  S x V x 4 x 2

(residual and normed hidden states, QKV, attention output, the MLP's fused gate-up and its
activation in 16 bit; f_tok = MLP width x experts per token; fp32 logits and their
probabilities). CUDA graphs are captured after the KV cache is sized: they must fit in what
the memory fraction leaves. Sources: shared reference serving_measured.md S6 (vLLM issue
#11251's log: 15.77 GiB x 0.90 = 14.20; weights 7.51, non-torch 0.39, activations 2.53 ->
3.76 GiB of KV).
"""

from __future__ import annotations

from dataclasses import dataclass

from frugal.estimate.closed_form import _dims
from frugal.hardware.gpus import GIB
from frugal.models.specs import ModelSpec
from frugal.serve.deployment import Deployment
from frugal.serve.kv import KVLayout


def kv_budget_gib(
    rule: str,
    total_gib: float,
    fraction: float,
    weights_gib: float,
    activation_gib: float,
    non_torch_gib: float,
) -> float:
    """GiB left for the KV cache on one GPU by the engine's rule (negative: does not fit)."""
    if rule == "sglang":
        return total_gib * fraction - weights_gib
    if rule == "trtllm":
        return (total_gib - weights_gib - activation_gib - non_torch_gib) * fraction
    return total_gib * fraction - weights_gib - activation_gib - non_torch_gib


def activation_peak_bytes(spec: ModelSpec, tp: int, tokens: int, seqs: int) -> float:
    """The profiling forward's activation peak on one GPU (formula in the module doc)."""
    x = _dims(spec.config)
    h, a, d, k = x["h"], x["a"], x["d"], x["k"]
    top_k = int(spec.config.get("num_experts_per_tok") or 1) if x["E"] else 1
    f_tok = x["f"] * top_k
    layer = tokens * (4 * h + (2 * (a + 2 * k) * d + 2 * a * d + 6 * f_tok) / tp)
    return float(layer + seqs * spec.vocab_size * 8)


@dataclass(frozen=True)
class ServeMemory:
    """Per GPU, in GiB, and the KV capacity it leaves."""

    total_gib: float
    budget_gib: float  # total x the engine's memory fraction
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    kv_cache_gib: float
    kv_cache_tokens: int  # tokens of full context the cache holds (all attention layers)
    max_concurrency: int  # sequences of the asked length the cache holds at once

    def to_json(self) -> dict[str, object]:
        return {
            "gpu_total_gib": round(self.total_gib, 2),
            "budget_gib": round(self.budget_gib, 2),
            "weights_gib": round(self.weights_gib, 2),
            "activation_gib": round(self.activation_gib, 2),
            "non_torch_gib": round(self.non_torch_gib, 2),
            "cuda_graph_gib": round(self.cuda_graph_gib, 2),
            "kv_cache_gib": round(self.kv_cache_gib, 2),
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": self.max_concurrency,
        }


def serve_memory(d: Deployment, weights_gib: float, kv: KVLayout, seq_tokens: int) -> ServeMemory:
    """Memory on each GPU of `d` for sequences of `seq_tokens` (input + output) tokens, with
    the engine's batched-token and sequence limits."""
    eng, tp, total_gib = d.engine, d.tp, d.gpu.usable_gib
    batched_tokens, seqs = d.batched, d.seqs
    frac = eng.memory_fraction if d.memory_fraction is None else d.memory_fraction
    act = activation_peak_bytes(d.spec, tp, batched_tokens, seqs) / GIB
    non_torch = eng.non_torch_gib + (eng.tp_extra_gib if tp > 1 else 0.0)
    kv_gib = kv_budget_gib(eng.memory_rule, total_gib, frac, weights_gib, act, non_torch)
    kv_bytes = max(kv_gib, 0.0) * GIB
    per_token = kv.bytes_per_token_gpu
    tokens = int(kv_bytes // per_token) // 16 * 16 if per_token else 0
    per_seq = kv.seq_bytes_gpu(seq_tokens, batched_tokens)
    return ServeMemory(
        total_gib=total_gib,
        budget_gib=total_gib * frac,
        weights_gib=weights_gib,
        activation_gib=act,
        non_torch_gib=non_torch,
        cuda_graph_gib=eng.cuda_graph_gib,
        kv_cache_gib=kv_gib,
        kv_cache_tokens=tokens,
        max_concurrency=int(kv_bytes // per_seq) if per_seq else seqs,
    )
