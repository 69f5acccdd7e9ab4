"""A plan in other tools' terms: transformers/PEFT/bitsandbytes arguments, a SkyPilot task."""

from __future__ import annotations

from typing import Any

import yaml

from frugal.hardware.offers import SKY_GPU


def hf_arguments(model: str, plan: Any) -> str:
    """Python that builds the same run with transformers, PEFT and bitsandbytes."""
    j = plan.job
    bf16 = j.precision.startswith("bf16")
    optim = {
        "adamw": "adamw_torch_fused",
        "adamw-8bit": "adamw_bnb_8bit",
        "paged-adamw-8bit": "paged_adamw_8bit",
        "sgd": "sgd",
        "adafactor": "adafactor",
    }[j.optimizer]
    lines = [
        "# transformers / peft / bitsandbytes equivalent of this plan",
        "from transformers import TrainingArguments",
    ]
    if j.method != "full":
        lines.append("from peft import LoraConfig")
    if j.method == "qlora":
        lines += [
            "from transformers import BitsAndBytesConfig",
            "import torch",
            "quantization_config = BitsAndBytesConfig(",
            "    load_in_4bit=True, bnb_4bit_quant_type='nf4', bnb_4bit_use_double_quant=True,",
            f"    bnb_4bit_compute_dtype=torch.{'bfloat16' if bf16 else 'float16'})",
        ]
    if j.method != "full":
        targets = j.target_modules
        lines.append(
            f"lora_config = LoraConfig(r={j.lora_r}, lora_alpha={j.alpha}, "
            f"lora_dropout={j.lora_dropout}, target_modules={targets!r}, task_type='CAUSAL_LM')"
        )
    lines += [
        "args = TrainingArguments(",
        "    output_dir='runs/frugal',",
        f"    per_device_train_batch_size={j.batch},",
        f"    gradient_accumulation_steps={j.grad_accum},",
        f"    gradient_checkpointing={j.grad_checkpointing},",
        f"    bf16={bf16}, fp16={j.precision == 'fp16-mixed'},",
        f"    optim='{optim}',",
        "    learning_rate=2e-4, lr_scheduler_type='cosine', warmup_ratio=0.03,",
        f"    save_steps=...,  # every {plan.checkpoint_interval_min or 60:.0f} min of steps",
        ")",
        f"# model: {model}; sequences of {j.seq} tokens; {j.gpus} GPU(s)"
        + (
            f" with {j.sharding} (accelerate launch --num_processes {j.gpus})" if j.gpus > 1 else ""
        ),
    ]
    return "\n".join(lines)


def skypilot_task(plan: Any, run_config: str) -> str:
    """A SkyPilot task YAML: resources, spot with job recovery, a checkpoint bucket mount."""
    o = plan.offer
    resources: dict[str, Any] = {
        "accelerators": f"{SKY_GPU.get(o.gpu.name, o.gpu.name)}:{o.gpus}",
        "use_spot": bool(plan.spot),
    }
    if o.provider in ("aws", "gcp", "azure", "lambda", "runpod"):
        resources["cloud"] = o.provider
    if o.region and o.provider != "vast":
        resources["region"] = o.region
    if plan.spot:
        resources["job_recovery"] = {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 3}
    task: dict[str, Any] = {
        "name": "frugal-train",
        "resources": resources,
        "num_nodes": plan.nodes,
        "file_mounts": {"/checkpoints": {"name": "frugal-checkpoints", "mode": "MOUNT"}},
        "workdir": ".",
        "setup": "pip install 'frugal[train]'",
        "run": f"frugal train {run_config} output_dir=/checkpoints --resume auto",
    }
    return "# SkyPilot task written by frugal plan\n" + yaml.safe_dump(task, sort_keys=False)
