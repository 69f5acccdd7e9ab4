"""How fast a server answers: a roofline of each scheduler step, continuous batching, queueing.

One step (an iteration of the engine's scheduler) on each of t tensor-parallel GPUs, with B
sequences decoding one token each and p prompt tokens of chunked prefill beside them:

    bytes  = weights read (packed bytes / t; a mixture of experts reads the experts its
             n = B + p tokens touch: E x (1 - (1 - k/E)^n) of them per layer)
             + KV read by the decoding sequences (B x context x KV bytes per token per GPU)
    flops  = 2 x active linear params x n / t + 2 x V x h x logit rows / t
             + 4 x layers x heads x head_dim x (B x context + p x prompt context) / t
    comm   = 2 all-reduces per layer: latency + 2 (t-1)/t x n x h x 2 B / link  (t > 1)
    step   = step_ms + max(bytes / (bandwidth x bw_eff), flops / (peak x flops_eff)) + comm

peak is the dense tensor rate of the GEMM dtype (FP8 on GPUs with FP8 tensor cores).
Steady state of continuous batching with I prompt and O output tokens per request: every
iteration admits B / O new requests, so it carries p = B x I / O prompt tokens, and

    ITL = step(B, p),  output tokens/s = B / ITL,  requests/s = B / (O x ITL)
    TTFT = request_ms + ITL / 2 (waiting for the next step) + the request's own prefill
           (ceil(I / free prefill tokens per step) steps) + the queue

Under an open arrival rate R (Poisson) the batch is what Little's law keeps in service,
B = R x (TTFT + (O - 1) x ITL), solved by fixed point, and the queue before admission is
M/D/1's, R / (2 mu (mu - R)) with mu the capacity in requests/s: it grows without bound as R
reaches capacity (Kleinrock, Queueing Systems vol. 1, Pollaczek-Khinchine). A burst of N
requests (offline, or a benchmark's "all at once") is served at the batch limit: the first
B requests' prefills run one after another, the rest wait for a free slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frugal.hardware.gpus import GPU
from frugal.serve.engines import Engine
from frugal.serve.kv import KVLayout
from frugal.serve.weights import Format, Params, WeightBytes


@dataclass(frozen=True)
class Steps:
    """Everything one scheduler step's time depends on, for one deployment."""

    p: Params
    wb: WeightBytes
    fmt: Format
    kv: KVLayout
    gpu: GPU
    tp: int
    eng: Engine
    compute_dtype: str
    hidden: int
    layers: int
    attn_flops_per_ctx: float  # FLOPs per query token per context token (all layers)
    vocab: int

    def step_s(self, decode: float, prefill: float, context: float, prompt: float) -> float:
        """Seconds of one step: `decode` sequences at `context` tokens, `prefill` prompt
        tokens attending on average `prompt` tokens each."""
        t, n = self.tp, decode + prefill
        rows = decode + (prefill / prompt / 2 if prompt else 0)  # logits: one per finished prompt
        expert_bytes = self.wb.linear * self.p.expert_linear / max(self.p.linear, 1)
        if self.p.experts and n > 0:
            touched = 1 - (1 - self.p.top_k / self.p.experts) ** n
            weights = self.wb.linear - expert_bytes + expert_bytes * touched
        else:
            weights = self.wb.linear if n > 0 else 0.0
        weights += self.wb.head + self.wb.other
        kv_read = decode * self.kv.context_read_tokens(context) * self.kv.bytes_per_token_gpu
        mem_s = (weights / t + kv_read) / (self.gpu.bandwidth_gbps * 1e9 * self.eng.bw_eff)
        flops = (
            2 * self.p.active_linear * n
            + 2 * self.vocab * self.hidden * rows
            + self.attn_flops_per_ctx * (decode * context + prefill * prompt)
        ) / t
        peak = self.gpu.peak_tflops(self.compute_dtype) or 1.0
        comp_s = flops / (peak * 1e12 * self.eng.flops_eff)
        comm_s = 0.0
        if t > 1:
            link = self.gpu.link_gbps * 1e9 * 0.75
            per = self.eng.allreduce_us * 1e-6 + 2 * (t - 1) / t * n * self.hidden * 2 / link
            comm_s = 2 * self.layers * per
        return self.eng.step_ms / 1e3 + max(mem_s, comp_s) + comm_s


@dataclass(frozen=True)
class Load:
    """How requests arrive: a fixed number in flight, a rate, or a burst (offline)."""

    concurrency: int | None = None
    rate: float | None = None
    burst: int | None = None  # offline: this many requests at once


@dataclass(frozen=True)
class Speed:
    batch: float  # sequences decoding at once
    batch_limit: int  # the most the KV cache and the scheduler allow
    output_tokens_per_s: float
    requests_per_s: float
    capacity_requests_per_s: float  # at the batch limit
    ttft_s: float | None  # None: the queue grows without bound (rate >= capacity)
    itl_s: float
    saturated: bool


@dataclass(frozen=True)
class Shape:
    """A request: `i` prompt tokens of which `new` are not in the prefix cache, `o` output."""

    i: int
    o: int
    new: float

    @property
    def prompt_ctx(self) -> float:  # the context an uncached prompt token attends on average
        return self.i - self.new / 2


def _iteration(s: Steps, b: float, q: Shape) -> float:
    """A decode step beside the other b - 1 sequences' share of chunked prefill."""
    return s.step_s(b, max(b - 1, 0) * q.new / q.o, q.i + q.o / 2, q.prompt_ctx)


def _prefill_s(s: Steps, b: float, q: Shape, budget: int) -> float:
    """The request's own prefill: chunks of what the step has free beside the others."""
    others = max(b - 1, 0) * q.new / q.o
    free = max(budget - b - others, 16)
    chunks = math.ceil(q.new / free)
    return chunks * s.step_s(b, others + min(q.new, free), q.i + q.o / 2, q.prompt_ctx)


def serve_speed(s: Steps, q: Shape, limit: int, budget: int, load: Load) -> Speed:
    """Steady-state (or burst) throughput and latencies; `limit` caps the batch (KV cache and
    max_num_seqs), `budget` is the batched-token limit of a step."""
    o = q.o
    limit = max(1, min(limit, int(budget * o / (q.new + o)) or 1))  # prefill must keep up
    req_s = s.eng.request_ms / 1e3

    def at(b: float) -> tuple[float, float]:  # (itl, ttft without queue)
        itl = _iteration(s, b, q)
        return itl, req_s + itl / 2 + _prefill_s(s, b, q, budget)

    itl_max, ttft_max = at(limit)
    cap = limit / (ttft_max + (o - 1) * itl_max)  # requests/s: each slot turns over per request

    if load.rate is not None:
        r = load.rate
        if r >= cap:  # served at capacity; the rest queue without end
            return Speed(limit, limit, cap * o, cap, cap, None, itl_max, True)
        b = min(r * o * at(1)[0], limit)
        for _ in range(60):  # a contraction below capacity: a few steps to 0.1%
            itl, ttft = at(b)
            b, was = min(max(r * (ttft + (o - 1) * itl), 1e-9), limit), b
            if abs(b - was) <= 1e-3 * b:
                break
        itl, ttft = at(b)
        ttft += r / (2 * cap * (cap - r))
        return Speed(b, limit, r * o, r, cap, ttft, itl, False)
    if load.concurrency is not None:
        c = load.concurrency
        b = min(c, limit)
        itl, ttft = at(b)
        x = b / (ttft + (o - 1) * itl)
        ttft += (c - b) / x if c > b else 0.0
        return Speed(b, limit, x * o, x, cap, ttft, itl, c > limit)
    return _burst(s, q, limit, budget, load.burst or 1000)


def _burst(s: Steps, q: Shape, limit: int, budget: int, n: int) -> Speed:
    """N equal requests at once: waves of up to `limit` sequences, each wave's prompts
    prefilled one after another in full batched-token steps, then decoded together."""
    prompt_s = s.step_s(0, budget, 0, q.prompt_ctx) / budget  # seconds per prompt token
    each = q.new * prompt_s
    start, ttft_sum, decode_sum = 0.0, 0.0, 0.0
    left = n
    while left > 0:
        b = min(left, limit)
        ttft_sum += b * start + each * b * (b + 1) / 2
        itl = s.step_s(b, 0, q.i + q.o / 2, q.prompt_ctx)
        wave = b * each + (q.o - 1) * itl
        decode_sum += b * itl
        start += wave
        left -= b
    b = min(n, limit)
    itl = decode_sum / n
    return Speed(
        b,
        limit,
        n * q.o / start,
        n / start,
        n / start,
        s.eng.request_ms / 1e3 + ttft_sum / n,
        itl,
        n > limit,
    )
