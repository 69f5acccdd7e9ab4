"""The model of a training step, built one way for `frugal train` and for the estimate.

`build_model` takes the job and where the weights come from: a local checkpoint
(`pretrained`), random initialization (`random`), the meta device with real buffers for an
FSDP process that receives its shards (`empty`), or the meta device with the 4-bit
stand-in for the estimate's fake tensors (`meta`). Everything else is the same code:
attention kernel, dtypes, 4-bit quantization, activation checkpointing (and offloading), LoRA
adapters and input gradients.

Dtypes (`weight_dtypes`), the lean and standard choice of each method:

* full fine-tuning, mixed precision: fp32 weights (the master copy the optimizer updates),
  autocast computes in bf16/fp16 (Micikevicius et al. 2018, "Mixed Precision Training").
* LoRA, mixed precision: the frozen base in the compute dtype, since nothing updates it and
  an fp32 base would double its bytes for no change in the result; adapters in fp32 (PEFT's
  `autocast_adapter_dtype`), so their updates are not lost to bf16 rounding.
* QLoRA: the 4-bit base, its unquantized modules (embeddings, norms, LM head) in the
  compute dtype, adapters in fp32 under mixed precision. No `prepare_model_for_kbit_training`:
  its fp32 upcast of every non-4-bit weight costs 2 bytes per embedding and LM-head value
  (1 GiB for Llama-3.1-8B) and buys nothing the fp32 loss does not already give;
  checkpointing and input gradients are enabled directly (Dettmers et al. 2023, "QLoRA",
  keep the base in bf16 as well).
* bf16-true: everything, adapters included, in bf16. fp32: everything in fp32.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections import Counter
from typing import Any, Literal
from unittest.mock import patch

import torch
from torch import nn

from frugal.errors import FrugalError
from frugal.models.specs import TOP_K_KEYS, is_moe_config
from frugal.step.job import TrainJob
from frugal.step.tasks import task_of

Weights = Literal["pretrained", "random", "empty", "meta"]
# what PEFT's LoRA adapts (its `lora.layer` dispatch), as `--lora-targets` may name it
LORA_LAYERS = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def compute_dtype(job: TrainJob) -> torch.dtype:
    return DTYPES[job.compute_dtype]


def weight_dtypes(job: TrainJob) -> tuple[torch.dtype, torch.dtype]:
    """(dtype of the loaded model, dtype of the trainable weights) for `job`."""
    compute = compute_dtype(job)
    mixed = job.precision.endswith("-mixed")
    if job.method == "full":
        return (torch.float32, torch.float32) if mixed else (compute, compute)
    return compute, torch.float32 if mixed else compute


def hf_config(config: dict[str, Any], job: TrainJob, n_layers: int | None = None) -> Any:
    """The transformers config the step runs: attention and expert kernels set, and
    `n_layers` decoder layers when given (the estimate's shallow copies).

    A shallow copy of a model that mixes layer types (sliding and full attention) keeps one
    layer of each kind, so every kind's shared buffers (masks) are there; one whose first
    layers are dense before its MoE layers (DeepSeek's `first_k_dense_replace`) keeps them
    all, the depths asked for count them (`shallow_depths`)."""
    from transformers import CONFIG_MAPPING, __version__

    kind = config.get("model_type")
    if kind not in CONFIG_MAPPING or kind not in _auto_names(job):
        what = task_of(job.task).what
        raise FrugalError(
            f"model_type {kind!r} is not a {what} this transformers ({__version__}) can "
            "train: upgrade transformers, or give the config.json of a decoder model (Llama, "
            "Qwen, Mistral, ...)"
        )
    d = copy.deepcopy(config)
    if n_layers is not None:
        _shallow(d, n_layers)
    task_of(job.task).hf_config(d, job)
    with _config_refused(kind):
        cfg = CONFIG_MAPPING[d["model_type"]](**d)
    if is_moe_config(cfg.to_dict()) and not experts_per_token_of(cfg):
        raise FrugalError(
            f"the {kind} config names routed experts but not how many a token meets "
            "(num_experts_per_tok): give the model's whole config.json"
        )
    cfg.use_cache = False
    cfg._attn_implementation = attention_kernel(config, job)
    if is_moe_config(config) and _grouped_experts(config, job):
        # transformers' grouped-GEMM experts: static shapes, as fast MoE kernels allocate
        cfg._experts_implementation = "grouped_mm"
    return cfg


def _shallow(d: dict[str, Any], n_layers: int) -> None:
    """The config `d` cut to `n_layers` decoder layers, in place (see `hf_config`)."""
    types = d.get("layer_types")
    depth = int(d.get("num_hidden_layers") or 0)
    for key, value in d.items():  # per-layer lists (Gemma 3n's widths, NoPE layers)
        if isinstance(value, list) and len(value) == depth and key != "layer_types":
            d[key] = value[:n_layers]
        elif (
            isinstance(value, dict)
            and value
            and key != "id2label"
            and all(_layer_index(k) for k in value)
        ):
            d[key] = {k: v for k, v in value.items() if int(k) < n_layers}  # by layer
    d["num_hidden_layers"] = n_layers
    if types:
        order = list(dict.fromkeys(types))
        common = Counter(types).most_common(1)[0][0]
        d["layer_types"] = (order + [common] * n_layers)[:n_layers]
    if d.get("mlp_only_layers"):
        d["mlp_only_layers"] = [i for i in d["mlp_only_layers"] if i < n_layers]
    if d.get("num_kv_shared_layers"):
        # Gemma 3n's last layers reuse earlier layers' keys and values: a shallow copy
        # computes its own in every layer (at most a layer's K/V more: conservative)
        d["num_kv_shared_layers"] = 0


def _layer_index(key: Any) -> bool:
    """Whether a config dict's key is a layer's index (Gemma 4's `per_layer_config`)."""
    return isinstance(key, int) or (isinstance(key, str) and key.isdigit())


@contextlib.contextmanager
def _config_refused(kind: Any) -> Any:
    """transformers' refusal of a config (a value missing or inconsistent, as in a class's
    bare defaults), as one line naming the fix."""
    try:
        yield
    except (torch.OutOfMemoryError, MemoryError):
        raise  # drawing random weights where they do not fit: not the config's fault
    except Exception as e:  # the config's own checks, or a value its code cannot take
        why = (str(e).strip().splitlines() or [""])[-1].strip()[:160]  # the root cause
        raise FrugalError(
            f"transformers cannot build a {kind} model of this config ({why}): give the "
            "model's whole config.json, as its publisher ships it"
        ) from e


def experts_per_token_of(cfg: Any) -> int:
    """The experts a token meets, as the config object resolved them (0: not set)."""
    return next((int(v) for k in TOP_K_KEYS if (v := getattr(cfg, k, None))), 0)


def _model_class(config: dict[str, Any], job: TrainJob) -> Any:
    """The transformers class the step builds for this config (None: none for the task)."""
    from transformers import CONFIG_MAPPING

    try:
        return _auto_class(job)._model_mapping[CONFIG_MAPPING[config["model_type"]]]
    except KeyError:
        return None  # hf_config says what is wrong with such a config


def _grouped_experts(config: dict[str, Any], job: TrainJob) -> bool:
    """Whether the model's experts take transformers' experts kernels (not Llama 4's, which
    multiplies every token by every expert)."""
    cls = _model_class(config, job)
    can = getattr(cls, "_can_set_experts_implementation", None)  # (transformers >= 5.2)
    return cls is not None and (can is None or bool(can()))


def _auto_names(job: TrainJob) -> Any:
    """transformers' model types for the task's head (causal LMs, their sequence
    classifiers: the decoder and a linear head on the last token)."""
    from transformers.models.auto import modeling_auto as auto

    return getattr(auto, task_of(job.task).auto_mapping)


def _auto_class(job: TrainJob) -> Any:
    import transformers

    return getattr(transformers, task_of(job.task).auto_class)


def _check_targets(model: torch.nn.Module, modules: list[str], job: TrainJob) -> None:
    """Each module named in --lora-targets is in the model and is a layer LoRA adapts, as
    PEFT matches names (the whole name, or its last parts): PEFT itself takes a list where
    one name matches and quietly skips the others, and fails on a router or a block."""
    from frugal.step.moe import experts, linear_names

    if job.target_modules == "all-linear":
        return
    found = dict(model.named_modules())
    has_experts = any(True for _ in experts(model))
    layers = ", ".join(linear_names(model)) + (
        ", or experts (the routed experts)" if has_experts else ""
    )
    missing = [t for t in modules if not any(n == t or n.endswith("." + t) for n in found)]
    if "experts" in job.target_modules and not has_experts:
        missing.append("experts")
    if missing:
        raise FrugalError(
            f"--lora-targets: no module {', '.join(missing)} in this model; its linear "
            f"layers are {layers} (or give all-linear)"
        )
    for t in modules:
        kinds = {
            type(m).__name__
            for n, m in found.items()
            if (n == t or n.endswith("." + t)) and not isinstance(m, LORA_LAYERS)
        }
        if kinds:
            raise FrugalError(
                f"--lora-targets {t}: a {', '.join(sorted(kinds))}, not a linear layer; its "
                f"linear layers are {layers} (or give all-linear)"
            )
    if "experts" in job.target_modules and job.method == "qlora":
        raise FrugalError(
            "--lora-targets experts: QLoRA keeps the routed experts in 4 bits, where PEFT "
            "cannot add adapters: use --method lora, or drop experts from --lora-targets"
        )
    if "experts" in job.target_modules and job.lora_dropout:
        raise FrugalError(
            "--lora-targets experts: PEFT's adapters on the routed experts take no dropout: "
            "use --lora-dropout 0, or drop experts from --lora-targets"
        )


def adapted(model: torch.nn.Module) -> list[str]:
    """What carries LoRA adapters, by leaf name: linear layers (q_proj) and, for routed
    experts, the module and the fused weight (experts.gate_up_proj)."""
    names = set()
    for name, m in model.named_modules():
        if not hasattr(m, "lora_A") or name.endswith(".base_layer"):
            continue  # (a ParamWrapper nested in another is named by its own parameter)
        leaf = name.rpartition(".")[2]
        param = getattr(m, "parameter_name", None)
        names.add(f"{leaf}.{param}" if param else leaf)
        while param and isinstance(getattr(m, "base_layer", None), type(m)):
            m = m.base_layer
            names.add(f"{leaf}.{m.parameter_name}")
    return sorted(names)


def attention_kernel(config: dict[str, Any], job: TrainJob) -> str:
    """The attention the model really runs: the job's, unless transformers has no such path
    for this architecture (no SDPA for Gemma 2's soft-capped scores or gpt-oss's attention
    sinks), where it runs eager attention, as transformers itself would choose."""
    if job.attention == "eager":
        return "eager"
    cls = _model_class(config, job)
    return job.attention if cls is None or getattr(cls, "_supports_sdpa", False) else "eager"


def build_model(
    config: dict[str, Any],
    job: TrainJob,
    weights: Weights,
    path: str | None = None,
    n_layers: int | None = None,
) -> Any:
    """The model of `job`'s step, with its adapters, ready to train (see the module doc).

    `config` is the model's config.json; `path` the checkpoint directory for `pretrained`;
    `n_layers` a shallower copy (the estimate's)."""
    cfg = hf_config(config, job, n_layers)
    if weights == "pretrained":
        model = _pretrained(config, cfg, job, path)
    else:
        model = _from_config(cfg, job, weights)
    if job.grad_checkpointing:
        enable_checkpointing(model, job.offload_activations)
    model.config.use_cache = False
    if job.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    return _with_adapters(model, job, weights)


def _pretrained(config: dict[str, Any], cfg: Any, job: TrainJob, path: str | None) -> Any:
    """The checkpoint's weights, in 4 bits for QLoRA (bitsandbytes quantizes as it loads);
    a classifier's new head initialized at random."""
    from frugal.step.qlora import bnb_config

    if path is None:
        raise ValueError("weights='pretrained' needs the checkpoint's path")
    extra: dict[str, Any] = {"attn_implementation": cfg._attn_implementation}
    if getattr(cfg, "_experts_implementation", None):
        extra["experts_implementation"] = cfg._experts_implementation
    if job.method == "qlora":
        extra["quantization_config"] = bnb_config(compute_dtype(job))
    extra.update(task_of(job.task).pretrained_kwargs(job, cfg))
    base_dtype, _ = weight_dtypes(job)
    model = _auto_class(job).from_pretrained(path, dtype=base_dtype, local_files_only=True, **extra)
    if job.method == "qlora":  # bitsandbytes quantized the linear layers, not the experts
        from frugal.step.experts4bit import quantize_experts

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        quantize_experts(model, compute_dtype(job), device)
    return model


def _from_config(cfg: Any, job: TrainJob, weights: Weights) -> Any:
    """A model made from its config: random weights, empty ones (on meta, buffers real) or
    all on meta; QLoRA's linear layers then quantized (on meta: 4-bit stand-ins)."""
    if weights == "meta":
        where: Any = torch.device("meta")
    elif weights == "empty":
        from accelerate import init_empty_weights

        where = init_empty_weights()  # weights on meta, buffers real
    else:
        where = contextlib.nullcontext()
    base_dtype, _ = weight_dtypes(job)
    with where, warnings.catch_warnings(), _config_refused(cfg.model_type):
        warnings.simplefilter("ignore")  # init warnings of weights nobody reads
        model = _auto_class(job).from_config(cfg, dtype=base_dtype)
    if weights == "empty":
        model.tie_weights()  # the meta patch unties them; the main process's are tied
    if job.method != "qlora":
        return model
    if weights == "meta":
        from frugal.step.experts4bit import standin_experts
        from frugal.step.qlora import quantize_standins

        with torch.device("meta"):
            quantize_standins(model, compute_dtype(job), job.keeps_4bit_input)
            standin_experts(model, compute_dtype(job))
    else:
        from frugal.step.experts4bit import quantize_experts
        from frugal.step.qlora import quantize

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        quantize(model, compute_dtype(job), device)
        quantize_experts(model, compute_dtype(job), device)
    return model


def _with_adapters(model: Any, job: TrainJob, weights: Weights) -> Any:
    """The LoRA adapters of `job` on the model, in the trainable dtype: on the linear layers
    it names and, for a MoE model under LoRA, on the routed experts (`moe.adapter_targets`;
    QLoRA keeps them in 4 bits, without adapters)."""
    from peft import get_peft_model

    from frugal.step.moe import adapter_targets

    _, trainable_dtype = weight_dtypes(job)
    logging.getLogger("peft").setLevel(logging.ERROR)
    where = torch.device("meta") if weights == "meta" else contextlib.nullcontext()
    config = model.config.to_dict()
    experts_too = job.method == "lora" and not job.lora_dropout
    modules, fused = adapter_targets(model, config, job.target_modules, experts_too)
    _check_targets(model, modules, job)
    ranks = dict.fromkeys(fused, job.expert_rank(config))
    with where, warnings.catch_warnings(), _as_given():
        warnings.simplefilter("ignore")
        model = get_peft_model(
            model, job.lora_config(modules, fused, ranks), autocast_adapter_dtype=False
        )
        for p in model.parameters():  # PEFT follows the base's dtype only on a real device
            if p.requires_grad and p.dtype != trainable_dtype:
                p.data = p.data.to(trainable_dtype)
    if job.grad_checkpointing:
        # the embeddings' output requires grad, so that checkpointed layers see an input
        # that does (what PEFT's kbit preparation does, without its upcast)
        model.enable_input_require_grads()
    return model


def _as_given() -> Any:
    """PEFT with the targets frugal names: without its conversion of names from
    transformers 4 (for a MoE model it moves gate_proj, up_proj and down_proj, of shared
    experts and dense layers too, onto the routed experts' weights, at twice the rank)."""
    try:
        import peft.utils.transformers_weight_conversion as conversion
    except ImportError:  # a PEFT before the conversion: nothing to turn off
        return contextlib.nullcontext()
    return patch.object(conversion, "convert_peft_config_for_transformers", lambda *a, **k: None)


def enable_checkpointing(model: Any, offload: bool = False) -> None:
    """Non-reentrant activation checkpointing of every decoder layer; with `offload`, each
    layer's saved input waits for backward in host memory (`offload.py`)."""
    kwargs = {"use_reentrant": False}
    if not getattr(model, "supports_gradient_checkpointing", True):
        raise FrugalError(
            f"{type(model).__name__} cannot checkpoint its activations in transformers: "
            "use --no-grad-checkpointing"
        )
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if offload:
        from frugal.step.offload import offload_checkpointed_inputs

        offload_checkpointed_inputs(model)


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
            n = None
            if p.dtype == torch.uint8:  # frugal's 4-bit layers say what a packed weight holds
                n = getattr(m, "packed_values", {}).get(pname) or getattr(m, "original_numel", None)
            if n is None and p.dtype == torch.uint8 and hasattr(p, "quant_state"):
                n = int(torch.Size(p.quant_state.shape).numel())  # bitsandbytes' Params4bit
            total += n or p.numel()
    return total, trainable


@contextlib.contextmanager
def cuda_kernels() -> Any:
    """Where a kernel is picked by device, take the one a CUDA GPU would, so that a step
    run on the CPU (the estimate's fake tensors, the self-consistency tests) allocates what
    it would on the GPU:

    * MoE experts use torch's grouped GEMM in bf16 only; other dtypes (full fine-tuning's
      fp32 masters) go through transformers' fallback.
    * SDPA with a value head narrower than the query's (DeepSeek's multi-head latent
      attention: 192 and 128) runs torch's memory-efficient kernel on CUDA, which keeps the
      output and its log-sum-exp; on the CPU it would fall back to the math path, which
      stores every score. Tensors without data (`is_fake_tensor`) take the CUDA kernel."""

    import transformers.integrations.moe as moe
    import transformers.integrations.sdpa_attention as sdpa

    with (
        patch.object(
            moe, "_can_use_grouped_mm", lambda inp, weight, offs: weight.dtype == torch.bfloat16
        ),
        patch.object(sdpa.torch.nn.functional, "scaled_dot_product_attention", _sdpa_as_cuda),
    ):
        yield


_SDPA = torch.nn.functional.scaled_dot_product_attention


def _sdpa_as_cuda(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """torch's SDPA, but the memory-efficient kernel CUDA takes for a narrower value head
    where the tensors have no data (the CPU has no such kernel)."""
    from transformers.utils.import_utils import is_fake_tensor

    if query.shape[-1] == value.shape[-1] or enable_gqa or not is_fake_tensor(query):
        return _SDPA(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # the kernel takes a bias
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(
            attn_mask.logical_not(), float("-inf")
        )
    out, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, attn_mask, query.requires_grad, dropout_p, is_causal, scale=scale
    )
    return out
