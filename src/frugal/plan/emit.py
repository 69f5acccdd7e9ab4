"""What a plan hands on: the run config `frugal train` reads, and the same job in other
tools' terms (a transformers/PEFT/bitsandbytes script, a SkyPilot task).

The script and the task both read the run config (`to_run_config`), so the script trains
with the same hyperparameters and schedule as `frugal train` would, and the task runs
`frugal train` on that config.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import yaml

from frugal.config import PlanConfig, RunConfig
from frugal.errors import FrugalError
from frugal.hardware.offers import MODAL_CORES_PER_GPU, MODAL_GIB_PER_GPU, Offer, modal_gpu
from frugal.hardware.skypilot import CLOUDS, to_skypilot
from frugal.models.specs import is_moe_config, load_spec
from frugal.plan.constraints import Constraints
from frugal.plan.hyper import Choice
from frugal.plan.jobs import VM
from frugal.plan.plans import Plan
from frugal.plan.spot import DEFAULT_CHECKPOINT_MIN
from frugal.step.job import TrainJob


def to_run_config(
    model: str,
    plan: Plan,
    k: Constraints,
    dataset: str | None,
    tokens_per_epoch: float,
    epochs: float,
    settings: Sequence[Choice] = (),
) -> RunConfig:
    """The run config that trains `plan` (chosen under constraints `k`), with the training
    `settings` the plan chose (their reasons: `frugal plan`'s answer)."""
    p = plan.to_json()
    chosen = {c.name: c.value for c in settings}
    learning = {n: chosen[n] for n in ("learning_rate", "schedule", "warmup_ratio") if n in chosen}
    return RunConfig.model_validate(
        {
            "model": model,
            "job": plan.job,
            "data": {"path": dataset, "tokens": int(tokens_per_epoch), "epochs": epochs},
            "training": {
                "effective_batch": k.effective_batch,
                **learning,
                # each gradient is applied before the global norm exists
                **({"max_grad_norm": 0.0} if plan.job.optimizer_in_backward else {}),
            },
            "plan": {f: p[f] for f in PlanConfig.model_fields if f in p},
            "budget_usd": k.budget_usd,
        }
    )


HF_OPTIM = {
    "adamw": "adamw_torch_fused",
    "adamw-8bit": "adamw_bnb_8bit",
    "paged-adamw-8bit": "paged_adamw_8bit",
    "sgd": "sgd",
    "adafactor": "adafactor",
}
HF_SCHEDULE = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


def needs_bitsandbytes(job: TrainJob) -> bool:
    return bool(job.method == "qlora" or job.optimizer.endswith("8bit"))


def save_steps(cfg: RunConfig, step_time_s: float) -> int:
    """The plan's checkpoint interval in optimizer steps."""
    minutes = (cfg.plan.checkpoint_interval_min if cfg.plan else None) or DEFAULT_CHECKPOINT_MIN
    return max(1, round(minutes * 60 / max(step_time_s, 1e-9)))


def hf_script(cfg: RunConfig, step_time_s: float) -> str:
    """A Python script that trains the plan's job with transformers' Trainer, PEFT and
    bitsandbytes: the run config's model, data, hyperparameters, schedule and checkpoint
    cadence. Module level only builds the configs; `python SCRIPT` trains."""
    from frugal.step.model import attention_kernel, weight_dtypes

    j, t = cfg.job, cfg.training
    if j.loss_chunks:
        raise FrugalError(
            "--emit hf: the Trainer script computes the plain loss, whose logits the plan's "
            "--loss-chunks avoids: train with `frugal train`, or plan with --loss-chunks 0"
        )
    if j.offload_activations:
        raise FrugalError(
            "--emit hf: the Trainer script keeps activations on the GPU, which the plan's "
            "--offload-activations avoids: train with `frugal train`, or plan with "
            "--no-offload-activations"
        )
    if j.optimizer_in_backward:
        raise FrugalError(
            "--emit hf: the Trainer steps the optimizer after backward, which the plan's "
            "--optimizer-in-backward avoids: train with `frugal train`, or plan with "
            "--no-optimizer-in-backward"
        )
    spec = load_spec(cfg.model)
    if spec.is_moe and j.method == "qlora":
        raise FrugalError(
            "--emit hf: transformers' bitsandbytes quantization leaves a MoE model's experts in "
            "16 bits, which frugal's QLoRA holds in 4: train with `frugal train`, or plan "
            "with --methods lora"
        )
    modules, fused, ranks = _adapters(spec.config, j)
    base_dtype, _ = weight_dtypes(j)
    return render(
        "train_hf.py.j2",
        cfg=cfg,
        j=j,
        t=t,
        step_time_s=step_time_s,
        modules=modules,
        fused=fused,
        ranks=ranks,
        dtype=str(base_dtype).removeprefix("torch."),
        compute={"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[j.compute_dtype],
        attention=attention_kernel(spec.config, j),
        every=save_steps(cfg, step_time_s),
        schedule=HF_SCHEDULE[t.schedule],
        optim=HF_OPTIM[j.optimizer],
        minutes=(cfg.plan.checkpoint_interval_min if cfg.plan else None) or DEFAULT_CHECKPOINT_MIN,
    )


def _adapters(config: dict[str, Any], j: TrainJob) -> tuple[Any, list[str], dict[str, int]]:
    """The adapters of frugal's step, as PEFT names them: the linear layers (all-linear as
    PEFT reads it, for a dense model), and a MoE model's expert stacks with their rank
    (`step.moe.adapter_targets`, on a shallow copy: the names repeat in every layer)."""
    if j.method == "full" or not is_moe_config(config):
        return j.target_modules, [], {}
    from frugal.estimate.simulate import shallow_depths
    from frugal.step.model import build_model
    from frugal.step.moe import adapter_targets

    full = j.model_copy(update={"method": "full"})
    model = build_model(config, full, "meta", n_layers=shallow_depths(config)[1])
    modules, fused = adapter_targets(model, config, j.target_modules, j.method == "lora")
    return modules, fused, {re.escape(name): j.expert_rank(config) for name in fused}


def render(template: str, **values: Any) -> str:
    """An emitted file from its template in plan/templates (Jinja2; `py` writes a value as
    Python source)."""
    return _templates().get_template(template).render(**values)


@cache
def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("frugal.plan", "templates"),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # Python and shell, not HTML
    )
    env.filters["py"] = repr
    return env


def _resources(offer: Offer, spot: bool) -> dict[str, Any]:
    """SkyPilot resources of an offer: accelerators, spot with job recovery, cloud, region."""
    resources: dict[str, Any] = {
        "accelerators": f"{to_skypilot(offer.gpu.name)}:{offer.gpus}",
        "use_spot": bool(spot),
    }
    if offer.provider in CLOUDS:
        resources["cloud"] = offer.provider
    if offer.region and offer.provider != "vast":
        resources["region"] = offer.region
    if spot:
        resources["job_recovery"] = {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 3}
    return resources


BUCKET = "/checkpoints"  # where SkyPilot mounts the checkpoint bucket, on every node
SKYPILOT_NODES = (
    '--nnodes "$SKYPILOT_NUM_NODES" --node-rank "$SKYPILOT_NODE_RANK" '
    '--master-addr "$(echo "$SKYPILOT_NODE_IPS" | head -n1)" --master-port 29500'
)  # the head node is the first of SKYPILOT_NODE_IPS


CONFIG_MOUNT = "~/frugal-config"  # where a run config outside the synced workdir goes


def on_the_vm(run_config: str) -> tuple[str, dict[str, str]]:
    """The run config as a SkyPilot VM sees it, quoted for its shell, and the file mount it
    needs: a path inside the working directory (relative, not climbing out of it) is synced
    with it; any other (`--write /elsewhere/run.yaml`) is mounted into CONFIG_MOUNT, since
    the VM has no such path of this machine."""
    path = Path(run_config)
    if not path.is_absolute() and ".." not in path.parts:
        return shlex.quote(path.as_posix()), {}
    remote = f"{CONFIG_MOUNT}/{path.name}"
    return f"{CONFIG_MOUNT}/{shlex.quote(path.name)}", {remote: str(path.resolve())}


def skypilot_task(plan: Plan, run_config: str) -> str:
    """A SkyPilot task YAML: resources, spot with job recovery, a checkpoint bucket mount,
    and frugal installed from the synced working directory with the extras the plan needs.
    On several nodes every node runs the same line, which joins them into one job at the
    head node's rendezvous, all writing the one checkpoint bucket."""
    package = ".[train]" if needs_bitsandbytes(plan.job) else "."
    config, mounts = on_the_vm(run_config)
    run = f"frugal train {config} output_dir={BUCKET} --resume auto"
    if plan.nodes > 1:
        run = f"{run} {SKYPILOT_NODES}"
    task: dict[str, Any] = {
        "name": "frugal-train",
        "resources": _resources(plan.offer, plan.spot),
        "num_nodes": plan.nodes,
        "file_mounts": {BUCKET: {"name": "frugal-checkpoints", "mode": "MOUNT"}, **mounts},
        "workdir": ".",  # this checkout of frugal, with the run config, synced to the VM
        "setup": f"pip install '{package}'",
        "run": run,
    }
    return "# SkyPilot task written by frugal plan\n" + yaml.safe_dump(task, sort_keys=False)


SIGNAL_BEFORE_S = 300  # Slurm's SIGTERM this long before the time limit: time to checkpoint


def slurm_script(plan: Plan, run_config: str) -> str:
    """An sbatch script for the plan: its nodes, GPUs a node, and a time limit of the
    plan's hours with a quarter more and the checkpoint's notice; one task a node (frugal
    starts a process per GPU). Slurm sends SIGTERM SIGNAL_BEFORE_S before the limit, so the
    run checkpoints and exits 75; that exit (and a preemption) requeues the job, which
    resumes from its checkpoint. The run config's output_dir must be on storage every node
    shares (frugal train checks)."""
    minutes = math.ceil(plan.hours * 60 * 1.25 + SIGNAL_BEFORE_S / 60)
    limit = f"{minutes // 1440}-{minutes % 1440 // 60:02d}:{minutes % 60:02d}:00"
    lines = [
        "#!/bin/bash",
        f"# Slurm job written by frugal plan: {plan.label()}, {plan.hours:.2f} h planned",
        "#SBATCH --job-name=frugal-train",
        f"#SBATCH --nodes={plan.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={plan.offer.gpus}",
        f"#SBATCH --time={limit}",
        f"#SBATCH --signal=TERM@{SIGNAL_BEFORE_S}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --output=frugal-train-%j.out",
        "set -uo pipefail",
        "# the rendezvous port, from the job id: two jobs on one head node do not collide",
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        f"srun --kill-on-bad-exit=0 frugal train {shlex.quote(run_config)} --resume auto",
        "rc=$?",
        "if [ $rc -eq 75 ]; then  # stopped with a checkpoint (time limit, preemption): again",
        '  scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        "exit $rc",
    ]
    return "\n".join(lines) + "\n"


def torchrun_lines(plan: Plan, run_config: str, path: str) -> str:
    """The command each of the plan's nodes runs, on machines of the user's own: frugal
    train is its own torchrun (one process a GPU, the c10d rendezvous at the head node)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# frugal plan: {plan.label()}, {plan.nodes} node(s) of {plan.offer.gpus} GPUs;",
        "# run on every node, giving its rank (0 is the head) and the head's address:",
    ]
    for r in range(plan.nodes):
        lines.append(
            f"#   bash {shlex.quote(path)} {r} HEAD_ADDRESS" + ("   (the head)" if r == 0 else "")
        )
    lines += [
        "set -euo pipefail",
        f"exec frugal train {shlex.quote(run_config)} --resume auto --nnodes {plan.nodes} "
        '--node-rank "$1" --master-addr "$2" --master-port "${MASTER_PORT:-29500}"',
    ]
    return "\n".join(lines) + "\n"


def skypilot_jobs_task(vm: VM, configs: dict[str, str], name: str) -> str:
    """One SkyPilot task for a shared VM: its jobs one after another, each in its own output
    dir on the checkpoint bucket. A restart after preemption runs the same script: a job that
    finished (its run_summary.json is there) is skipped, the one that was running resumes
    from its last checkpoint, the rest follow."""
    steps, mounts = [], {}
    for r in vm.runs:
        out = shlex.quote(f"{BUCKET}/{r.job}")
        nodes = f" {SKYPILOT_NODES}" if vm.nodes > 1 else ""
        config, mount = on_the_vm(configs[r.job])
        mounts.update(mount)
        steps.append(
            f"if [ ! -f {out}/run_summary.json ]; then\n"
            f"  frugal train {config} output_dir={out} --resume auto{nodes}\n"
            "fi"
        )
    package = ".[train]" if any(needs_bitsandbytes(r.plan.job) for r in vm.runs) else "."
    task: dict[str, Any] = {
        "name": name,
        "resources": _resources(vm.offer, vm.spot),
        "num_nodes": vm.nodes,
        "file_mounts": {BUCKET: {"name": "frugal-checkpoints", "mode": "MOUNT"}, **mounts},
        "workdir": ".",
        "setup": f"pip install '{package}'",
        "run": "set -e\n" + "\n".join(steps) + "\n",
    }
    jobs = ", ".join(r.job for r in vm.runs)
    head = f"# SkyPilot task written by frugal plan --jobs: {jobs}, in this order\n"
    return head + yaml.safe_dump(task, sort_keys=False)


MODAL_TIMEOUT_S = 24 * 3600  # the longest one attempt of a Modal function may run


def modal_app(plan: Plan, run_config: str) -> str:
    """A Modal app that runs `frugal train` on the plan's GPUs in one container: this
    checkout of frugal installed into the image with the run config, a persistent Volume for
    the run directory, and retries that resume from the last checkpoint (Modal restarts a
    preempted GPU function on the same input; an attempt is cut at 24 h)."""
    if plan.offer.provider != "modal":
        raise FrugalError(
            f"--emit modal: the plan is priced on {plan.offer.provider} "
            f"({plan.offer.instance}), not on Modal: plan with --providers modal for a Modal "
            "app of a run Modal prices"
        )
    found = modal_gpu(plan.offer.gpu)
    if found is None:
        raise FrugalError(
            f"--emit modal: Modal has no {plan.offer.gpu.name}, the plan's GPU: plan with "
            "--providers modal"
        )
    name, most = found
    if plan.nodes > 1 or plan.gpus > most:
        raise FrugalError(
            f"--emit modal: one Modal container takes at most {most}x {plan.offer.gpu.name}; "
            f"the plan needs {plan.gpus} on {plan.nodes} machine(s): plan with --providers modal"
        )
    return render(
        "modal_app.py.j2",
        plan=plan,
        run_config=run_config,
        config=Path(run_config).name,
        gpu=f"{name}:{plan.gpus}",
        extras="[train]" if needs_bitsandbytes(plan.job) else "",
        cores=MODAL_CORES_PER_GPU * plan.gpus,
        memory_mib=int(MODAL_GIB_PER_GPU * plan.gpus * 1024),
        timeout_s=MODAL_TIMEOUT_S,
        attempts=math.ceil(plan.hours * 3600 / MODAL_TIMEOUT_S) + 2,  # a cut each day, 2 spare
    )
