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
from conftest import run_json, skypilot_validator

from frugal.hardware.offers import catalog
from frugal.models.specs import ModelSpec
from frugal.plan.emit import hf_script, save_steps, skypilot_task, to_run_config
from frugal.plan.search import Constraints, search
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
