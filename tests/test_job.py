"""TrainJob: validation that names the flag, derived values, and the profile key."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from frugal.errors import FrugalError
from frugal.step.job import TrainJob, make_job


def _message(**kwargs: Any) -> str:
    with pytest.raises(FrugalError) as info:
        make_job(**kwargs)
    return str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "flag", "fix"),
    [
        ({"lora_r": 0}, "--lora-r 0", "a whole number from 1 to 65,536"),
        ({"method": "qlora", "lora_r": -4}, "--lora-r -4", "a whole number from 1"),
        ({"lora_alpha": 0}, "--lora-alpha 0", "above 0"),
        ({"batch": 0}, "--batch 0", "from 1"),
        ({"seq": 0}, "--seq 0", "from 1"),
        ({"seq": 2048.5}, "--seq 2048.5", "a whole number"),
        ({"seq": float("nan")}, "--seq nan", "a whole number"),
        ({"gpus": 0}, "--gpus 0", "from 1"),
        ({"grad_accum": 0}, "--grad-accum 0", "from 1"),
        ({"lora_dropout": 1.0}, "--lora-dropout 1.0", "from 0, below 1"),
        ({"lora_dropout": -0.1}, "--lora-dropout -0.1", "from 0, below 1"),
        ({"lora_dropout": float("inf")}, "--lora-dropout inf", "from 0, below 1"),
        ({"lora_targets": " , "}, "--lora-targets", "all-linear"),
        ({"method": "qlora-x"}, "--method", "'full', 'lora' or 'qlora'"),
        ({"precision": "bf16"}, "--precision", "bf16-mixed"),
        ({"optimizer": "adam"}, "--optimizer", "adamw"),
        ({"attention": "flash"}, "--attention", "sdpa"),
        ({"sharding": "tp"}, "--sharding", "fsdp"),
        ({"batch": "x"}, "--batch 'x'", "a whole number"),
    ],
)
def test_validation_names_the_flag(kwargs: dict[str, Any], flag: str, fix: str) -> None:
    msg = _message(**kwargs)
    assert flag in msg
    assert fix in msg
    assert "\n" not in msg  # one line
    assert "Value error" not in msg  # pydantic's prefix is stripped


@pytest.mark.parametrize("flag", ["lora_r", "lora_alpha", "lora_targets", "lora_dropout"])
def test_lora_flags_rejected_for_full(flag: str) -> None:
    value = {"lora_r": 8, "lora_alpha": 16, "lora_targets": "q_proj", "lora_dropout": 0.1}[flag]
    msg = _message(method="full", **{flag: value})
    assert msg.startswith("--" + flag.replace("_", "-") + " applies to --method lora or qlora")


def test_full_ignores_lora_defaults() -> None:
    job = make_job(method="full", lora_r=None, lora_alpha=None)
    assert job.method == "full"
    # a rank is a rank whatever the method: 0 means nothing, for full fine-tuning too
    with pytest.raises(ValidationError):
        TrainJob(method="full", lora_r=0)


def test_none_means_default() -> None:
    job = make_job(method=None, lora_r=None, batch=None, seq=None)
    assert job == TrainJob()
    assert (job.method, job.lora_r, job.batch, job.seq) == ("lora", 16, 1, 2048)


@pytest.mark.parametrize(
    ("batch", "seq", "accum", "gpus"), [(1, 2048, 1, 1), (4, 512, 8, 2), (3, 100, 5, 7)]
)
def test_tokens_per_step(batch: int, seq: int, accum: int, gpus: int) -> None:
    job = make_job(batch=batch, seq=seq, grad_accum=accum, gpus=gpus)
    assert job.tokens_per_step == batch * seq * accum * gpus


def test_alpha() -> None:
    assert make_job().alpha == 32
    assert make_job(lora_r=8).alpha == 16
    assert make_job(lora_r=64).alpha == 128
    assert make_job(lora_r=8, lora_alpha=8).alpha == 8


@pytest.mark.parametrize(
    ("targets", "expected"),
    [
        ("all-linear", "all-linear"),
        ("all_linear", "all-linear"),
        ("  all-linear ", "all-linear"),
        ("q_proj", ["q_proj"]),
        ("q_proj,v_proj", ["q_proj", "v_proj"]),
        (" q_proj , v_proj ,, ", ["q_proj", "v_proj"]),
    ],
)
def test_target_modules(targets: str, expected: str | list[str]) -> None:
    assert make_job(lora_targets=targets).target_modules == expected


def test_compute_dtype() -> None:
    assert make_job(precision="bf16-mixed").compute_dtype == "bf16"
    assert make_job(precision="bf16-true").compute_dtype == "bf16"
    assert make_job(precision="fp16-mixed").compute_dtype == "fp16"
    assert make_job(precision="fp32").compute_dtype == "fp32"


def test_profile_key_ignores_shape_and_parallelism() -> None:
    a = make_job(batch=1, seq=128, gpus=1)
    b = make_job(batch=8, seq=4096, gpus=4, sharding="fsdp")
    assert a.profile_key() == b.profile_key()
    assert "batch" not in a.profile_key() and "seq" not in a.profile_key()
    # what changes the simulated step does change the key
    for other in (
        make_job(method="qlora"),
        make_job(lora_r=8),
        make_job(grad_checkpointing=False),
        make_job(grad_accum=2),
        make_job(precision="bf16-true"),
        make_job(optimizer="sgd"),
        make_job(attention="eager"),
    ):
        assert other.profile_key() != a.profile_key()


def test_job_is_frozen_and_strict() -> None:
    job = make_job()
    with pytest.raises(ValidationError):
        job.batch = 2
    msg = _message(batch_size=2)
    assert "--batch-size" in msg


def test_profile_key_treats_accumulation_as_one_or_more() -> None:
    # the simulation runs min(grad_accum, 2) micro-steps: 2 and 16 share one profile
    assert make_job(grad_accum=2).profile_key() == make_job(grad_accum=16).profile_key()
    assert make_job(grad_accum=1).profile_key() != make_job(grad_accum=2).profile_key()
