"""The options of `frugal plan` (and of its `--jobs` form, `jobs_cmd`): one home for both."""

from __future__ import annotations

import typer

from frugal.cli.options import (
    JSON_HELP,
    MODEL_HELP,
    OFFERS_HELP,
    number,
    option,
    option_set,
    token_count,
)
from frugal.config import DataConfig, TrainingConfig
from frugal.hardware.offers import KWH_USD
from frugal.plan.constraints import Constraints
from frugal.step.job import TrainJob

CHOSEN = "the plan chooses it for the model, method and data, with its reason"


@option_set
class PlanOptions:
    """The options of `frugal plan`, in the order `--help` shows them."""

    model: str | None = typer.Argument(None, help=MODEL_HELP + " (or --jobs)")
    tokens: float | None = token_count(None, "Training tokens per epoch, e.g. 20M.")
    dataset: str | None = typer.Option(None, help="Or: a .jsonl/.csv/.parquet file to count.")
    epochs: float | None = option(DataConfig, "epochs", unset=CHOSEN)
    seq: int = option(TrainJob, "seq")
    task: str = option(TrainJob, "task")
    num_labels: int | None = option(
        TrainJob, "num_labels", unset="the classes of --dataset, else 2"
    )
    preference: str = option(TrainJob, "preference")
    teacher: str | None = option(TrainJob, "teacher")
    teacher_logits: str | None = option(
        TrainJob, "teacher_logits", unset="online, or precomputed where that is cheaper"
    )
    teacher_top_k: int = option(TrainJob, "teacher_top_k")
    reference: str | None = option(
        TrainJob, "reference", unset="auto, or precomputed where that is cheaper"
    )
    effective_batch: int | None = option(Constraints, "effective_batch", unset=CHOSEN)
    method: str = option(TrainJob, "method")
    methods: str | None = option(Constraints, "methods", listed=True, unset="--method")
    precision: str = option(TrainJob, "precision")
    optimizers: str = option(Constraints, "optimizers", listed=True)
    lora_r: int | None = option(TrainJob, "lora_r", unset=CHOSEN)
    # the job's own default (2 x rank) is not what a plan picks: its help says the plan's
    lora_alpha: int | None = option(
        TrainJob,
        "lora_alpha",
        unset=CHOSEN,
        help="LoRA alpha: the adapters' scale is alpha / rank.",
    )
    lora_dropout: float | None = option(TrainJob, "lora_dropout", unset=CHOSEN)
    lora_targets: str | None = option(TrainJob, "lora_targets", unset=CHOSEN)
    learning_rate: float | None = option(TrainingConfig, "learning_rate", unset=CHOSEN)
    schedule: str | None = option(TrainingConfig, "schedule", unset=CHOSEN)
    warmup_ratio: float | None = option(TrainingConfig, "warmup_ratio", unset=CHOSEN)
    attention: str = option(TrainJob, "attention")
    packing: bool = option(TrainJob, "packing")
    loss: str = option(TrainJob, "loss")
    loss_chunks: int | None = option(
        TrainJob, "loss_chunks", unset="0, or 16 where the plain loss does not fit"
    )
    offload_activations: bool | None = option(
        TrainJob, "offload_activations", unset="off, or on where nothing else fits"
    )
    optimizer_in_backward: bool | None = option(
        TrainJob,
        "optimizer_in_backward",
        unset="off, or on for full fine-tuning on one GPU where nothing else fits",
    )
    budget: float | None = option(Constraints, "budget_usd")
    deadline: str | None = option(Constraints, "deadline_h")
    max_gpus: int = option(Constraints, "max_gpus")
    providers: str | None = typer.Option(None, help="Comma-separated providers to consider.")
    spot: bool | None = typer.Option(
        None, "--spot/--no-spot", help="Only spot, or never spot [default: both]."
    )
    spot_mtbi_hours: str | None = option(Constraints, "mtbi_h")
    optimize: str = option(Constraints, "objective")
    value_of_time: float = option(Constraints, "value_of_time_usd_h")
    margin: float = option(Constraints, "margin")
    network_gbps: float | None = option(Constraints, "network_gbps")
    offers: list[str] | None = typer.Option(None, "--offers", "--prices", help=OFFERS_HELP)
    include_suspicious: bool = typer.Option(
        False,
        help="Plan with offers whose price is an error too: zero, spot above on-demand, a GPU "
        "count the instance contradicts (frugal offers --suspicious).",
    )
    discount: list[str] | None = typer.Option(None, help="PROVIDER=PERCENT off, e.g. aws=15.")
    local: list[str] | None = typer.Option(None, help="Your own GPUs, e.g. '2x RTX 4090'.")
    kwh_usd: float = number(KWH_USD, "Electricity price for --local, $/kWh.", ge=0, le=10)
    write: str | None = typer.Option(
        None, help="Write the run config for `frugal train` (with --jobs: a directory)."
    )
    emit: str | None = typer.Option(
        None,
        help="hf (a transformers Trainer script), skypilot (a task YAML), modal (a Modal app), "
        "slurm (an sbatch script) or torchrun (each node's command, for machines of yours).",
    )
    emit_file: str | None = typer.Option(
        None,
        help="Where --emit writes [default: train_hf.py, sky.yaml, modal_app.py, train.sbatch "
        "or nodes.sh].",
    )
    plot: str | None = typer.Option(
        None, help="Chart cost vs time: FILE.png/.svg/.pdf (matplotlib) or FILE.html."
    )
    tag: list[str] | None = typer.Option(
        None, help="Ledger tag key=value (project, team, env, ...); repeat for more."
    )
    data: str = option(Constraints, "data")
    data_gb: float | None = option(Constraints, "data_gb", unset="measured from --dataset")
    jobs: str | None = typer.Option(
        None, help="A jobs file (YAML): plan many fine-tunes as one bill on shared VMs."
    )
    price_history: str | None = typer.Option(
        None,
        help="With --jobs: spot price history (AWS describe-spot-price-history JSON or "
        "CSV time,provider,instance,region,spot_usd_h) to time spot VMs.",
    )
    now: str | None = typer.Option(
        None, help="With --jobs: plan as if it were this UTC time (ISO 8601) [default: now]."
    )
    force: bool = typer.Option(
        False, "--force", help="Replace files that exist (--write, --emit-file, --plot)."
    )
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP)
