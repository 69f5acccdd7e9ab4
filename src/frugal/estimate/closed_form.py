"""The closed-form model: parameters and state bytes from the config alone.

This is the textbook count the simulation must agree with where both are exact
(parameters, weight, gradient and optimizer bytes); `tests/test_closed_form.py` checks it
against every bundled model built on the meta device. It covers decoder-only transformers
with gated MLPs: the Llama family (Llama 2-4, Mistral, Qwen2/3, Gemma 1-3, Phi-3/4, SmolLM,
TinyLlama, Yi), their mixtures of experts (Mixtral, Qwen3-MoE, gpt-oss, Llama 4) and
DeepSeek-V3's latent attention and shared experts (DeepSeek-V3, Moonlight). Not Phi-1.5/2
(parallel blocks, plain MLP).

Per layer (h = hidden, d = head_dim, a = heads, k = KV heads, f = MLP width):
  attention  h·a·d (q) + 2·h·k·d (k, v) + a·d·h (o)  [+ biases a·d + 2·k·d (+ h for o)]
             latent (DeepSeek, ranks r_q, r_kv; head widths n, r, v): h·r_q + r_q·a·(n+r)
             (or h·a·(n+r) without r_q) + h·(r_kv + r) + r_kv·a·(n+v) + a·v·h, + r_q + r_kv
             for their norms; gpt-oss adds one attention sink per head
  MLP        3·h·f (gate, up, down)
  MoE layer  E·3·h·f_e (routed experts) + h·E (router) + shared experts' 3·h·f_s
             (gpt-oss: expert biases E·(2·f_e + h) and a router bias E)
  norms      2·h (Gemma 2/3: 4·h; Qwen3 and Gemma 3 add q/k norms 2·d)
Which layers are MoE: DeepSeek's first `first_k_dense_replace` are dense, Qwen's
`mlp_only_layers` and `decoder_sparse_step`, Llama 4's `moe_layers` (or every
`interleave_moe_layer_step`-th); Llama 4's dense layers are `intermediate_size_mlp` wide.
Model: L·layer + V·h (embeddings) + h (final norm) + V·h (LM head unless tied).
A token meets k of each layer's E routed experts (`Counts.active`).

Bytes of state (ZeRO paper, Rajbhandari et al. 2020, §3): mixed-precision AdamW keeps
fp32 weights (4) + fp32 gradients (4) + two fp32 moments (8) per trainable parameter, plus
the autocast copy; bf16-true keeps 2 + 2 + 4. bitsandbytes 8-bit AdamW keeps 2 bytes of
moments plus one fp32 absmax per 256 values per moment (Dettmers et al. 2022, 8-bit
optimizers). LoRA adds r·(in + out) per adapted linear (Hu et al. 2021), and r_e·E·(in +
out) per adapted expert stack (PEFT's target_parameters, r_e = `TrainJob.expert_rank`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frugal.errors import FrugalError
from frugal.models.specs import experts_per_token, routed_experts
from frugal.step.job import TrainJob

TIED_BY_DEFAULT = ("gemma", "smollm3")  # model types whose config class ties the LM head


def _dims(c: dict[str, Any]) -> dict[str, int]:
    h = int(c["hidden_size"])
    a = int(c["num_attention_heads"])
    d = int(c.get("head_dim") or h // a)
    k = int(c.get("num_key_value_heads") or a)
    experts = routed_experts(c)
    f = (
        int(c.get("moe_intermediate_size") or c["intermediate_size"])
        if experts
        else int(c["intermediate_size"])
    )
    return {"h": h, "a": a, "d": d, "k": k, "f": f, "E": experts}


def is_moe_layer(c: dict[str, Any], i: int) -> bool:
    """Whether decoder layer `i` holds routed experts (transformers' rules per family)."""
    if not routed_experts(c):
        return False
    if str(c.get("model_type", "")).startswith("llama4"):
        step = int(c.get("interleave_moe_layer_step") or 1)
        moe = c.get("moe_layers")
        return i in (moe if moe is not None else range(step - 1, int(c["num_hidden_layers"]), step))
    if i < int(c.get("first_k_dense_replace") or 0) or i in (c.get("mlp_only_layers") or []):
        return False
    return (i + 1) % int(c.get("decoder_sparse_step") or 1) == 0


def attention_shapes(c: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) of each attention linear of one layer."""
    x = _dims(c)
    h, a, d, k = x["h"], x["a"], x["d"], x["k"]
    if c.get("kv_lora_rank"):  # DeepSeek's multi-head latent attention
        need = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        missing = [n for n in need if not c.get(n)]
        if missing:
            raise FrugalError(
                f"the config has kv_lora_rank (latent attention) but no {', '.join(missing)}: "
                "give the model's whole config.json"
            )
        nope, rope, v = (int(c[n]) for n in need)
        r_kv, r_q = int(c["kv_lora_rank"]), int(c.get("q_lora_rank") or 0)
        q = (
            {"q_a_proj": (h, r_q), "q_b_proj": (r_q, a * (nope + rope))}
            if r_q
            else {"q_proj": (h, a * (nope + rope))}
        )
        return {
            **q,
            "kv_a_proj_with_mqa": (h, r_kv + rope),
            "kv_b_proj": (r_kv, a * (nope + v)),
            "o_proj": (a * v, h),
        }
    return {"q_proj": (h, a * d), "k_proj": (h, k * d), "v_proj": (h, k * d), "o_proj": (a * d, h)}


def _mlp(h: int, f: int) -> dict[str, tuple[int, int]]:
    return {"gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}


def linear_shapes(c: dict[str, Any], moe: bool | None = None) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear layer of one decoder layer, routed experts and routers
    excluded: attention, and the dense MLP or a MoE layer's shared experts (`moe`: which
    kind of layer; by default the model's most common)."""
    x = _dims(c)
    if moe is None:
        n = int(c["num_hidden_layers"])
        moe = sum(is_moe_layer(c, i) for i in range(n)) * 2 > n
    shapes = attention_shapes(c)
    if not moe:
        wide = str(c.get("model_type", "")).startswith("llama4") and x["E"]
        width = int(c["intermediate_size_mlp"]) if wide else int(c["intermediate_size"])
        return {**shapes, **_mlp(x["h"], width)}
    shared = _shared_width(c)
    return {**shapes, **_mlp(x["h"], shared)} if shared else shapes


def _shared_width(c: dict[str, Any]) -> int:
    """Width of a MoE layer's shared experts as one MLP (0: none)."""
    if c.get("n_shared_experts"):  # DeepSeek: n_shared experts of the routed width, as one MLP
        return int(c["n_shared_experts"]) * int(c["moe_intermediate_size"])
    if str(c.get("model_type", "")).startswith("llama4"):
        return int(c["intermediate_size"])
    return int(c.get("shared_expert_intermediate_size") or 0)  # Qwen2-MoE


@dataclass(frozen=True)
class Counts:
    """A decoder's parameters by kind."""

    linear: int  # linear weights outside the routed experts (attention, MLPs, shared experts)
    experts: int  # the routed experts' weights and biases, all E of every MoE layer
    active_experts: int  # of those, the k a token meets
    router: int  # MoE routers (weights, biases)
    embed: int
    head: int  # the LM head (0 when tied to the embedding)
    other: int  # norms, the linears' biases, attention sinks

    @property
    def total(self) -> int:
        return self.linear + self.experts + self.router + self.embed + self.head + self.other

    @property
    def active(self) -> int:
        """Parameters one token meets (the model card's "active")."""
        return self.total - self.experts + self.active_experts


def counts(c: dict[str, Any]) -> Counts:
    """The parameters of a decoder from its config (the module doc's formulas)."""
    x = _dims(c)
    h, a, d, k, E = x["h"], x["a"], x["d"], x["k"], x["E"]
    v, n_layers = int(c["vocab_size"]), int(c["num_hidden_layers"])
    mt = str(c.get("model_type", ""))
    linear = experts = router = other = 0
    for i in range(n_layers):
        moe = is_moe_layer(c, i)
        linear += sum(a_ * b_ for a_, b_ in linear_shapes(c, moe).values())
        other += _layer_other(c, mt, h, a, d, k)
        if moe:
            each = 3 * h * x["f"] + (2 * x["f"] + h if mt == "gpt_oss" else 0)
            experts += E * each
            router += h * E + (E if mt == "gpt_oss" else 0)
            router += h if c.get("shared_expert_intermediate_size") else 0  # Qwen2-MoE's gate
    k_used = experts_per_token(c)
    active = experts * min(k_used, E) // E if E else 0
    # Gemma's and SmolLM3's config classes tie by default; the others do not
    tied = c.get("tie_word_embeddings", mt.startswith(TIED_BY_DEFAULT))
    return Counts(linear, experts, active, router, v * h, 0 if tied else v * h, other + h)


def _layer_other(c: dict[str, Any], mt: str, h: int, a: int, d: int, k: int) -> int:
    """A layer's norms, the attention linears' biases and sinks."""
    n = 4 * h if mt.startswith(("gemma2", "gemma3")) else 2 * h
    if mt.startswith(("qwen3", "gemma3")):
        n += 2 * d  # q_norm, k_norm
    if c.get("kv_lora_rank"):
        n += int(c["kv_lora_rank"]) + int(c.get("q_lora_rank") or 0)  # the latents' norms
    elif mt == "qwen2":
        n += a * d + 2 * k * d  # biases on q, k and v
    elif c.get("attention_bias"):
        n += a * d + 2 * k * d + h  # and on o
    if mt == "gpt_oss":
        n += a  # one attention sink per head
    return n


def model_params(c: dict[str, Any]) -> int:
    """Total parameters of a decoder from its config."""
    return counts(c).total


def lora_params(c: dict[str, Any], job: TrainJob) -> int:
    """Adapter parameters of `job` on the model of `c`: r·(in + out) per adapted linear, and
    under LoRA with all-linear (or `experts` named) r_e·E·(in + out) per expert stack."""
    targets = job.target_modules
    n = 0
    for i in range(int(c["num_hidden_layers"])):
        moe = is_moe_layer(c, i)
        n += sum(
            job.lora_r * (a + b)
            for name, (a, b) in linear_shapes(c, moe).items()
            if targets == "all-linear" or name in targets
        )
        experts = targets == "all-linear" or "experts" in targets
        if moe and job.method == "lora" and not job.lora_dropout and experts:
            x = _dims(c)
            h, f, e = x["h"], x["f"], x["E"]
            n += job.expert_rank(c) * e * ((h + 2 * f) + (f + h))  # gate_up, down
    return n


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
