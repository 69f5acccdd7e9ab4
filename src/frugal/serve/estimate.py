"""`frugal serve estimate`: memory, throughput, latency and dollars of one deployment.

One deployment = a model in a weight format on t tensor-parallel GPUs of one type, run by
one engine, under one load. weights.py counts the bytes, kv.py the cache, memory.py the
engine's rule, speed.py the steps and the queue; this module checks the ask and joins them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from frugal.errors import FrugalError
from frugal.hardware.gpus import GIB, GPU
from frugal.hardware.offers import Offer
from frugal.models.specs import ModelSpec
from frugal.serve.deployment import Deployment
from frugal.serve.kv import KVLayout, kv_layout
from frugal.serve.memory import ServeMemory, serve_memory
from frugal.serve.speed import Load, Shape, Speed, Steps, serve_speed
from frugal.serve.weights import (
    KV_DTYPES,
    Params,
    attention_flops_per_context_token,
    compute_dtype,
    find_format,
    params,
    weight_bytes,
)

ENGINE_FORMATS = {  # weight formats each engine serves (vLLM, SGLang, TensorRT-LLM docs)
    "vllm": ("bf16", "fp16", "fp8", "awq", "gptq", "nf4", "gguf-q4_k_m", "gguf-q8_0"),
    "sglang": ("bf16", "fp16", "fp8", "awq", "gptq", "nf4", "gguf-q4_k_m", "gguf-q8_0"),
    "trtllm": ("bf16", "fp16", "fp8", "awq", "gptq"),
}
MAX_TP = 8  # one machine; more needs pipeline parallelism across nodes (not modelled)


@dataclass(frozen=True)
class ServeEstimate:
    d: Deployment
    p: Params
    kv: KVLayout
    memory: ServeMemory
    speed: Speed
    input_len: int
    output_len: int
    price_usd_h: float | None
    price_note: str
    notes: tuple[str, ...] = field(default=())

    @property
    def ttft_s(self) -> float | None:
        return self.speed.ttft_s

    @property
    def e2e_s(self) -> float | None:
        t = self.speed.ttft_s
        return None if t is None else t + (self.output_len - 1) * self.speed.itl_s

    @property
    def usd_per_mtok(self) -> float | None:
        if self.price_usd_h is None:
            return None
        return self.price_usd_h / 3600 / self.speed.output_tokens_per_s * 1e6

    @property
    def usd_per_request(self) -> float | None:
        if self.price_usd_h is None:
            return None
        return self.price_usd_h / 3600 / self.speed.requests_per_s

    def to_json(self) -> dict[str, Any]:
        d, m, s, tp = self.d, self.memory, self.speed, self.d.tp

        def ms(x: float | None) -> float | None:
            return None if x is None else round(x * 1e3, 2)

        out: dict[str, Any] = {
            "model": d.spec.id,
            "gpu": d.gpu.name,
            "gpus": tp,
            "engine": d.engine.name,
            "quant": d.fmt.name,
            "kv_dtype": d.kv_dtype,
            "compute_dtype": compute_dtype(d.fmt, d.gpu),
            "input_len": self.input_len,
            "output_len": self.output_len,
            "params": self.p.total,
            "weights_gib": round(m.weights_gib * tp, 2),
            "kv_bytes_per_token": self.kv.bytes_per_token,
            "kv_bytes_per_token_per_gpu": self.kv.bytes_per_token_gpu,
            "kv_cache_gib": round(max(m.kv_cache_gib, 0) * tp, 2),
            "kv_cache_tokens": m.kv_cache_tokens,
            "max_concurrency": m.max_concurrency,
            "batch": round(s.batch, 1),
            "batch_limit": s.batch_limit,
            "output_tokens_per_s": round(s.output_tokens_per_s, 1),
            "requests_per_s": round(s.requests_per_s, 3),
            "capacity_requests_per_s": round(s.capacity_requests_per_s, 3),
            "saturated": s.saturated,
            "ttft_ms": ms(s.ttft_s),
            "itl_ms": ms(s.itl_s),
            "e2e_latency_ms": ms(self.e2e_s),
            "memory_per_gpu": m.to_json(),
            "quality": d.fmt.quality,
            "notes": list(self.notes),
        }
        if self.price_usd_h is not None:
            out["price_usd_h"] = round(self.price_usd_h, 4)
            out["price_source"] = self.price_note
            out["usd_per_million_output_tokens"] = round(self.usd_per_mtok or 0, 4)
            out["usd_per_request"] = round(self.usd_per_request or 0, 8)
        return out


def check_request(
    spec: ModelSpec, input_len: int, output_len: int, prefix_hit: float, kv_dtype: str
) -> None:
    """Refuse a request the model cannot take, naming the fix (before any deployment)."""
    if input_len < 1 or output_len < 1:
        raise FrugalError("--input-len and --output-len must be at least 1 token")
    pos = spec.max_positions
    if pos and input_len + output_len > pos:
        raise FrugalError(
            f"--input-len + --output-len = {input_len + output_len:,} is past {spec.id}'s "
            f"{pos:,} positions: shorten the prompt or the output"
        )
    if not 0 <= prefix_hit < 1:
        raise FrugalError("--prefix-hit is a share of prompt tokens: give 0 <= F < 1")
    if kv_dtype not in KV_DTYPES:
        raise FrugalError(f"--kv-dtype {kv_dtype!r}: use auto or fp8")


def check(d: Deployment, input_len: int, output_len: int, prefix_hit: float = 0.0) -> list[str]:
    """Refuse what the engine or the model cannot do, naming the fix; return notes."""
    check_request(d.spec, input_len, output_len, prefix_hit, d.kv_dtype)
    spec, notes = d.spec, []
    if d.fmt.name not in ENGINE_FORMATS[d.engine.name]:
        ok = [e for e, f in ENGINE_FORMATS.items() if d.fmt.name in f]
        raise FrugalError(
            f"--quant {d.fmt.name} does not run on {d.engine.label}: use --engine "
            f"{' or '.join(ok)}, or --quant {' / '.join(ENGINE_FORMATS[d.engine.name][:3])}"
        )
    if d.fmt.name == "fp8" and not d.gpu.bf16:
        raise FrugalError(
            f"--quant fp8 needs an Ampere or newer GPU ({d.gpu.name} has none): "
            "use --quant awq or fp16"
        )
    if d.fmt.name == "fp8" and d.engine.name == "trtllm" and d.gpu.fp8_tflops is None:
        raise FrugalError(
            f"TensorRT-LLM runs FP8 on FP8 tensor cores (Ada, Hopper); {d.gpu.name} has none: "
            "use --engine vllm or --quant awq"
        )
    if d.fmt.name in ("awq", "gptq") and d.gpu.name.startswith("V100"):
        raise FrugalError(
            f"vLLM's 4-bit kernels need compute capability 7.5 or newer ({d.gpu.name} is 7.0): "
            "use --quant fp16 or a newer GPU"
        )
    heads = int(spec.config["num_attention_heads"])
    if d.tp < 1 or d.tp > MAX_TP or heads % d.tp:
        good = [t for t in (1, 2, 4, 8) if heads % t == 0]
        raise FrugalError(
            f"--gpus {d.tp}: tensor parallel must divide {spec.id}'s {heads} attention heads "
            f"within one machine: use --gpus {' or '.join(map(str, good))}"
        )
    if compute_dtype(d.fmt, d.gpu) != d.fmt.compute:
        notes.append(
            f"{d.gpu.name} has no {d.fmt.compute} tensor cores: GEMMs run in "
            f"{compute_dtype(d.fmt, d.gpu)}"
        )
    return notes


def steps(d: Deployment) -> tuple[Steps, Params, KVLayout, float]:
    """The step model of `d`, its parameters, KV layout and weight GiB per GPU."""
    p = params(d.spec)
    wb = weight_bytes(p, d.fmt)
    kv = kv_layout(d.spec, KV_DTYPES[d.kv_dtype], d.tp)
    st = Steps(
        p=p,
        wb=wb,
        fmt=d.fmt,
        kv=kv,
        gpu=d.gpu,
        tp=d.tp,
        eng=d.engine,
        compute_dtype=compute_dtype(d.fmt, d.gpu),
        hidden=d.spec.hidden_size,
        layers=d.spec.num_layers,
        attn_flops_per_ctx=attention_flops_per_context_token(d.spec.config, kv.attn_layers),
        vocab=d.spec.vocab_size,
    )
    return st, p, kv, wb.total / d.tp / GIB


def estimate(
    d: Deployment,
    input_len: int,
    output_len: int,
    load: Load,
    prefix_hit: float = 0.0,
    price: tuple[float, str] | None = None,
) -> ServeEstimate:
    """Memory, speed and (with a price for the whole server, $/hour) dollars of `d`."""
    notes = check(d, input_len, output_len, prefix_hit)
    st, p, kv, w_gpu = steps(d)
    mem = memory(d, input_len + output_len, (kv, w_gpu))
    if mem.max_concurrency < 1:
        raise FrugalError(
            f"{d.spec.id} in {d.fmt.name} does not fit {d.tp}x {d.gpu.name} with room for one "
            f"{input_len + output_len:,}-token request (weights {w_gpu:.1f} GiB per GPU, "
            f"KV left {mem.kv_cache_gib:.2f} GiB): {_fit_hint(d, input_len + output_len)}"
        )
    if mem.budget_gib + mem.cuda_graph_gib > mem.total_gib:
        notes.append("CUDA graphs may not fit beside the memory fraction: lower it")
    new = max(input_len * (1 - prefix_hit), 1.0)
    limit = min(mem.max_concurrency, d.seqs)
    sp = serve_speed(st, Shape(input_len, output_len, new), limit, d.batched, load)
    if sp.saturated and load.rate is not None:
        notes.append(
            f"{load.rate:g} requests/s is past this server's capacity of "
            f"{sp.capacity_requests_per_s:.2f}: the queue grows without bound (add replicas)"
        )
    return ServeEstimate(
        d,
        p,
        kv,
        mem,
        sp,
        input_len,
        output_len,
        price[0] if price else None,
        price[1] if price else "",
        tuple(notes),
    )


def memory(
    d: Deployment, seq_tokens: int, kv_weights: tuple[KVLayout, float] | None = None
) -> ServeMemory:
    """The engine's memory on each GPU of `d` for requests of `seq_tokens` tokens
    (`kv_weights`: the KV layout and weight GiB per GPU when `steps` already gave them)."""
    kv, w_gpu = kv_weights or steps(d)[2:]
    return serve_memory(d, w_gpu, kv, seq_tokens)


def _fit_hint(d: Deployment, seq_tokens: int) -> str:
    """The smallest change that fits: more GPUs, then a 4-bit format, then shorter requests."""
    heads = int(d.spec.config["num_attention_heads"])
    for tp in (t for t in (2, 4, 8) if t > d.tp and heads % t == 0):
        if memory(replace(d, tp=tp), seq_tokens).max_concurrency >= 1:
            return f"use --gpus {tp}"
    awq = find_format("awq")
    if (
        d.fmt.linear_bits > awq.linear_bits
        and memory(replace(d, fmt=awq), seq_tokens).max_concurrency >= 1
    ):
        return "use --quant awq"
    return "use a GPU with more memory, --quant awq with more GPUs, or shorter requests"


def catalog_price(gpu: GPU, gpus: int, offers: list[Offer]) -> tuple[float, str] | None:
    """The cheapest on-demand price of `gpus` of `gpu` in the catalog: an offer with exactly
    that many, else the cheapest per-GPU price pro rata."""
    mine = [o for o in offers if o.gpu == gpu]
    if not mine:
        return None
    exact = [o for o in mine if o.gpus == gpus]
    if exact:
        o = min(exact, key=lambda o: o.ondemand_usd_h)
        return o.ondemand_usd_h, f"{o.provider} {o.instance} on-demand ({o.region})"
    o = min(mine, key=lambda o: o.ondemand_usd_h / o.gpus)
    per = o.ondemand_usd_h / o.gpus
    return per * gpus, f"{o.provider} {o.instance} on-demand, ${per:.3f}/GPU-hour pro rata"
