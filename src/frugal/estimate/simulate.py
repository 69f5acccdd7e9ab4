"""Run one model's training steps on fake tensors and record what they allocate.

The model is built from its config on the meta device (no weights), reduced to a few
layers, given the job's real PEFT adapters (and the 4-bit stand-in for QLoRA), then moved
to fake tensors. Two optimizer steps run under `StepTracker`: the second is the steady
state (optimizer state already exists, gradients were freed by `zero_grad`). Every op's
live bytes per category and each segment of the step are returned as a `Trace`.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any
from unittest.mock import patch

import numpy as np
import torch
from torch import nn

from frugal.estimate.job import TrainJob
from frugal.estimate.optim import make_optimizer, optimizer_tensors
from frugal.estimate.tracker import StepTracker, tracking

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Trace:
    """What one simulated run allocated, op by op."""

    live: np.ndarray  # (ops + 1, categories) live bytes after each op
    segments: np.ndarray  # (ops + 1,) segment name of each op
    micro: np.ndarray  # (ops + 1,) micro-step of each op (1 or 2; 0 before the first)
    flops: dict[str, int]  # forward / backward / recompute FLOPs of one micro-step
    attn_flops: dict[str, int]  # the part of those in fused attention kernels
    op_ids: np.ndarray  # (ops + 1,) which aten op ran, to align runs of other shapes
    total_params: int  # parameters of the original (unquantized) model
    trainable_params: int
    lora_targets: list[str]


def reduced_config(config: dict[str, Any], n_layers: int) -> Any:
    """The model's transformers config with `n_layers` decoder layers.

    When the model mixes layer types (sliding and full attention, say), the reduced model
    keeps one layer of each kind, so every kind's shared buffers (masks) are simulated.
    """
    from transformers import CONFIG_MAPPING

    d = copy.deepcopy(config)
    types = d.get("layer_types")
    d["num_hidden_layers"] = n_layers
    if types:
        order = list(dict.fromkeys(types))
        common = Counter(types).most_common(1)[0][0]
        d["layer_types"] = (order + [common] * n_layers)[:n_layers]
    for key in ("mlp_only_layers",):
        if d.get(key):
            d[key] = [i for i in d[key] if i < n_layers]
    cfg = CONFIG_MAPPING[d["model_type"]](**d)
    cfg.use_cache = False
    return cfg


def distinct_layer_kinds(config: dict[str, Any]) -> int:
    types = config.get("layer_types")
    return len(set(types)) if types else 1


def build_model(config: dict[str, Any], job: TrainJob, n_layers: int) -> nn.Module:
    """The model the training recipe would build for `job`, on the meta device."""
    from transformers import AutoModelForCausalLM

    cfg = reduced_config(config, n_layers)
    from frugal.models.specs import NO_SDPA, is_moe_config

    sdpa_ok = config["model_type"] not in NO_SDPA
    cfg._attn_implementation = job.attention if sdpa_ok else "eager"
    if is_moe_config(config):
        # transformers' grouped-GEMM experts: static shapes, as fast MoE kernels allocate
        cfg._experts_implementation = "grouped_mm"
    compute = DTYPES[job.compute_dtype]
    # trainable weights stay fp32 under mixed precision (full fine-tuning keeps fp32 masters)
    load_dtype = torch.float32 if job.method == "full" and "mixed" in job.precision else compute
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(cfg, dtype=load_dtype)
    if job.method == "qlora":
        from frugal.estimate.qlora import quantize_linears

        with torch.device("meta"):
            quantize_linears(model, compute, skip={"lm_head"}, keeps_input=job.keeps_4bit_input)
    if job.grad_checkpointing:
        enable_checkpointing(model)
    model.config.use_cache = False
    if job.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    from peft import get_peft_model

    lora = job.lora_config()
    logging.getLogger("peft").setLevel(logging.ERROR)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # bf16-true keeps adapters in bf16; mixed precision keeps them fp32 (peft's default)
        return get_peft_model(model, lora, autocast_adapter_dtype=job.precision != "bf16-true")


def enable_checkpointing(model: Any) -> None:
    """Non-reentrant activation checkpointing, as training and the simulation both run it."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def count_params(model: nn.Module) -> tuple[int, int]:
    """(model parameters, trainable parameters).

    The model's count excludes LoRA adapters and counts 4-bit weights by their original
    number of values, so it is the number on the model card whatever the method.
    """
    total = trainable = 0
    seen: set[int] = set()
    for name, m in model.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            trainable += p.numel() if p.requires_grad else 0
            if "lora_" in name or "lora_" in pname:
                continue  # adapters are not part of the model's own parameter count
            n = getattr(m, "original_numel", None) if p.dtype == torch.uint8 else None
            total += n or p.numel()
    return total, trainable


def _decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    best: nn.ModuleList | None = None
    for name, m in model.named_modules():
        is_layers = isinstance(m, nn.ModuleList) and name.endswith("layers") and len(m) > 0
        if is_layers and (best is None or len(m) > len(best)):
            best = m
    return best


def _install_segment_hooks(model: nn.Module, tracker: StepTracker) -> list[Any]:
    """Backward segments: head (loss, LM head) -> decoder layers -> tail (embeddings)."""
    layers = _decoder_layers(model)
    if layers is None:
        return []

    def first(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x
        if isinstance(x, tuple | list) and x and isinstance(x[0], torch.Tensor):
            return x[0]
        return None

    def on_first_layer_input(module: nn.Module, args: Any, kwargs: Any) -> None:
        h = first(args) if args else first(kwargs.get("hidden_states"))
        if tracker.segment == "fwd" and h is not None and h.requires_grad:
            h.register_hook(lambda g: tracker.set_segment("bwd_tail"))

    def on_last_layer_output(module: nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        h = first(out)
        if tracker.segment == "fwd" and h is not None and h.requires_grad:
            h.register_hook(lambda g: tracker.set_segment("bwd_layers"))

    return [
        layers[0].register_forward_pre_hook(on_first_layer_input, with_kwargs=True),
        layers[-1].register_forward_hook(on_last_layer_output, with_kwargs=True),
    ]


def simulate(
    config: dict[str, Any], job: TrainJob, n_layers: int, shapes: list[tuple[int, int]]
) -> list[Trace]:
    """One steady-state optimizer step of an `n_layers`-layer model per (batch, seq) shape.

    The model and optimizer are built once; the optimizer state is created before tracking
    (as after the first step), so each tracked step is what every later step allocates.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = build_model(config, job, n_layers)
    total, trainable = count_params(model)
    targets = sorted(
        {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")}
    )
    vocab = int(config["vocab_size"])
    compute = DTYPES[job.compute_dtype]
    autocast = "mixed" in job.precision
    traces = []
    # transformers cannot tell fake position ids from traced ones and would build a
    # packed-sequence mask (b x s x s) that a real run with unpacked inputs never makes
    import transformers.masking_utils as masking

    unpacked = patch.object(masking, "find_packed_sequence_indices", lambda *a, **k: None)
    # torch's grouped GEMM takes bf16 only; fp32 expert weights (full fine-tuning's fp32
    # masters) go through transformers' fallback grouped GEMM, as they would on a GPU
    import transformers.integrations.moe as moe

    bf16_only = patch.object(
        moe, "_can_use_grouped_mm", lambda inp, weight, offs: weight.dtype == torch.bfloat16
    )
    with (
        unpacked,
        bf16_only,
        FakeTensorMode(allow_non_fake_inputs=False),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        _materialize(model)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = make_optimizer(job.optimizer, params)
        for p in params:  # the first step creates the optimizer state
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        for batch, seq in shapes:
            tracker = StepTracker(vocab)
            for m in model.modules():
                for p in m.parameters(recurse=False):
                    tracker.adopt(p, "trainable_weights" if p.requires_grad else "frozen_weights")
                for b in m.buffers(recurse=False):
                    tracker.adopt(b, "frozen_weights")
            for t in optimizer_tensors(opt):
                tracker.adopt(t, "optimizer_state")
            hooks = _install_segment_hooks(model, tracker)
            try:
                with tracking(tracker):
                    ids = torch.zeros((batch, seq), dtype=torch.long)
                    for micro in range(1, min(job.grad_accum, 2) + 1):
                        tracker.micro = micro
                        tracker.set_segment("fwd")
                        with torch.autocast("cpu", dtype=compute, enabled=autocast):
                            loss = model(input_ids=ids, labels=ids).loss
                        tracker.set_segment("bwd_head")
                        loss.backward()
                        del loss
                        tracker.relabel([p.grad for p in params if p.grad is not None], "gradients")
                        tracker.count_flops = False  # FLOPs of one micro-step
                    tracker.set_segment("opt")
                    torch.nn.utils.clip_grad_norm_(params, 1.0)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    del ids
            finally:
                for h in hooks:
                    h.remove()
            traces.append(
                Trace(
                    live=tracker.timeline(),
                    segments=tracker.segments(),
                    micro=tracker.micro_steps(),
                    flops=dict(tracker.flops),
                    attn_flops=dict(tracker.attn_flops),
                    op_ids=np.array(tracker.op_ids),
                    total_params=total,
                    trainable_params=trainable,
                    lora_targets=targets,
                )
            )
    return traces


def _materialize(model: nn.Module) -> None:
    """Replace meta parameters and buffers with fake CPU tensors, keeping ties."""
    done: dict[int, torch.Tensor] = {}
    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if p is None:
                continue
            if id(p) not in done:
                done[id(p)] = nn.Parameter(
                    torch.empty(p.shape, dtype=p.dtype), requires_grad=p.requires_grad
                )
            m._parameters[name] = done[id(p)]  # type: ignore[assignment]
        for name, b in list(m._buffers.items()):
            if b is None:
                continue
            if id(b) not in done:
                done[id(b)] = torch.empty(b.shape, dtype=b.dtype)
            m._buffers[name] = done[id(b)]
