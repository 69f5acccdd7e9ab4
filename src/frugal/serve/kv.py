"""KV cache bytes per token and per sequence, from the model's config.

    standard (MHA/GQA)  2 x KV heads x head_dim x bytes, per attention layer (GQA counts KV
                        heads, not query heads)
    MLA (DeepSeek-V2/3) (kv_lora_rank + qk_rope_head_dim) x bytes per layer: one latent, no
                        factor 2, and every tensor-parallel rank holds all of it
    tensor parallel     each GPU holds max(KV heads / TP, 1) heads: past the KV heads the
                        cache is replicated, not split
    sliding window      a window layer holds at most window + max_num_batched_tokens tokens of
                        a sequence (vllm/v1/kv_cache_interface.py, SlidingWindowSpec)
    hybrid              layers of `layer_types` that are not attention (Mamba, linear
                        attention) keep a fixed state per sequence and no per-token cache

Blocks hold 16 tokens (vLLM's default block size): a sequence takes whole blocks.
Sources: shared reference serving_measured.md S6; Llama-3.1-8B 128 KiB/token in bf16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frugal.estimate.closed_form import _dims
from frugal.models.specs import ModelSpec

BLOCK = 16  # tokens per KV block


@dataclass(frozen=True)
class KVLayout:
    full_layers: int  # attention layers that keep every token
    window_layers: int  # sliding-window layers
    window: int  # their window (0 when none)
    layer_token_bytes: int  # one token, one layer, all GPUs together (TP 1)
    layer_token_bytes_gpu: int  # one token, one layer, on each GPU at this tensor parallel size
    mla: bool
    replicated: bool  # TP exceeds the KV heads: each GPU holds a copy of some heads

    @property
    def attn_layers(self) -> int:
        return self.full_layers + self.window_layers

    @property
    def bytes_per_token(self) -> int:
        """Every attention layer's cache for one token, all GPUs together at TP 1."""
        return self.attn_layers * self.layer_token_bytes

    @property
    def bytes_per_token_gpu(self) -> int:
        """Every attention layer's cache for one token, on each GPU."""
        return self.attn_layers * self.layer_token_bytes_gpu

    def held(self, tokens: int, batched_tokens: int) -> tuple[int, int]:
        """Tokens a sequence of `tokens` keeps in (full, window) layers, in whole blocks."""
        full = _blocks(tokens)
        if not self.window_layers:
            return full, 0
        return full, min(full, _blocks(self.window + batched_tokens))

    def seq_bytes_gpu(self, tokens: int, batched_tokens: int) -> int:
        """KV bytes one sequence of `tokens` tokens takes on each GPU."""
        full, win = self.held(tokens, batched_tokens)
        return (self.full_layers * full + self.window_layers * win) * self.layer_token_bytes_gpu

    def context_read_tokens(self, tokens: float) -> float:
        """Layer-tokens a decode step reads for a sequence at `tokens` of context, in units of
        all attention layers (a window layer reads at most its window)."""
        if not self.attn_layers:
            return 0.0
        win = min(tokens, self.window) if self.window_layers else 0.0
        return (self.full_layers * tokens + self.window_layers * win) / self.attn_layers


def _blocks(tokens: int) -> int:
    return math.ceil(max(tokens, 0) / BLOCK) * BLOCK


def _layer_kinds(spec: ModelSpec) -> tuple[int, int, int]:
    """(full attention layers, sliding-window layers, window) from the config."""
    c, n = spec.config, spec.num_layers
    window = spec.sliding_window or 0
    kinds = c.get("layer_types")
    if isinstance(kinds, list) and len(kinds) == n:  # the config says, layer by layer
        full = sum(k == "full_attention" for k in kinds)
        win = sum(k == "sliding_attention" for k in kinds)
        return full, win if window else 0, window if win else 0
    mt = spec.model_type
    if not window or (mt.startswith("qwen") and window >= (spec.max_positions or 0)):
        return n, 0, 0
    if mt.startswith("gemma2"):  # alternating, the even layers local (Gemma 2 report)
        return n // 2, n - n // 2, window
    if mt.startswith("gemma3"):  # 5 local : 1 global (Gemma 3 report; sliding_window_pattern)
        every = int(c.get("sliding_window_pattern") or 6)
        full = n // every
        return full, n - full, window
    return 0, n, window  # Mistral-7B v0.1: every layer slides


def kv_layout(spec: ModelSpec, kv_bytes: int = 2, tp: int = 1) -> KVLayout:
    """The KV cache layout of `spec` with `kv_bytes` per element at tensor parallel `tp`."""
    c = spec.config
    full, win, window = _layer_kinds(spec)
    if c.get("kv_lora_rank"):  # multi-head latent attention
        per = (int(c["kv_lora_rank"]) + int(c.get("qk_rope_head_dim") or 0)) * kv_bytes
        return KVLayout(full, win, window, per, per, mla=True, replicated=tp > 1)
    x = _dims(c)
    heads_gpu = max(x["k"] // tp, 1) if x["k"] >= tp else 1
    per = 2 * x["k"] * x["d"] * kv_bytes
    per_gpu = 2 * heads_gpu * x["d"] * kv_bytes
    return KVLayout(full, win, window, per, per_gpu, mla=False, replicated=tp > x["k"])
