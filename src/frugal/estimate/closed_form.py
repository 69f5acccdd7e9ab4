"""The closed-form model: parameters and state bytes from the config alone.

This is the textbook count the simulation must agree with where both are exact
(parameters, weight, gradient and optimizer bytes); `tests/test_closed_form.py` checks it.
It covers decoder-only transformers with gated MLPs: the Llama family (Llama, Mistral,
Qwen2/3, Gemma, Phi-3, SmolLM, TinyLlama, Yi) and their MoE variants (Mixtral, Qwen3-MoE).
Not Phi-1.5/2 (parallel blocks, plain MLP).

Per layer (h = hidden, d = head_dim, a = heads, k = KV heads, f = MLP width):
  attention  h·a·d (q) + 2·h·k·d (k, v) + a·d·h (o)  [+ biases a·d + 2·k·d when present]
  MLP        3·h·f (gate, up, down)  — MoE: E·3·h·f_e + h·E (router)
  norms      2·h (Gemma 2/3: 4·h; Qwen3 adds q/k norms 2·d)
Model: L·layer + V·h (embeddings) + h (final norm) + V·h (LM head unless tied).

Bytes of state (ZeRO paper, Rajbhandari et al. 2020, §3): mixed-precision AdamW keeps
fp32 weights (4) + fp32 gradients (4) + two fp32 moments (8) per trainable parameter, plus
the autocast copy; bf16-true keeps 2 + 2 + 4. bitsandbytes 8-bit AdamW keeps 2 bytes of
moments plus one fp32 absmax per 256 values per moment (Dettmers et al. 2022, 8-bit
optimizers). LoRA adds r·(in + out) per adapted linear (Hu et al. 2021).
"""

from __future__ import annotations

from typing import Any

from frugal.step.job import TrainJob

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _dims(c: dict[str, Any]) -> dict[str, int]:
    h = int(c["hidden_size"])
    a = int(c["num_attention_heads"])
    d = int(c.get("head_dim") or h // a)
    k = int(c.get("num_key_value_heads") or a)
    experts = int(c.get("num_local_experts") or c.get("num_experts") or 0)
    f = (
        int(c.get("moe_intermediate_size") or c["intermediate_size"])
        if experts
        else int(c["intermediate_size"])
    )
    return {"h": h, "a": a, "d": d, "k": k, "f": f, "E": experts}


def linear_shapes(c: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) of each dense linear in one layer (experts excluded)."""
    x = _dims(c)
    h, a, d, k, f = x["h"], x["a"], x["d"], x["k"], x["f"]
    shapes = {
        "q_proj": (h, a * d),
        "k_proj": (h, k * d),
        "v_proj": (h, k * d),
        "o_proj": (a * d, h),
    }
    if not x["E"]:
        shapes.update(gate_proj=(h, f), up_proj=(h, f), down_proj=(f, h))
    return shapes


def layer_params(c: dict[str, Any]) -> int:
    x = _dims(c)
    h, a, d, k, f, E = x["h"], x["a"], x["d"], x["k"], x["f"], x["E"]
    n = sum(i * o for i, o in linear_shapes(c).values())
    if c.get("attention_bias") or c.get("model_type") in ("qwen2",):
        n += a * d + 2 * k * d
    if E:
        n += E * 3 * h * f + h * E
    mt = c.get("model_type", "")
    n += 4 * h if mt.startswith(("gemma2", "gemma3")) else 2 * h
    if mt.startswith(("qwen3", "gemma3")):
        n += 2 * d  # q_norm, k_norm
    return n


def model_params(c: dict[str, Any]) -> int:
    """Total parameters of a Llama-family decoder from its config."""
    h, v, n_layers = int(c["hidden_size"]), int(c["vocab_size"]), int(c["num_hidden_layers"])
    # Gemma's config classes tie by default; the others do not
    tied = c.get("tie_word_embeddings", str(c.get("model_type", "")).startswith("gemma"))
    return n_layers * layer_params(c) + v * h + h + (0 if tied else v * h)


def lora_params(c: dict[str, Any], job: TrainJob) -> int:
    targets = job.target_modules
    names = LINEAR_NAMES if targets == "all-linear" else targets
    per_layer = sum(job.lora_r * (i + o) for n, (i, o) in linear_shapes(c).items() if n in names)
    return int(c["num_hidden_layers"]) * per_layer


def state_bytes(trainable: int, job: TrainJob) -> dict[str, int]:
    """Bytes of trainable weights, gradients and optimizer state (exact for dense layouts)."""
    w = 2 if job.precision == "bf16-true" else 4
    if job.optimizer == "adamw":
        opt = 2 * w * trainable
    elif job.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        opt = 2 * trainable + 2 * 4 * -(-trainable // 256)  # (small tensors keep fp32)
    elif job.optimizer == "sgd":
        opt = w * trainable  # the momentum buffer
    else:
        opt = -1  # Adafactor: factored, depends on shapes; not in closed form
    return {"trainable_weights": w * trainable, "gradients": w * trainable, "optimizer_state": opt}
