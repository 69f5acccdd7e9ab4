"""Mixture-of-experts models counted right: the FLOPs and bytes of the tokens routed to the
experts (k of E), frozen experts without gradients, LoRA on the fused experts at the rank
LoRA Without Regret gives them, QLoRA's experts in 4 bits, and the attention each
architecture really runs.

The FLOP tests run the estimator's simulation of small models of four MoE families and hold
it to the analytical count: forward 2 x the parameters a token meets (less the embedding
lookup) per token, plus attention; backward about one forward where the base is frozen and
two under full fine-tuning.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from frugal.estimate.simulate import shallow_depths, simulate
from frugal.models.specs import bundled_model_ids, experts_per_token, load_spec
from frugal.step.job import TrainJob

T = 64  # tokens of the simulated micro-step
LAYERS = 2
BASE = {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "vocab_size": 1000, "num_hidden_layers": LAYERS, "torch_dtype": "bfloat16"}  # fmt: skip
FAMILIES: dict[str, dict[str, Any]] = {
    "mixtral": {**BASE, "model_type": "mixtral", "intermediate_size": 1024,
                "num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen3_moe": {**BASE, "model_type": "qwen3_moe", "intermediate_size": 1024,
                  "moe_intermediate_size": 256, "num_experts": 16, "num_experts_per_tok": 4,
                  "norm_topk_prob": True, "mlp_only_layers": [], "decoder_sparse_step": 1},
    "gpt_oss": {**BASE, "model_type": "gpt_oss", "intermediate_size": 512,
                "num_local_experts": 8, "num_experts_per_tok": 2, "experts_per_token": 2,
                "sliding_window": 32, "attention_bias": True,
                "layer_types": ["sliding_attention", "full_attention"]},
    # DeepSeek-V3's shape: multi-head latent attention, a shared expert, a dense first layer
    "deepseek_v3": {**{k: v for k, v in BASE.items() if k != "head_dim"},
                    "model_type": "deepseek_v3", "num_hidden_layers": 3,
                    "num_key_value_heads": 8, "intermediate_size": 1024,
                    "moe_intermediate_size": 256, "n_routed_experts": 16, "n_shared_experts": 1,
                    "num_experts_per_tok": 4, "first_k_dense_replace": 1, "n_group": 4,
                    "topk_group": 2, "q_lora_rank": 192, "kv_lora_rank": 128,
                    "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64},
}  # fmt: skip
ATTENTION_ONLY = "q_proj,k_proj,v_proj,o_proj"


def _step(config: dict[str, Any], **job: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simulate(config, TrainJob(seq=T, **job), config["num_hidden_layers"], [(1, T)])[0]


def _eager_attention(config: dict[str, Any]) -> float:
    """Forward FLOPs of eager attention's two products (scores, weighted values), which
    the tracker counts with the matmuls: 2 x 2·s²·d per head and layer."""
    if config["model_type"] != "gpt_oss":
        return 0.0  # SDPA: counted apart, in attn_flops
    return 4.0 * config["num_attention_heads"] * T * T * config["head_dim"] * LAYERS


def _forward_expected(config: dict[str, Any], trace: Any) -> float:
    """2 x the parameters a token meets, less the embedding lookup (no product), per token."""
    lookup = config["vocab_size"] * config["hidden_size"]
    return 2.0 * (trace.active_params - lookup) * T + _eager_attention(config)


def _expert_values(config: dict[str, Any]) -> int:
    """Expert weight values a token's k experts hold, over the MoE layers."""
    h = config["hidden_size"]
    f = config.get("moe_intermediate_size") or config["intermediate_size"]
    moe_layers = config["num_hidden_layers"] - config.get("first_k_dense_replace", 0)
    return 3 * h * f * experts_per_token(config) * moe_layers


def _fold(config: dict[str, Any], rank: int) -> float:
    """FLOPs of PEFT's fold of B·A into every expert's stack (E x in x out x rank, x2)."""
    h = config["hidden_size"]
    f = config.get("moe_intermediate_size") or config["intermediate_size"]
    experts = config.get("num_local_experts") or config.get("n_routed_experts") or 0
    experts = experts or config["num_experts"]
    moe_layers = config["num_hidden_layers"] - config.get("first_k_dense_replace", 0)
    return 2.0 * experts * 3 * h * f * rank * moe_layers


@pytest.mark.parametrize("family", list(FAMILIES))
def test_full_fine_tuning_counts_the_routed_tokens_forward_and_twice_backward(
    family: str,
) -> None:
    config = FAMILIES[family]
    t = _step(config, method="full")
    fwd, bwd = t.flops["forward"], t.flops["backward"]
    assert fwd == pytest.approx(_forward_expected(config, t), rel=0.01)
    # the input's gradient and the weight's: each expert's weight gradient sums only the
    # tokens routed to it (a token meets k experts, not E)
    assert bwd == pytest.approx(2 * fwd, rel=0.01)
    assert 0.1 < t.active_params / t.total_params < 0.6


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_frozen_experts_get_no_gradient_backward_is_one_forward(family: str, method: str) -> None:
    config = FAMILIES[family]
    targets = ATTENTION_ONLY if family != "deepseek_v3" else "q_a_proj,q_b_proj,o_proj"
    t = _step(config, method=method, lora_r=8, lora_targets=targets)
    fwd, bwd = t.flops["forward"], t.flops["backward"]
    assert fwd == pytest.approx(_forward_expected(config, t), rel=0.03)
    assert bwd == pytest.approx(fwd + _eager_attention(config), rel=0.04)  # (eager: 2x)
    assert not any("experts" in name for name in t.lora_targets)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_lora_on_the_experts_costs_their_dense_gradient_and_the_fold(family: str) -> None:
    """PEFT adapts a fused stack by adding B·A to it each forward (`baddbmm`, twice: torch
    evaluates a parametrization once more as PEFT registers it): backward computes the
    stack's dense gradient (the experts' forward again) and the fold's two products."""
    config = FAMILIES[family]
    t = _step(config, method="lora", lora_r=8)  # all-linear: the experts too
    rank = TrainJob(lora_r=8).expert_rank(config)
    assert rank == max(1, 8 // experts_per_token(config))
    assert {"experts.down_proj"} <= set(t.lora_targets)
    fwd, bwd = t.flops["forward"], t.flops["backward"]
    fold = _fold(config, rank)
    assert fwd == pytest.approx(_forward_expected(config, t) + 2 * fold, rel=0.03)
    expected = fwd + _eager_attention(config) + 2 * T * _expert_values(config)
    assert bwd == pytest.approx(expected, rel=0.03)


def test_experts_adapters_take_the_rank_over_the_active_experts() -> None:
    config = FAMILIES["qwen3_moe"]  # 4 experts a token
    lora = _step(config, method="lora", lora_r=16)
    attention = _step(config, method="lora", lora_r=16, lora_targets=ATTENTION_ONLY)
    h, f, experts = 512, 256, 16
    per_layer = 4 * (h + f) * experts + 4 * (2 * f + h) * experts  # down, gate_up at rank 4
    assert lora.trainable_params - attention.trainable_params == per_layer * LAYERS


def test_qlora_holds_the_experts_in_four_bits() -> None:
    """Qwen3-30B-A3B: QLoRA's frozen weights are about a quarter of LoRA's."""
    from frugal.estimate.core import estimate

    spec = load_spec("Qwen/Qwen3-30B-A3B")
    lora = estimate(spec, TrainJob(method="lora")).memory.breakdown["frozen_weights"]
    qlora = estimate(spec, TrainJob(method="qlora")).memory.breakdown["frozen_weights"]
    assert 0.25 < qlora / lora < 0.30  # the embeddings and LM head stay in 16 bits


def test_a_dense_prefix_is_simulated_whole() -> None:
    """DeepSeek-V3's three dense layers are in the shallow copies, so the depth's line is
    one of MoE layers only and the parameter count is the model's."""
    spec = load_spec("deepseek-ai/DeepSeek-V3")
    assert shallow_depths(spec.config) == (4, 5)


def test_each_model_runs_the_attention_transformers_has_for_it() -> None:
    from frugal.step.model import attention_kernel

    kernels = {}
    for model in bundled_model_ids():
        spec = load_spec(model)
        kernels[spec.model_type] = attention_kernel(spec.config, TrainJob())
    assert kernels["gemma2"] == "eager"  # soft-capped scores: no SDPA path
    assert kernels["gpt_oss"] == "eager"  # attention sinks
    assert {kernels[t] for t in ("llama", "qwen3", "qwen3_moe", "mixtral")} == {"sdpa"}
    assert attention_kernel(FAMILIES["mixtral"], TrainJob(attention="eager")) == "eager"


def _experts_pair(family: str) -> tuple[Any, Any, dict[str, Any]]:
    """A MoE block of `family` in bf16, and a copy whose experts are in 4 bits; the first
    then gets the dequantized weights, so both compute the same products."""
    import copy

    import bitsandbytes.functional as bnbf

    from frugal.step.experts4bit import Experts4bit, quantize_experts
    from frugal.step.model import hf_config

    config = FAMILIES[family]
    cfg = hf_config(config, TrainJob(method="qlora"))
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    block = model.model.layers[-1].mlp
    quantized = copy.deepcopy(block)
    quantize_experts(quantized, torch.bfloat16, torch.device("cpu"))
    four = quantized.experts
    assert isinstance(four, Experts4bit)
    for name, state in four.quant_states.items():
        w = bnbf.dequantize_4bit(getattr(four, name), state)
        getattr(block.experts, name).data.copy_(w)
    return block, quantized, config


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_four_bit_experts_compute_what_their_dequantized_weights_compute(family: str) -> None:
    pytest.importorskip("bitsandbytes")
    block, quantized, config = _experts_pair(family)
    x = torch.randn(1, 24, config["hidden_size"], dtype=torch.bfloat16)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_a = block(a)
    out_b = quantized(b)
    out_a = out_a[0] if isinstance(out_a, tuple) else out_a
    out_b = out_b[0] if isinstance(out_b, tuple) else out_b
    torch.testing.assert_close(out_b, out_a, rtol=2e-2, atol=2e-2)
    out_a.float().square().sum().backward()
    out_b.float().square().sum().backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=3e-2, atol=3e-2)
    four = quantized.experts
    assert not any(getattr(four, name).requires_grad for name in four.packed_values)


@pytest.mark.parametrize(
    ("job", "said"),
    [
        ({"method": "qlora", "lora_targets": "q_proj,experts"}, "QLoRA keeps the routed"),
        ({"lora_targets": "q_proj,experts", "lora_dropout": 0.1}, "take no dropout"),
        ({"lora_targets": "gate"}, "gate: a Qwen3MoeTopKRouter, not a linear layer"),
        ({"lora_targets": "gate_up_proj"}, "or experts .the routed experts."),
    ],
)
def test_targets_the_experts_cannot_take_are_one_line(job: dict[str, Any], said: str) -> None:
    from frugal.errors import FrugalError
    from frugal.step.model import build_model

    with pytest.raises(FrugalError, match=said):
        build_model(FAMILIES["qwen3_moe"], TrainJob(**job), "meta", n_layers=1)


def test_all_linear_with_dropout_leaves_the_experts_without_adapters() -> None:
    """PEFT's adapters on fused experts take no dropout: all-linear is then every linear
    layer, and the closed form counts the same adapters."""
    from frugal.estimate.closed_form import lora_params

    config = FAMILIES["qwen3_moe"]
    job = TrainJob(method="lora", lora_r=8, lora_dropout=0.1, seq=T)
    t = simulate(config, job, LAYERS, [(1, T)])[0]
    assert t.lora_targets == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert lora_params(config, job) == t.trainable_params
