"""Mixture-of-experts layers in the one training step: which modules are experts, what a
token meets, which of them LoRA adapts and at which rank.

transformers 5 keeps a MoE layer's routed experts as fused 3D parameters of one module,
(E, out, in) or (E, in, out) (`Qwen3MoeExperts`, `MixtralExperts`, `DeepseekV3NaiveMoe`,
`GptOssExperts`, `Llama4TextExperts`), beside a router (`gate` or `router`) and, in some
families, shared experts and dense first layers that are plain linear layers. The routed
experts run as a grouped GEMM over the tokens routed to each (`transformers.integrations.moe`,
`grouped_mm`, which the step asks for): a token meets k of E experts, so its FLOPs and
activations are those of k experts. Llama 4's text experts are the exception: transformers
multiplies every token by every expert (scaled by the router's score, zero for the rest),
which the step runs as it is and the estimate counts as it is.

LoRA on the routed experts is PEFT's `target_parameters` (`ParamWrapper`): each forward
adds scale·B·A to the whole stack of expert weights (one `baddbmm`) and runs the experts on
that sum, so backward computes the dense gradient of every expert's weight and passes it to
A and B. That costs about one expert-forward more than an adapter on a linear layer, and
holds the summed stack and its gradient for one layer at a time; `adapter_targets` says
which experts are adapted (their rank: `TrainJob.expert_rank`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from frugal.models.specs import experts_per_token

ROUTER_NAMES = frozenset({"gate", "router"})
HEAD_NAMES = frozenset({"lm_head", "score"})


def expert_weights(module: nn.Module) -> list[str]:
    """Names of the fused expert weights a module holds itself: its 3D parameters whose
    first dimension is its number of experts (not their 2D biases), or its 4-bit stacks
    (`experts4bit.Experts4bit`)."""
    n = getattr(module, "num_experts", None)
    if not isinstance(n, int):
        return []
    fused = [
        name
        for name, p in module.named_parameters(recurse=False)
        if p.dim() == 3 and p.shape[0] == n
    ]
    return fused + list(getattr(module, "packed_values", {}))


def experts(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(name, module) of every module that holds fused routed experts."""
    for name, m in model.named_modules():
        if expert_weights(m):
            yield name, m


def routed_values(module: nn.Module) -> int:
    """Values of a module's routed expert weights and biases, as the model card counts them
    (a 4-bit stack by the values it stands for)."""
    n = getattr(module, "num_experts", None)
    if not isinstance(n, int) or not expert_weights(module):
        return 0
    stored = sum(
        p.numel()
        for p in module.parameters(recurse=False)
        if p.dim() >= 2 and p.shape[0] == n and p.dtype != torch.uint8
    )
    return stored + sum(getattr(module, "packed_values", {}).values())


def inactive_params(model: nn.Module, config: dict[str, Any]) -> int:
    """Routed expert parameters a token is not sent to: (1 - k/E) of each expert stack.
    The model-card figure ("30B-A3B": 30B less these is 3B), whatever the kernel:
    transformers' Llama 4 multiplies every token by every expert, but scales the products
    of the other experts by zero."""
    k = experts_per_token(config)
    out = 0.0
    for _, m in experts(model):
        n = int(getattr(m, "num_experts"))  # noqa: B009 (an int attribute, not a submodule)
        out += routed_values(m) * (1 - min(k, n) / n)
    return round(out)


def _is_router(name: str, parents: dict[str, nn.Module]) -> bool:
    """A MoE block's router: a `gate` or `router` whose parent also holds the experts."""
    parent, _, leaf = name.rpartition(".")
    return leaf in ROUTER_NAMES and any(
        expert_weights(c) for c in parents.get(parent, nn.Module()).children()
    )


# PEFT refuses LoRA on these in Mamba layers, whose kernels read the weights themselves
# (peft.tuners.tuners_utils._check_lora_target_modules_mamba)
MAMBA_TYPES = frozenset({"falcon_h1", "mamba", "mamba2", "falcon_mamba", "nemotron_h"})
MAMBA_REFUSED = frozenset({"out_proj", "conv1d"})


def linear_names(model: nn.Module) -> list[str]:
    """Leaf names of the linear layers LoRA's all-linear adapts: every nn.Linear but the
    heads (the LM head, a classifier's score), MoE routers (PEFT's own all-linear takes a
    router that is a Linear, as Llama 4's is, but no other family's) and what PEFT refuses
    in a Mamba layer."""
    parents = dict(model.named_modules())
    mamba = getattr(getattr(model, "config", None), "model_type", None) in MAMBA_TYPES
    head = getattr(model, "get_output_embeddings", lambda: None)()
    only_linear = _endings(parents)
    names = set()
    for name, m in parents.items():
        leaf = name.rpartition(".")[2]
        if not isinstance(m, nn.Linear) or m is head or leaf in HEAD_NAMES:
            continue
        if _is_router(name, parents):
            continue
        parts = name.split(".")
        # the shortest ending PEFT matches to linear layers only: the leaf name, unless
        # another kind of module ends so too (a list's "0" is also the first decoder layer);
        # a linear no ending tells apart is left without an adapter
        ends = (".".join(parts[-n:]) for n in range(1, len(parts) + 1))
        end = next((e for e in ends if only_linear[e]), None)
        if end is not None:
            names.add(end)
    return sorted(names - MAMBA_REFUSED if mamba else names)


def _endings(modules: dict[str, nn.Module]) -> dict[str, bool]:
    """Each ending of a module name (its last one, two, ... parts): whether every module
    whose name ends so is a linear layer."""
    out: dict[str, bool] = {}
    for name, m in modules.items():
        parts = name.split(".")
        for n in range(1, len(parts) + 1):
            end = ".".join(parts[-n:])
            out[end] = out.get(end, True) and isinstance(m, nn.Linear)
    return out


def adapter_targets(
    model: nn.Module, config: dict[str, Any], wanted: str | list[str], adapt_experts: bool
) -> tuple[list[str], list[str]]:
    """(target_modules, target_parameters) for PEFT: `wanted` is all-linear (every linear
    layer but heads and routers, and the routed experts when `adapt_experts`: LoRA on a
    16-bit base without dropout, which PEFT's expert adapters cannot take) or a list of
    names, of linear layers or `experts` (every routed expert's weights)."""
    fused = sorted(
        {f"{name.rpartition('.')[2]}.{w}" for name, m in experts(model) for w in expert_weights(m)}
    )
    if wanted == "all-linear":
        return linear_names(model), fused if adapt_experts else []
    modules = [w for w in wanted if w != "experts"]
    return modules, fused if "experts" in wanted else []
