"""`frugal estimate MODEL`: per-GPU peak memory and FLOPs of one training step."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from frugal.cli import print_json
from frugal.cli.options import (
    JSON_HELP,
    MODEL_HELP,
    fields_of,
    option,
    option_set,
    request_of,
    takes,
)
from frugal.estimate.request import EstimateRequest, make_estimate
from frugal.formats import si
from frugal.step.job import TrainJob, make_job
from frugal.step.tasks import task_of


@option_set
class EstimateOptions:
    """The options of `frugal estimate`, in the order `--help` shows them."""

    model: str = typer.Argument(..., help=MODEL_HELP)
    task: str = option(TrainJob, "task")
    num_labels: int = option(TrainJob, "num_labels")
    preference: str = option(TrainJob, "preference")
    reference: str = option(TrainJob, "reference")
    teacher: str | None = option(TrainJob, "teacher")
    teacher_logits: str = option(TrainJob, "teacher_logits")
    teacher_top_k: int = option(TrainJob, "teacher_top_k")
    method: str = option(TrainJob, "method")
    precision: str = option(TrainJob, "precision")
    optimizer: str = option(TrainJob, "optimizer")
    optimizer_in_backward: bool = option(TrainJob, "optimizer_in_backward")
    lora_r: int | None = option(TrainJob, "lora_r", unset=True)
    lora_alpha: int | None = option(TrainJob, "lora_alpha")
    lora_targets: str | None = option(TrainJob, "lora_targets", unset=True)
    lora_dropout: float | None = option(TrainJob, "lora_dropout", unset=True)
    batch: int = option(TrainJob, "batch")
    seq: int = option(TrainJob, "seq")
    grad_accum: int = option(TrainJob, "grad_accum")
    grad_checkpointing: bool = option(TrainJob, "grad_checkpointing")
    attention: str = option(TrainJob, "attention")
    packing: bool = option(TrainJob, "packing")
    loss: str = option(TrainJob, "loss")
    loss_chunks: int = option(TrainJob, "loss_chunks")
    offload_activations: bool = option(TrainJob, "offload_activations")
    gpus: int = option(TrainJob, "gpus")
    sharding: str = option(TrainJob, "sharding")
    bitsandbytes: str | None = option(TrainJob, "bitsandbytes")
    gpu: str | None = option(EstimateRequest, "gpu")
    gpu_memory: float | None = option(EstimateRequest, "gpu_memory")
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP)


@takes(EstimateOptions)
def estimate(ctx: typer.Context, o: EstimateOptions) -> None:
    """Exact per-GPU training memory and FLOPs of one step, without a GPU or weights."""
    job = make_job(**fields_of(ctx, TrainJob))  # each option named as the job's field
    est = make_estimate(request_of(ctx, EstimateRequest, job=job))
    if o.json_out:
        print_json(est.to_json())
    else:
        render(est.to_json())


LABELS = {
    "frozen_weights": "frozen weights",
    "trainable_weights": "trainable weights",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations",
    "logits_and_loss": "logits and loss",
    "temporaries": "temporaries (casts, 4-bit dequant, optimizer)",
    "cuda_context_and_workspace": "CUDA context and workspace",
    "allocator_reserve": "allocator reserve",
}
PEAK_AT = {
    "fwd": "end of forward",
    "bwd_head": "backward through loss and LM head",
    "bwd_layers": "backward through the decoder layers",
    "bwd_tail": "backward through the embeddings",
    "opt": "optimizer step",
}


def render(d: dict[str, Any]) -> None:
    c = Console()
    j = d["job"]
    c.print(_job_line(d))
    share = d["trainable_params"] / d["total_params"] if d["total_params"] else 0
    active = d["active_params"]
    c.print(
        f"parameters: {d['total_params']:,} total"
        f"{f', {active:,} active a token (MoE)' if active < d['total_params'] else ''}, "
        f"{d['trainable_params']:,} trainable ({share:.2%})"
    )
    c.print(_memory_table(d))
    f = d["flops_per_step"]
    c.print(
        f"FLOPs per step: forward {si(f['forward'])}, backward {si(f['backward'])}, "
        f"recompute {si(f['recompute'])} = {si(f['total'])}FLOP for "
        f"{d['tokens_per_step']:,} tokens{_rows_of(d['job'])}"
    )
    if "fits" in d:
        verdict = "[green]fits[/]" if d["fits"] else "[red]does not fit[/]"
        c.print(
            f"{d['gpu']} ({d['gpu_memory_gib']:.1f} GiB usable, {d['budget_gib']:.1f} GiB "
            f"after the margin): {verdict}, headroom {d['headroom_gib']:.2f} GiB; "
            f"largest micro-batch at seq {j['seq']}: "
            f"{d['max_batch']}; longest seq at batch {j['batch']}: {d['max_seq']:,}"
        )
    if "step_time_s" in d:
        lo, hi = d["tokens_per_s_range"]
        c.print(
            f"speed on {d['gpu']}: {d['step_time_s']:.2f} s per step, "
            f"{d['tokens_per_s']:,.0f} tokens/s ({lo:,.0f}-{hi:,.0f}), {d['bound']}-bound, the "
            f"host's dispatch {d['host_share']:.0%} of the step (plan's throughput model)"
        )
    for w in d["warnings"]:
        c.print(f"[yellow]warning:[/] {w}")
    for n in d["notes"]:
        c.print(f"[dim]note: {n}[/]")


def _rows_of(j: dict[str, Any]) -> str:
    """What a row of the job is, where it is more than one sequence (a preference pair)."""
    per = task_of(j["task"]).sequences_per_row
    return f" ({per} sequences a row)" if per > 1 else ""


def _job_line(d: dict[str, Any]) -> str:
    """The step estimated: the model, the method and every setting that moves its memory."""
    j = d["job"]
    what = j["method"]
    if j["method"] != "full":
        alpha = j["lora_alpha"] or 2 * j["lora_r"]
        what += f" r{j['lora_r']}/α{alpha} on {j['lora_targets']}"
    if task := task_of(j["task"]).headline(TrainJob.model_validate(j)):
        what = f"{task} · {what}"
    par = f" · {j['gpus']} GPUs {j['sharding']}" if j["gpus"] > 1 else ""
    return (
        f"[bold]{d['model']}[/] · {what} · {j['precision']} · {j['optimizer']}"
        f"{' in backward' if j['optimizer_in_backward'] else ''} · "
        f"batch {j['batch']}{_rows_of(j)} x seq {j['seq']} "
        f"{'packed' if j['packing'] else 'padded'} · "
        f"checkpointing {'on' if j['grad_checkpointing'] else 'off'} · {d['attention']} attention"
        f"{' · ' + j['loss'] if j['loss'] != 'ce' else ''}"
        f"{' · loss in ' + str(j['loss_chunks']) + ' chunks' if j['loss_chunks'] else ''}"
        f"{' · activations offloaded' if j['offload_activations'] else ''}{par}"
    )


def _memory_table(d: dict[str, Any]) -> Table:
    """Memory per GPU at its peak by component, and the three totals."""
    t = Table(title=f"memory per GPU at its peak ({PEAK_AT.get(d['peak_at'], d['peak_at'])})")
    t.add_column("component")
    t.add_column("GiB", justify="right")
    for k, v in d["breakdown_gib"].items():
        t.add_row(LABELS.get(k, k), f"{v:.2f}")
    t.add_section()
    t.add_row(
        "[bold]peak allocated[/] (max_memory_allocated)", f"[bold]{d['peak_allocated_gib']:.2f}"
    )
    t.add_row("[bold]peak reserved[/] (max_memory_reserved)", f"[bold]{d['peak_reserved_gib']:.2f}")
    t.add_row("[bold]device total[/] (nvidia-smi)", f"[bold]{d['device_total_gib']:.2f}")
    if d["host_offload_gib"]:
        t.add_row(
            "offloaded to pinned host memory (not on the GPU)", f"{d['host_offload_gib']:.2f}"
        )
    return t
