"""What an estimate says beside its numbers: warnings about the request (a sequence past the
model's positions, fp16 for a bf16 model) and notes on how the step runs (the attention
kernel transformers takes, a MoE model's experts and adapters, sharding, offloading, a
classifier's head). `estimate` and `plan` both say them."""

from __future__ import annotations

from frugal.errors import FrugalError
from frugal.estimate.profile import Profile
from frugal.hardware.gpus import GPU
from frugal.models.specs import ModelSpec, experts_per_token
from frugal.step.job import TrainJob
from frugal.step.tasks import task_of


def checks(spec: ModelSpec, job: TrainJob, gpu: GPU | None) -> tuple[list[str], list[str]]:
    warnings: list[str] = []
    notes = list(spec.notes)
    if gpu is not None and not gpu.bf16 and job.compute_dtype == "bf16":
        raise FrugalError(f"{gpu.name} has no bf16 support: use --precision fp16-mixed (or fp32)")
    if spec.max_positions and job.seq > spec.max_positions:
        warnings.append(
            f"--seq {job.seq} is longer than the model's {spec.max_positions} positions: "
            "quality degrades unless you extend its context (e.g. rope scaling)"
        )
    if job.compute_dtype == "fp16" and spec.trained_dtype == "bfloat16":
        warnings.append(
            f"{spec.id} was trained in bf16; fp16 can overflow its activations: "
            "prefer --precision bf16-mixed on a GPU that supports it"
        )
    if job.gpus == 1 and job.sharding != "ddp":
        notes.append(f"--sharding {job.sharding} has no effect on one GPU")
    elif job.sharding in ("fsdp", "zero3"):
        notes.append(
            f"{job.sharding} terms are closed-form and cover the training step only: "
            "third-party FSDP runs peaked 6-25% above them (docs/accuracy.md); keep headroom"
        )
    if note := task_of(job.task).note(job, spec.vocab_size):
        notes.append(note)
    if job.offload_activations:
        notes.append(
            "offloaded layer inputs wait for backward in pinned host memory (host_offload_gib "
            "per GPU, outside device_total_gib); their copies add host-link time to each step"
        )
    if job.optimizer == "paged-adamw-8bit":
        notes.append(
            "paged optimizer state lives in CUDA unified memory: it counts in "
            "device_total_gib (nvidia-smi) but not in PyTorch's allocated/reserved"
        )
    return warnings, notes


def profile_notes(spec: ModelSpec, job: TrainJob, prof: Profile) -> list[str]:
    """What the simulated step did that a reader would not assume: the attention kernel
    transformers runs instead of the one asked for, and how a MoE model's experts ran."""
    notes = []
    if prof.attention != job.attention:
        notes.append(
            f"{spec.model_type} has no {job.attention} attention in transformers: "
            f"{prof.attention} attention is simulated, as the run takes it (eager stores the "
            "attention scores, which grow with the square of --seq)"
        )
    if spec.is_moe:
        notes.append(moe_note(spec, job, prof))
    return notes


def moe_note(spec: ModelSpec, job: TrainJob, prof: Profile) -> str:
    """How a MoE step runs its experts, and what carries adapters."""
    k, n = experts_per_token(spec.config), spec.num_experts
    head = (
        f"MoE: each token is routed to {k} of {n} experts ({prof.active_params / 1e9:.2f}B "
        f"of {prof.total_params / 1e9:.2f}B parameters active)"
    )
    if spec.model_type.startswith("llama4"):
        head += (
            "; transformers runs Llama 4's experts densely (every token through all "
            f"{n}, the others scaled by zero): the step's FLOPs and activations count all {n}"
        )
    fused = [t for t in prof.lora_targets if "." in t]
    if job.method == "full":
        return head
    if fused:
        kept = (
            ""
            if job.grad_checkpointing
            else " (without checkpointing every layer keeps its summed stack for backward: the "
            "experts' weights again, in 16 bits)"
        )
        return head + (
            f"; LoRA adapts the routed experts ({', '.join(fused)}: PEFT's target_parameters, "
            f"rank {job.expert_rank(spec.config)} each, the rank over the {k} active experts as in "
            "LoRA Without Regret), which adds B·A to each expert stack every forward and "
            f"computes its dense gradient{kept}; --lora-targets q_proj,k_proj,v_proj,o_proj "
            "adapts attention only"
        )
    if job.method == "qlora":
        return head + "; QLoRA keeps the routed experts in 4 bits, without adapters"
    if job.lora_dropout:
        return head + (
            "; the routed experts carry no adapters: PEFT's adapters on them take no "
            "dropout (--lora-dropout 0 adapts them)"
        )
    return head + "; the routed experts carry no adapters (add experts to --lora-targets)"
