"""Building a run's parts from its config: precision for this hardware, the model and its
adapters and the optimizer (through `frugal.step`, the builder the estimate simulates),
FSDP sharding, the starting micro-batch, and the configs refused before any work (one line
naming the fix)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

from frugal.config import RunConfig
from frugal.data.examples import load_tokenizer
from frugal.data.labels import LabelledRows, balanced_weights
from frugal.errors import FrugalError
from frugal.estimate.core import get_profile, largest_micro_batch
from frugal.hardware.gpus import memory_budget
from frugal.models.specs import load_spec
from frugal.step.job import TrainJob
from frugal.step.model import DTYPES


def choose_precision(wanted: str, sharded: bool = False) -> tuple[str, str]:
    """The precision to run with on this hardware, and why."""
    if not torch.cuda.is_available():
        return "fp32", "no CUDA GPU: fp32 on CPU, where fp16 is unsupported and bf16 slow"
    name = torch.cuda.get_device_name()
    if wanted.startswith("bf16") and not torch.cuda.is_bf16_supported():
        if sharded:
            raise FrugalError(
                f"{name} has no bf16, and fp16 loss scaling is not supported with FSDP here: "
                "use job.sharding=ddp, or job.precision=fp32"
            )
        return "fp16-mixed", f"{name} has no bf16: fp16-mixed with loss scaling instead"
    if wanted == "fp16-mixed" and sharded:
        raise FrugalError(
            "job.precision=fp16-mixed with fsdp is not supported (loss scaling of sharded "
            "gradients): use bf16-mixed, or job.sharding=ddp"
        )
    return wanted, f"{wanted} as configured; {name} supports it"


def load_model(
    cfg: RunConfig, precision: str, empty: bool = False, sharded: bool = False
) -> tuple[Any, Any]:
    """The model with its adapters (`frugal.step.model.build_model`, the estimate's own
    builder, at the precision chosen for this hardware), and its tokenizer. `empty`: the
    weights on the meta device (buffers real) and nothing read from disk, for an FSDP
    process that receives its shards from the main process (`shard`). Random weights of an
    unsharded run are drawn on the GPU where they fit (`random_weights_device`)."""
    from frugal.data.examples import load_tokenizer
    from frugal.step.model import build_model

    job = cfg.job.model_copy(update={"precision": precision})
    tok = load_tokenizer(
        cfg.tokenizer or cfg.model, "set tokenizer= to a directory with tokenizer files"
    )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    weights = "empty" if empty else cfg.init
    no_weights = FrugalError(
        f"no weights for {cfg.model} offline: give a local model directory with "
        "weights, or init=random to train from random weights"
    )
    try:
        if weights == "pretrained":  # the checkpoint's own config, from local files only
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(cfg.model, local_files_only=True).to_dict()
        else:
            config = load_spec(cfg.model).config
        where = random_weights_device(config, job) if weights == "random" and not sharded else None
        with where or contextlib.nullcontext():
            model = build_model(config, job, weights, path=cfg.model)
        if where is not None:
            torch.cuda.empty_cache()  # QLoRA's bf16 draw, quantized and freed: not the run's
    except OSError:
        raise no_weights from None
    except ValueError as e:
        if job.method == "full" or "target modules" not in str(e).lower():
            raise
        raise FrugalError(
            f"job.lora_targets={job.lora_targets}: {str(e).splitlines()[0][:160]}; name "
            "modules of this model (e.g. q_proj,v_proj) or use all-linear"
        ) from None
    vocab = model.get_input_embeddings().num_embeddings
    if len(tok) > vocab:
        raise FrugalError(
            f"the tokenizer has {len(tok)} tokens, the model's vocabulary {vocab}: "
            "pair the model with its tokenizer"
        )
    return model, tok


def compute_dtype(job: TrainJob, precision: str) -> torch.dtype:
    """The dtype the run computes in, at the precision it chose (a second model's)."""
    return DTYPES[job.model_copy(update={"precision": precision}).compute_dtype]


def same_tokenizer(cfg: RunConfig, tok: Any) -> None:
    """A teacher with its own tokenizer files must map every token as the student's does:
    its logits are read token for token (a vocabulary of the same size can still differ)."""
    teacher = cfg.job.teacher
    if not teacher or not (Path(teacher) / "tokenizer_config.json").exists():
        return
    theirs = load_tokenizer(teacher, "give the teacher's directory with its tokenizer files")
    if theirs.get_vocab() != tok.get_vocab():
        raise FrugalError(
            f"job.teacher={teacher} has another tokenizer than the student's: distillation "
            "reads the teacher's logits token for token: pick a teacher of the same tokenizer"
        )


def random_weights_device(config: dict[str, Any], job: TrainJob) -> torch.device | None:
    """Where random weights are drawn: on this process's GPU when the whole model in its base
    dtype takes under half its free memory (8B values drawn there take a second; on 16 CPU
    cores about 20 s, then the copy), else on the CPU (None)."""
    if not torch.cuda.is_available():
        return None
    from frugal.step.model import build_model, weight_dtypes

    meta = build_model(config, job.model_copy(update={"method": "full"}), "meta")
    size = torch.empty((), dtype=weight_dtypes(job)[0]).element_size()
    need = size * sum(p.numel() for p in meta.parameters())
    free, _ = torch.cuda.mem_get_info()
    return torch.device("cuda", torch.cuda.current_device()) if need < free / 2 else None


def shard(model: Any, device: torch.device, main: bool) -> Any:
    """FSDP (PyTorch's fully_shard): each decoder layer, the class transformers names in
    `_no_split_modules`, is one unit whose weights are gathered just before it runs and
    freed after; the embeddings, final norm and head form the root unit. Gradients are
    reduce-scattered after every micro-batch, so each process only ever holds its shard
    (the memory the estimator's fsdp terms count).

    Only the main process has read the weights (the others' are on the meta device, see
    `load_model`): it sends each to all, and each keeps its shard, so the machine's CPU
    memory holds one copy of the model, not one per GPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise FrugalError(
            f"{type(base).__name__} names no decoder-layer class to shard by: use job.sharding=ddp"
        )
    whole = model.state_dict() if main else {}  # the main process's weights, to send
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}  # real everywhere
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    if not main:
        model.to_empty(device=device)  # meta shards become memory, filled just below
    set_model_state_dict(
        model, whole, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    del whole
    with torch.no_grad():  # buffers outside the state dict (rotary frequencies) too
        for n, b in model.named_buffers():
            b.copy_(buffers[n])
    return model


def make_optimizer(cfg: RunConfig, params: list[torch.nn.Parameter]) -> Any:
    """The job's optimizer (`frugal.step.optim`, the estimate's own constructor)."""
    from frugal.step.optim import make_optimizer as make

    name, t = cfg.job.optimizer, cfg.training
    if name in ("adamw-8bit", "paged-adamw-8bit") and not torch.cuda.is_available():
        raise FrugalError(f"job.optimizer={name} needs CUDA (bitsandbytes): use adamw on CPU")
    return make(
        name,
        params,
        lr=t.learning_rate,
        weight_decay=t.weight_decay,
        in_backward=cfg.job.optimizer_in_backward,
    )


def auto_micro_batch(cfg: RunConfig, per_rank: int) -> tuple[int, str]:
    """The starting micro-batch: on CUDA, the estimator's largest micro-batch that divides
    the rows each process reads per step and fits this GPU with the margin (the rule and
    margin `estimate --gpu` and `plan` use); else the largest divisor up to job.batch."""
    want = cfg.job.batch
    micro = max(d for d in range(1, per_rank + 1) if per_rank % d == 0 and d <= max(1, want))
    why = f"job.batch={want}"
    if cfg.training.auto_micro_batch and torch.cuda.is_available():
        _, total = torch.cuda.mem_get_info()
        budget = memory_budget(total / 2**30)
        spec = load_spec(cfg.model)
        fit, _ = largest_micro_batch(
            cfg.job,
            budget,
            lambda j: get_profile(spec, j, j.seq, "the run's micro-batch"),
            share=per_rank,
        )
        if fit:
            micro = fit.job.batch
            why = (
                f"estimator: largest micro-batch fitting {budget / 2**30:.1f} GiB "
                f"(all but the margin) is {micro}"
            )
    return micro, why


def refuse_unsupported(cfg: RunConfig) -> None:
    """Configs `frugal train` cannot run, refused before any work with the fix named."""
    job, t = cfg.job, cfg.training
    if job.method == "qlora" and not torch.cuda.is_available():
        raise FrugalError(
            "QLoRA needs a CUDA GPU (bitsandbytes 4-bit kernels): use job.method=lora on CPU"
        )
    if not cfg.data.path:
        raise FrugalError("data.path is not set: give the training file (data.path=FILE)")
    if cfg.plan and cfg.plan.nodes > 1:
        raise FrugalError(
            f"the plan spans {cfg.plan.nodes} machines; frugal train runs on one machine: "
            "plan with --max-gpus 8 (or the GPUs of one machine)"
        )
    if t.early_stopping_patience and not cfg.data.val_path and cfg.data.val_ratio == 0:
        raise FrugalError(
            "training.early_stopping_patience needs validation data: set data.val_ratio > 0 "
            "or data.val_path"
        )
    if job.method == "qlora" and t.merge:
        raise FrugalError(
            "training.merge with qlora would merge into the 4-bit base and keep its rounding: "
            "merge the adapter into the bf16 model after training instead (merge=false)"
        )
    if job.method == "qlora" and job.precision == "fp32":
        raise FrugalError("QLoRA computes in bf16 or fp16: set job.precision=bf16-mixed")

    needs_bnb = job.method == "qlora" or job.optimizer.endswith("8bit")
    if needs_bnb and importlib.util.find_spec("bitsandbytes") is None:
        raise FrugalError(
            f"job.method={job.method} with job.optimizer={job.optimizer} needs bitsandbytes, "
            "which is not installed: pip install 'frugal-ft[train]' (bitsandbytes)"
        )

    for name in ("mlflow", "wandb"):
        if name in t.loggers and importlib.util.find_spec(name) is None:
            raise FrugalError(
                f"training.loggers names {name}, which is not installed: pip install {name}, "
                "or drop it from training.loggers"
            )
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    here = int(os.environ.get("LOCAL_WORLD_SIZE", job.gpus))  # of job.gpus over all nodes
    if gpus and here > gpus:
        nodes = f" on each of {job.gpus // here} nodes" if here < job.gpus else ""
        raise FrugalError(
            f"job.gpus={job.gpus} needs {here} GPUs{nodes} but this machine has {gpus}"
        )
    if cfg.budget_usd is not None and not cfg.hourly_usd:
        raise FrugalError(
            "a budget needs the machine's price: run a plan's config, or give "
            "--price-per-hour USD (price_per_hour_usd=...)"
        )


# -- a classifier's model ---------------------------------------------------------------


def classifier(cfg: RunConfig, model: Any, tok: Any, rows: LabelledRows) -> tuple[float, ...]:
    """The classes the data holds, told to the model (their names, saved with it, and the
    pad id its head finds each row's last token by); returns the loss's class weights."""
    classes = rows.classes
    n = len(classes.names)
    if n != cfg.job.num_labels:
        raise FrugalError(
            f"job.num_labels={cfg.job.num_labels} but {cfg.data.path} has {n} classes "
            f"({', '.join(classes.names[:6])}{', ...' if n > 6 else ''}): set job.num_labels={n}"
        )
    config = model.config
    config.id2label = dict(enumerate(classes.names))
    config.label2id = {name: i for i, name in enumerate(classes.names)}
    config.pad_token_id = tok.pad_token_id
    return balanced_weights(rows.labels, n) if cfg.training.class_weights == "balanced" else ()
