"""What `frugal plan --emit` hands to other tools runs there: a transformers Trainer script
that trains as written, and a SkyPilot task that SkyPilot's own schema accepts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import free_port, run_json, skypilot_validator

from frugal.errors import FrugalError
from frugal.hardware.catalog import catalog
from frugal.models.specs import ModelSpec
from frugal.plan.constraints import Constraints
from frugal.plan.emit import hf_script, save_steps, skypilot_task, to_run_config
from frugal.plan.search import search
from frugal.step.job import make_job

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny-llama"


def _script_namespace(text: str) -> dict[str, Any]:
    """Run the script's module level (what `python SCRIPT` runs before `main()`)."""
    namespace: dict[str, Any] = {"__name__": "emitted"}
    exec(compile(text, "train_hf.py", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
@pytest.mark.slow
def test_hf_script_builds_the_run_configs_hyperparameters(
    tiny_llama: ModelSpec, method: str
) -> None:
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, TrainingArguments

    k = Constraints(tokens=1e7, methods=(method,))
    plan = search(tiny_llama, make_job(method=method, seq=128), catalog(), k).recommendation
    cfg = to_run_config(tiny_llama.id, plan, k, "data.jsonl", 1e7, 2.0)
    cfg.training.learning_rate, cfg.training.schedule = 5e-5, "linear"  # not the defaults
    ns = _script_namespace(hf_script(cfg, plan.speed.step_time_s))
    args = ns["args"]
    assert isinstance(args, TrainingArguments)
    j = plan.job
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (
        j.batch,
        j.grad_accum,
    )
    assert args.learning_rate == 5e-5 and args.lr_scheduler_type.value == "linear"
    assert args.num_train_epochs == 2.0 and args.gradient_checkpointing == j.grad_checkpointing
    assert args.save_steps == save_steps(cfg, plan.speed.step_time_s) >= 1
    assert args.bf16 == j.precision.startswith("bf16")
    if method == "full":
        assert "lora_config" not in ns and ns["quantization_config"] is None
    else:
        lora = ns["lora_config"]
        assert isinstance(lora, LoraConfig) and (lora.r, lora.lora_alpha) == (j.lora_r, j.alpha)
    if method == "qlora":
        q = ns["quantization_config"]
        assert isinstance(q, BitsAndBytesConfig) and q.load_in_4bit
        assert q.bnb_4bit_quant_type == "nf4" and q.bnb_4bit_use_double_quant


MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128,
       "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
       "head_dim": 16, "vocab_size": 200, "mlp_only_layers": []}  # fmt: skip


@pytest.mark.slow
def test_a_moe_models_hf_script_adapts_what_frugals_step_adapts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script's LoRA is frugal's: the linear layers and the routed experts at their rank,
    not PEFT's renaming of them; a QLoRA plan, whose experts transformers would leave in 16
    bits, is refused."""
    import peft.utils.transformers_weight_conversion as conversion
    from peft import get_peft_model

    from frugal.models.specs import load_spec
    from frugal.step.model import adapted, build_model

    (tmp_path / "config.json").write_text(json.dumps(MOE))
    spec = load_spec(str(tmp_path))
    k = Constraints(tokens=1e7, methods=("lora",))
    plan = search(spec, make_job(method="lora", seq=128), catalog(), k).recommendation
    cfg = to_run_config(spec.id, plan, k, "data.jsonl", 1e7, 1.0)
    # the script turns PEFT's renaming off for its own process: put it back after the test
    monkeypatch.setattr(conversion, "convert_peft_config_for_transformers",
                        conversion.convert_peft_config_for_transformers)  # fmt: skip
    lora = _script_namespace(hf_script(cfg, plan.speed.step_time_s))["lora_config"]
    base = build_model(MOE, plan.job.model_copy(update={"method": "full"}), "meta")
    theirs = get_peft_model(base, lora)
    ours = build_model(MOE, plan.job, "meta")
    assert adapted(theirs) == adapted(ours)
    assert {"experts.down_proj", "experts.gate_up_proj"} <= set(adapted(ours))
    assert sum(p.numel() for p in theirs.parameters() if p.requires_grad) == sum(
        p.numel() for p in ours.parameters() if p.requires_grad
    )
    qlora = cfg.model_copy(update={"job": cfg.job.model_copy(update={"method": "qlora"})})
    with pytest.raises(FrugalError, match="experts in 16 bits"):
        hf_script(qlora, plan.speed.step_time_s)


@pytest.mark.slow
def test_emitted_hf_script_trains_as_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`plan --emit hf` on a local checkpoint and data file; `python train_hf.py` trains."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = tmp_path / "model"
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(model)
    for f in TINY.iterdir():
        if f.name != "config.json":
            shutil.copy(f, model / f.name)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i} " * 8}) + "\n" for i in range(32)))
    script = tmp_path / "train_hf.py"
    out = run_json(
        capsys, "plan", str(model), "--dataset", str(data), "--seq", "64",
        "--effective-batch", "8", "--emit", "hf", "--emit-file", str(script), "--json",
    )  # fmt: skip
    assert out["wrote_hf"] == str(script)
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "runs" / "hf").is_dir()  # the Trainer ran and saved


@pytest.mark.slow
def test_skypilot_task_passes_skypilots_schema(tiny_llama: ModelSpec) -> None:
    task_schema, resources_schema = skypilot_validator("task"), skypilot_validator("resources")
    seen = set()
    for method in ("lora", "qlora"):
        k = Constraints(tokens=1e9, methods=(method,))
        r = search(tiny_llama, make_job(method=method, seq=128), catalog(), k)
        for plan in r.plans[:40]:
            task = yaml.safe_load(skypilot_task(plan, "frugal.yaml"))
            task_schema.validate(task)
            resources_schema.validate(task["resources"])
            seen.add((plan.spot, plan.offer.provider))
            # frugal comes from the synced checkout, with bitsandbytes when the plan needs it
            assert task["workdir"] == "."
            assert task["setup"] == ("pip install '.[train]'" if method == "qlora" else
                                     "pip install '.'")  # fmt: skip
    assert {s for s, _ in seen} == {True, False}
    bad = yaml.safe_load(skypilot_task(r.recommendation, "frugal.yaml"))
    bad["resources"]["use_spot"] = "often"
    with pytest.raises(jsonschema.ValidationError):
        resources_schema.validate(bad["resources"])


@pytest.mark.parametrize(
    ("technique", "fix"),
    [({"loss_chunks": 8}, "--loss-chunks 0"), ({"offload_activations": True}, "--no-offload")],
)
def test_hf_script_refuses_what_the_trainer_cannot_run(
    tiny_llama: ModelSpec, technique: dict[str, Any], fix: str
) -> None:
    """The Trainer script has neither the chunked loss nor offloading: one line naming both
    ways out, rather than a script that runs out of memory where the plan said it fits."""
    from frugal.errors import FrugalError

    k = Constraints(tokens=1e7)
    plan = search(tiny_llama, make_job(seq=128), catalog(), k).recommendation
    cfg = to_run_config(tiny_llama.id, plan, k, "data.jsonl", 1e7, 2.0)
    cfg = cfg.model_copy(update={"job": cfg.job.model_copy(update=technique)})
    with pytest.raises(FrugalError, match=f"train with `frugal train`.*{fix}"):
        hf_script(cfg, plan.speed.step_time_s)


def _two_node_plan(tiny_llama: ModelSpec) -> Any:
    """A plan of the tiny model on two nodes of one GPU each (the search places tiny jobs on
    one node; the emitters read only the plan's nodes, offer and hours)."""
    from dataclasses import replace

    r = search(tiny_llama, make_job(seq=128), catalog(), Constraints(tokens=1e7))
    rec = r.recommendation
    return replace(rec, nodes=2, offer=replace(rec.offer, gpus=1), job=rec.job.model_copy(
        update={"gpus": 2}))  # fmt: skip


def _tiny_two_gpu_config(tmp_path: Path, out: Path) -> Path:
    from conftest import make_cfg

    path = tmp_path / "run.yaml"
    make_cfg(out, "job.batch=2", "job.gpus=2", "training.max_steps=2").write(path)
    return path


def _as_two_nodes(script: str, envs: list[dict[str, str]], cwd: Path) -> list[Any]:
    """`script` run by bash on this machine once per node environment, all at once."""
    import os

    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # this frugal's `frugal`
    procs = [
        subprocess.Popen(["bash", "-c", script], cwd=cwd, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env={**os.environ, "PATH": path,
                                                      "OMP_NUM_THREADS": "1", **env})
        for env in envs
    ]  # fmt: skip
    return [(p.wait(timeout=300), *p.communicate()) for p in procs]


@pytest.mark.slow
def test_a_multi_node_skypilot_task_trains_as_one_job(
    tiny_llama: ModelSpec, tmp_path: Path
) -> None:
    """Every node of the task runs its `run` line; with SkyPilot's variables for two nodes
    on loopback, they meet at the head (the first of SKYPILOT_NODE_IPS) and train one job
    into the one checkpoint bucket."""
    from frugal.plan.emit import BUCKET

    plan = _two_node_plan(tiny_llama)
    task = yaml.safe_load(skypilot_task(plan, "run.yaml"))
    skypilot_validator("task").validate(task)
    assert task["num_nodes"] == 2 and task["resources"]["accelerators"].endswith(":1")
    bucket = tmp_path / "bucket"
    _tiny_two_gpu_config(tmp_path, bucket)
    run = task["run"].replace(BUCKET, str(bucket))  # the bucket, mounted here
    sky = {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1\n",
           "SKYPILOT_NUM_GPUS_PER_NODE": "1", "SKYPILOT_TASK_ID": tmp_path.name}  # fmt: skip
    run = run.replace("29500", str(free_port()))
    done = _as_two_nodes(run, [{**sky, "SKYPILOT_NODE_RANK": str(r)} for r in (0, 1)], tmp_path)
    assert [rc for rc, _, _ in done] == [0, 0], done[0][2][-3000:] + done[1][2][-3000:]
    assert "2 nodes (--nnodes): this is node 1" in done[1][2]
    summary = json.loads((bucket / "run_summary.json").read_text())
    assert summary["outcome"] == "completed" and summary["steps"] == 2


@pytest.mark.slow
def test_the_slurm_script_parses_and_its_srun_line_trains_two_nodes(
    tiny_llama: ModelSpec, tmp_path: Path
) -> None:
    """The sbatch script passes `bash -n`; asks for the plan's nodes and GPUs, a time limit
    with room for the checkpoint, SIGTERM before it, and a requeue on exit 75; the command
    its srun starts on each node, under Slurm's variables for two nodes, trains one job."""
    from frugal.plan.emit import SIGNAL_BEFORE_S, slurm_script

    plan = _two_node_plan(tiny_llama)
    text = slurm_script(plan, "run.yaml")
    (tmp_path / "train.sbatch").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "train.sbatch")]).returncode == 0
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --requeue",
        f"#SBATCH --signal=TERM@{SIGNAL_BEFORE_S}",
        "#SBATCH --ntasks-per-node=1",
    ):
        assert line in text.splitlines(), line  # fmt: skip
    limit = next(ln for ln in text.splitlines() if ln.startswith("#SBATCH --time="))
    days, hms = limit.split("=")[1].split("-")
    h, m, _ = (int(x) for x in hms.split(":"))
    assert (int(days) * 1440 + h * 60 + m) * 60 >= plan.hours * 3600 + SIGNAL_BEFORE_S
    assert "if [ $rc -eq 75 ]; then" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text
    srun = next(ln for ln in text.splitlines() if ln.startswith("srun "))
    command = srun.split(" ", 2)[2]  # what srun starts, once a node
    out = tmp_path / "shared"
    _tiny_two_gpu_config(tmp_path, out)
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2",
             "SLURM_JOB_NODELIST": "localhost", "MASTER_PORT": str(free_port())}  # fmt: skip
    done = _as_two_nodes(command, [{**slurm, "SLURM_NODEID": str(r)} for r in (0, 1)], tmp_path)
    assert [rc for rc, _, _ in done] == [0, 0], done[0][2][-3000:] + done[1][2][-3000:]
    assert "2 nodes (Slurm): this is node 0" in done[0][2]
    assert json.loads((out / "run_summary.json").read_text())["steps"] == 2


def test_the_torchrun_lines_say_what_each_node_runs(tiny_llama: ModelSpec, tmp_path: Path) -> None:
    from frugal.plan.emit import torchrun_lines

    text = torchrun_lines(_two_node_plan(tiny_llama), "run.yaml", "nodes.sh")
    (tmp_path / "nodes.sh").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "nodes.sh")]).returncode == 0
    assert "#   bash nodes.sh 0 HEAD_ADDRESS   (the head)" in text
    assert "#   bash nodes.sh 1 HEAD_ADDRESS" in text
    assert (
        'frugal train run.yaml --resume auto --nnodes 2 --node-rank "$1" --master-addr "$2"' in text
    )


def test_the_plan_says_how_to_launch_each_file_it_wrote(tiny_llama: ModelSpec) -> None:
    from frugal.cli.plan_cmd import EMITTED, _use

    two = _two_node_plan(tiny_llama)
    assert _use("run config", "f.yaml", two) == (
        "run it on each of the 2 nodes with: frugal train f.yaml --nnodes 2 --node-rank "
        "NODE_RANK --master-addr HEAD_ADDRESS"
    )
    one = search(tiny_llama, make_job(seq=128), catalog(), Constraints(tokens=1e7))
    assert _use("run config", "f.yaml", one.recommendation) == "run it with: frugal train f.yaml"
    assert _use("slurm", "t.sbatch", two) == "submit with: sbatch t.sbatch"
    assert _use("torchrun", "n.sh", two) == "on each node: bash n.sh NODE_RANK HEAD_ADDRESS"
    assert all(_use(what, "x", two) for what in [*EMITTED, "plot"])
    assert _use("slurm", "my job.sbatch", two) == "submit with: sbatch 'my job.sbatch'"
    assert _use("run config", "bob's.yaml", one.recommendation) == (
        "run it with: frugal train 'bob'\"'\"'s.yaml'"
    )


ODD_NAMES = ["my run.yaml", "bob's run.yaml", 'a "b" $(touch pwned) `x`.yaml', "réglage ü.yaml"]


def _argv_of(command: str, cwd: Path) -> list[str]:
    """The arguments bash gives `frugal` in `command` (frugal replaced by printf)."""
    shim = "frugal() { printf '%s\\n' \"$@\"; }; "
    shown = subprocess.run(["bash", "-c", shim + command, "bash", "0", "HEAD"], cwd=cwd,
                           capture_output=True, text=True)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.splitlines()


@pytest.mark.parametrize("name", ODD_NAMES)
def test_shell_files_pass_a_run_config_of_any_name_as_one_argument(
    tiny_llama: ModelSpec, tmp_path: Path, name: str
) -> None:
    """The sbatch script, the torchrun lines and the SkyPilot task hand `frugal train` the
    run config's name as it is: spaces, quotes, `$(...)` and non-ASCII included, and
    nothing of the name runs."""
    from frugal.plan.emit import slurm_script, torchrun_lines

    plan = _two_node_plan(tiny_llama)
    srun = next(ln for ln in slurm_script(plan, name).splitlines() if ln.startswith("srun "))
    assert _argv_of(srun.split(" ", 2)[2], tmp_path)[:2] == ["train", name]
    lines = torchrun_lines(plan, name, f"nodes {name}.sh").splitlines()
    (tmp_path / "nodes.sh").write_text("\n".join(lines) + "\n")
    assert subprocess.run(["bash", "-n", str(tmp_path / "nodes.sh")]).returncode == 0
    exec_line = next(ln for ln in lines if ln.startswith("exec frugal "))
    assert _argv_of(exec_line.removeprefix("exec "), tmp_path)[:2] == ["train", name]
    run = yaml.safe_load(skypilot_task(plan, name))["run"]
    assert _argv_of(run, tmp_path)[:2] == ["train", name]
    assert not (tmp_path / "pwned").exists()


def test_a_skypilot_task_mounts_a_run_config_outside_the_workdir(
    tiny_llama: ModelSpec, tmp_path: Path
) -> None:
    """Only the working directory is synced to the VM: a run config written elsewhere
    (`--write /elsewhere/run.yaml`, or `../run.yaml`) is mounted, and the run line names
    the mounted copy, never a path of this machine."""
    from frugal.plan.emit import CONFIG_MOUNT

    plan = search(tiny_llama, make_job(seq=128), catalog(), Constraints(tokens=1e7)).recommendation
    elsewhere = tmp_path / "else where" / "run.yaml"
    for given in (str(elsewhere), "../run.yaml"):
        task = yaml.safe_load(skypilot_task(plan, given))
        skypilot_validator("task").validate(task)
        mounted = f"{CONFIG_MOUNT}/run.yaml"
        assert task["file_mounts"][mounted] == str(Path(given).resolve())
        assert (
            task["run"].startswith(f"frugal train {mounted} ") and str(tmp_path) not in task["run"]
        )
    inside = yaml.safe_load(skypilot_task(plan, "configs/run.yaml"))
    assert list(inside["file_mounts"]) == ["/checkpoints"]  # synced with the workdir
    assert inside["run"].startswith("frugal train configs/run.yaml ")
