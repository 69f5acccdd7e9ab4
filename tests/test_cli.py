"""The `frugal` command line: JSON output, one-line errors with exit code 2, lazy torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_error, run_json

from frugal.cli import estimate_cmd
from frugal.cli.main import main
from frugal.hardware.gpus import MARGIN
from frugal.models import specs

ESTIMATE_KEYS = {
    "peak_allocated_gib",
    "peak_reserved_gib",
    "device_total_gib",
    "breakdown_gib",
    "trainable_params",
    "total_params",
    "flops_per_step",
    "tokens_per_step",
}
FIT_KEYS = {"fits", "max_batch", "max_seq", "budget_gib", "headroom_gib"}


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(specs, "_from_hub", lambda model_id: None)


def _subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["FRUGAL_CACHE_DIR"] = os.environ["FRUGAL_CACHE_DIR"]
    env["HF_HUB_OFFLINE"] = "1"
    return env


# -- estimate --json ----------------------------------------------------------------------


@pytest.mark.slow
def test_estimate_json(capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path) -> None:
    d = run_json(capsys, "estimate", str(tiny_llama_dir), "--seq", "128", "--json")
    assert set(d) >= ESTIMATE_KEYS
    assert not FIT_KEYS & set(d)  # no GPU given: no fit
    assert 0 < d["peak_allocated_gib"] <= d["peak_reserved_gib"] <= d["device_total_gib"]
    assert sum(d["breakdown_gib"].values()) == pytest.approx(d["device_total_gib"], abs=0.01)
    assert d["tokens_per_step"] == 128
    assert 0 < d["trainable_params"] < d["total_params"]
    f = d["flops_per_step"]
    assert f["total"] == pytest.approx(f["forward"] + f["backward"] + f["recompute"], rel=1e-4)
    assert d["job"]["method"] == "lora" and d["job"]["seq"] == 128
    assert d["warnings"] == []


@pytest.mark.slow
def test_estimate_json_with_gpu_memory(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path
) -> None:
    path = str(tiny_llama_dir)
    d = run_json(capsys, "estimate", path, "--seq", "128", "--gpu-memory", "24", "--json")
    assert set(d) >= ESTIMATE_KEYS | FIT_KEYS
    assert d["fits"] is True
    assert d["gpu_memory_gib"] == 24
    # the step may use all but the margin that plan and train's micro-batch also keep
    assert d["budget_gib"] == pytest.approx(24 * (1 - MARGIN), abs=0.01)
    assert d["headroom_gib"] == pytest.approx(d["budget_gib"] - d["device_total_gib"], abs=0.01)
    assert d["max_seq"] == 512  # a tiny model fits up to its positions
    mb = d["max_batch"]
    assert isinstance(mb, int) and 1 <= mb < 1 << 16
    # max_batch is the boundary: it fits, one more does not
    at = run_json(
        capsys, "estimate", path, "--seq", "128", "--batch", str(mb), "--gpu-memory", "24", "--json"
    )
    over = run_json(
        capsys,
        "estimate",
        path,
        "--seq",
        "128",
        "--batch",
        str(mb + 1),
        "--gpu-memory",
        "24",
        "--json",
    )
    assert at["fits"] is True and at["device_total_gib"] <= at["budget_gib"]
    assert over["fits"] is False and over["device_total_gib"] > over["budget_gib"] - 0.001


@pytest.mark.slow
def test_estimate_with_named_gpu(capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path) -> None:
    d = run_json(capsys, "estimate", str(tiny_llama_dir), "--seq", "128", "--gpu", "H100", "--json")
    assert d["gpu"] == "H100 SXM"
    assert d["gpu_memory_gib"] == pytest.approx(81559 / 1024, abs=0.01)
    assert d["fits"] is True
    # the plan's throughput model answers for the named GPU: tokens/s is tokens per step / time
    assert d["step_time_s"] > 0
    assert d["tokens_per_s"] == pytest.approx(d["tokens_per_step"] / d["step_time_s"], rel=1e-3)
    big = ["estimate", "HuggingFaceTB/SmolLM2-135M", "--seq", "1024", "--batch", "16", "--json"]
    fast = run_json(capsys, *big, "--gpu", "H100")
    slow = run_json(capsys, *big, "--gpu", "T4", "--precision", "fp16-mixed")
    assert slow["step_time_s"] > 1.5 * fast["step_time_s"]
    bare = run_json(
        capsys, "estimate", str(tiny_llama_dir), "--seq", "128", "--gpu-memory", "80", "--json"
    )
    assert "step_time_s" not in bare and "tokens_per_s" not in bare


def test_seq_beyond_positions_warns(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path
) -> None:
    d = run_json(capsys, "estimate", str(tiny_llama_dir), "--seq", "600", "--json")
    assert len(d["warnings"]) == 1
    assert "--seq 600" in d["warnings"][0] and "512 positions" in d["warnings"][0]


def test_human_output(capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path) -> None:
    rc = main(["estimate", str(tiny_llama_dir), "--seq", "128", "--gpu-memory", "24"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "peak allocated" in out and "fits" in out
    assert "FLOPs per step" in out


# -- bad inputs: exit 2, one line ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nosuch/model"], "unknown model 'nosuch/model'"),
        (["no-such-model-anywhere"], "unknown model"),
        (["{tiny}", "--lora-r", "0"], "--lora-r"),
        (["{tiny}", "--method", "qlora-x"], "--method"),
        (["{tiny}", "--method", "full", "--lora-r", "8"], "--lora-r applies to --method lora"),
        (["{tiny}", "--batch", "0"], "'--batch': 0: give a whole number from 1 to 65,536"),
        (["{tiny}", "--batch", "x"], "--batch"),
        (["{tiny}", "--seq", "0"], "'--seq': 0: give a whole number from 1"),
        (["{tiny}", "--gpu", "nosuchgpu"], "unknown GPU 'nosuchgpu'"),
        (["{tiny}", "--gpu", "t4"], "--precision fp16-mixed"),
        (["{tiny}", "--gpu", "h100", "--gpu-memory", "80"], "not both"),
        (["{tiny}", "--gpu-memory", "-1"], "--gpu-memory"),
        (["{corrupt}"], "not valid JSON"),
    ],
)
def test_bad_input(
    capsys: pytest.CaptureFixture[str],
    tiny_llama_dir: Path,
    tmp_path: Path,
    args: list[str],
    needle: str,
) -> None:
    corrupt = tmp_path / "config.json"
    corrupt.write_text('{"model_type": ')
    argv = [a.format(tiny=tiny_llama_dir, corrupt=corrupt) for a in args]
    line = run_error(capsys, "estimate", "--seq", "128", "--json", *argv)
    assert needle in line


@pytest.mark.slow
def test_fp16_on_t4_is_accepted(capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path) -> None:
    d = run_json(
        capsys,
        "estimate",
        str(tiny_llama_dir),
        "--seq",
        "128",
        "--gpu",
        "t4",
        "--precision",
        "fp16-mixed",
        "--json",
    )
    assert d["gpu"] == "T4" and d["fits"] is True


@pytest.mark.slow
def test_estimate_passes_every_step_option_to_the_job(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path
) -> None:
    """`frugal estimate` names its options as TrainJob's fields and hands them over by
    name: each one given reaches the estimated job."""
    given = {"method": "qlora", "optimizer": "sgd", "lora_r": 4, "lora_alpha": 8,
             "lora_dropout": 0.1, "batch": 3, "seq": 64, "grad_accum": 2,
             "grad_checkpointing": True, "packing": False, "loss_chunks": 2,
             "offload_activations": True}  # fmt: skip
    argv = []
    for k, v in given.items():
        flag = "--" + k.replace("_", "-")
        argv += [flag] if v is True else [f"--no-{flag[2:]}"] if v is False else [flag, str(v)]
    d = run_json(capsys, "estimate", str(tiny_llama_dir), *argv, "--json")
    assert {k: d["job"][k] for k in given} == given


def test_internal_error_is_one_line_exit_1(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*a: object, **k: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(estimate_cmd, "make_estimate", broken)
    rc = main(["estimate", str(tiny_llama_dir), "--seq", "128", "--json"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert out == ""
    assert "Traceback" not in err
    assert err.strip().startswith("internal error (RuntimeError: boom)")
    assert len(err.strip().splitlines()) == 1


def test_no_args_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert main(["estimate", "--help"]) == 0
    out, _ = capsys.readouterr()
    assert "--lora-r" in out and "--gpu-memory" in out


# -- models -------------------------------------------------------------------------------


def test_models_json(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys, "models", "--json")
    rows = d["models"]
    assert len(rows) >= 30
    ids = {r["id"] for r in rows}
    assert "meta-llama/Llama-3.1-8B" in ids and "mistralai/Mixtral-8x7B-v0.1" in ids
    llama = next(r for r in rows if r["id"] == "meta-llama/Llama-3.1-8B")
    assert (llama["type"], llama["layers"], llama["hidden"], llama["vocab"]) == (
        "llama",
        32,
        4096,
        128256,
    )
    assert llama["params"] == 8030261248
    mixtral = next(r for r in rows if r["id"] == "mistralai/Mixtral-8x7B-v0.1")
    assert mixtral["experts"] == 8


# -- torch stays out of the light paths ---------------------------------------------------


def _python(code: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_subprocess_env(),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_cli_import_does_not_import_torch() -> None:
    code = (
        "import sys; from frugal.cli.main import app; import frugal.estimate.core; "
        "print('torch' in sys.modules)"
    )
    assert _python(code) == "False"


def test_cached_estimate_does_not_import_torch(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path
) -> None:
    path = str(tiny_llama_dir)
    run_json(capsys, "estimate", path, "--json")  # fills the profile cache (seq 2048, lora)
    code = (
        "import sys; from frugal.cli.main import main; "
        f"rc = main(['estimate', {path!r}, '--batch', '3', '--json']); "
        "print(rc, 'torch' in sys.modules)"
    )
    assert _python(code) == "0 False"


@pytest.mark.slow
def test_cached_plan_does_not_import_torch(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path
) -> None:
    path = str(tiny_llama_dir)
    args = [path, "--tokens", "1M", "--methods", "lora", "--providers", "lambda", "--json"]
    run_json(capsys, "plan", *args)  # fills the profile cache
    code = (
        "import sys; from frugal.cli.main import main; "
        f"rc = main(['plan', *{args!r}]); "
        "print(rc, 'torch' in sys.modules)"
    )
    assert _python(code) == "0 False"


def test_models_does_not_import_torch() -> None:
    code = (
        "import sys; from frugal.cli.main import main; rc = main(['models', '--json']); "
        "print(rc, 'torch' in sys.modules)"
    )
    assert _python(code) == "0 False"


@pytest.mark.slow
def test_console_script_exits_fast_without_losing_output(tiny_llama_dir: Path) -> None:
    """`run()` leaves through os._exit once torch is loaded: output and exit code survive."""
    env = {**_subprocess_env(), "FRUGAL_CACHE_DIR": str(tiny_llama_dir / "fresh-cache")}
    cmd = [sys.executable, "-m", "frugal.cli.main", "estimate", str(tiny_llama_dir)]
    ok = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["trainable_params"] > 0
    bad = subprocess.run(
        [*cmd, "--lora-r", "0"], capture_output=True, text=True, env=env, timeout=120
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("error:") and len(bad.stderr.strip().splitlines()) == 1


def test_an_unknown_gpu_offers_what_the_command_takes(capsys: pytest.CaptureFixture[str]) -> None:
    serve = run_error(capsys, "serve", "estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H1000",
                      "--input-len", "10", "--output-len", "10", "--rate", "1")  # fmt: skip
    assert "closest:" in serve and "H200" in serve and "frugal gpus" in serve
    assert "--gpu-memory" not in serve  # serve estimate has no such option
    est = run_error(capsys, "estimate", "meta-llama/Llama-3.1-8B", "--gpu", "RTX 4909")
    assert "closest: RTX 4090" in est and "or pass --gpu-memory GIB" in est


def test_a_usage_error_names_the_whole_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_error(capsys, "budget", "set", "--amount", "5").endswith(
        "(see: frugal budget set --help)"
    )
    assert "(see: frugal serve estimate --help)" in run_error(capsys, "serve", "estimate")
