"""What `frugal serve plan --emit vllm|skypilot` hands on: `vllm serve` arguments that vLLM's
own parser takes (checked here against its flag names and accepted values, copied from its
source below, and by its parser where vllm is installed), and a SkyPilot Serve task that
SkyPilot's task, resources and service schemas and SkyServe's own rules accept."""

from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import skypilot_validator

from frugal.errors import FrugalError
from frugal.hardware.gpus import gpus
from frugal.hardware.skypilot import to_skypilot
from frugal.serve.emit import (
    VLLM_LORA_RANKS,
    Launch,
    adapter_dir,
    adapter_rank,
    skypilot_serve_task,
    vllm_args,
    vllm_command,
    vllm_lora_rank,
)

# -- vLLM's vocabulary, copied from vLLM 0.33.0 (Apache-2.0; the release wheel's source) ----

# option strings of `vllm serve` that frugal writes: vllm/engine/arg_utils.py
# EngineArgs.add_cli_args ("--tensor-parallel-size", "--max-model-len", "--quantization", ...)
# and vllm/entrypoints/common/cli_args.py FrontendArgs.add_cli_args (--host, --port,
# --lora-modules: `f"--{key.replace('_', '-')}"` of the dataclass fields)
VLLM_FLAGS = {
    "--tensor-parallel-size", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens",
    "--gpu-memory-utilization", "--dtype", "--quantization", "--kv-cache-dtype", "--tokenizer",
    "--served-model-name", "--enable-lora", "--lora-modules", "--max-lora-rank", "--host",
    "--port",
}  # fmt: skip
VLLM_SWITCHES = {"--enable-lora"}  # store_true: no value follows
# vllm/config/model.py ModelDType
VLLM_DTYPES = {"auto", "half", "float16", "bfloat16", "float", "float32"}
# vllm/model_executor/layers/quantization/__init__.py QuantizationMethods, and "bitsandbytes",
# which vllm-bnb-plugin registers (vllm_bnb_plugin/__init__.py register_quantization_config)
VLLM_QUANTIZATION = {
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4",
    "modelopt_mxfp8", "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin",
    "humming", "compressed-tensors", "experts_int8", "quark", "moe_wna16", "torchao", "inc",
    "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online", "fp8_per_tensor", "fp8_per_block",
    "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8",
    "bitsandbytes",
}  # fmt: skip
# vllm/config/cache.py CacheDType (the ones a plan can ask for)
VLLM_KV_DTYPES = {"auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"}
# vllm/config/lora.py MaxLoRARanks
VLLM_MAX_LORA_RANKS = {1, 8, 16, 32, 64, 128, 256, 320, 512}

LLAMA = "meta-llama/Llama-3.1-8B"


def _adapter(root: Path, r: Any = 12, **extra: Any) -> Path:
    """A PEFT-style adapter as `frugal train` leaves it: OUTPUT_DIR/final/adapter_config.json."""
    final = root / "final"
    final.mkdir(parents=True)
    cfg = {"peft_type": "LORA", "base_model_name_or_path": LLAMA, "lora_alpha": 32, **extra}
    if r is not None:
        cfg["r"] = r
    (final / "adapter_config.json").write_text(json.dumps(cfg))
    (final / "adapter_model.safetensors").write_bytes(b"")
    return root


def _deploy(**kw: Any) -> Launch:
    base: dict[str, Any] = {
        "model": LLAMA, "gpu": "H100 SXM", "max_model_len": 8192, "max_num_seqs": 256,
    }  # fmt: skip
    return Launch(**{**base, **kw})


def _check_vllm_args(args: list[str]) -> dict[str, str]:
    """Every flag is one of vLLM's, every value one it accepts; the flags and their values."""
    seen: dict[str, str] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag in VLLM_FLAGS, f"{flag} is not a `vllm serve` flag"
        assert flag not in seen, f"{flag} given twice"
        if flag in VLLM_SWITCHES:
            seen[flag], i = "", i + 1
            continue
        value = args[i + 1]
        assert not value.startswith("--"), f"{flag} has no value"
        seen[flag], i = value, i + 2
    for flag in ("--tensor-parallel-size", "--max-model-len", "--max-num-seqs", "--port",
                 "--max-num-batched-tokens"):  # fmt: skip
        if flag in seen:
            assert int(seen[flag]) >= 1
    assert 0 < float(seen["--gpu-memory-utilization"]) <= 1
    assert seen.get("--dtype", "auto") in VLLM_DTYPES
    assert seen.get("--quantization", "awq") in VLLM_QUANTIZATION
    assert seen.get("--kv-cache-dtype", "auto") in VLLM_KV_DTYPES
    if "--lora-modules" in seen or "--max-lora-rank" in seen or "--enable-lora" in seen:
        assert {"--lora-modules", "--max-lora-rank", "--enable-lora"} <= seen.keys()
        assert int(seen["--max-lora-rank"]) in VLLM_MAX_LORA_RANKS
    return seen


# -- the vLLM arguments -------------------------------------------------------------------


def test_vllm_args_pinned(tmp_path: Path) -> None:
    common = ["--max-model-len", "8192", "--max-num-seqs", "256"]
    bf16 = vllm_args(_deploy())
    assert bf16 == ["--tensor-parallel-size", "1", *common,
                    "--gpu-memory-utilization", "0.9", "--dtype", "bfloat16"]  # fmt: skip

    fp8 = vllm_args(_deploy(quant="fp8", kv_dtype="fp8", max_num_batched_tokens=8192,
                            gpu_memory_utilization=0.92))  # fmt: skip
    assert fp8 == ["--tensor-parallel-size", "1", *common, "--max-num-batched-tokens", "8192",
                   "--gpu-memory-utilization", "0.92", "--quantization", "fp8",
                   "--kv-cache-dtype", "fp8"]  # fmt: skip

    awq = _deploy(model="hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", gpu="A100 80GB",
                  gpus_per_replica=2, quant="awq")  # fmt: skip
    assert vllm_args(awq) == ["--tensor-parallel-size", "2", *common,
                              "--gpu-memory-utilization", "0.9",
                              "--quantization", "awq_marlin"]  # fmt: skip
    # before Ampere (no bf16) older vLLMs run no Marlin kernel and refuse the name
    t4 = _deploy(model="x/llama-gptq", gpu="T4", quant="gptq", max_num_seqs=16)
    assert vllm_args(t4)[-2:] == ["--quantization", "gptq"]

    run = _adapter(tmp_path / "my-run", r=12)  # rank 12 -> vLLM's next allowed rank, 16
    lora = vllm_args(_deploy(adapter=run))
    assert lora[-5:] == ["--enable-lora", "--lora-modules", f"my-run={run / 'final'}",
                         "--max-lora-rank", "16"]  # fmt: skip
    # the run's output dir or the adapter dir itself
    assert vllm_args(_deploy(adapter=run / "final")) == lora


def test_vllm_args_other_formats() -> None:
    assert vllm_args(_deploy(quant="fp16"))[-2:] == ["--dtype", "float16"]
    assert vllm_args(_deploy(gpu="RTX 4090", quant="nf4"))[-2:] == [
        "--quantization", "bitsandbytes",
    ]  # fmt: skip
    gguf = _deploy(model="Qwen/Qwen3-0.6B", weights="unsloth/Qwen3-0.6B-GGUF:Q4_K_M",
                   gpu="L4", quant="gguf-q4_k_m", port=8080)  # fmt: skip
    argv = shlex.split(vllm_command(gguf))
    assert argv[:3] == ["vllm", "serve", "unsloth/Qwen3-0.6B-GGUF:Q4_K_M"]
    seen = _check_vllm_args(argv[3:])
    # the original model's tokenizer, as vLLM's GGUF docs advise; clients ask for the model
    assert seen["--tokenizer"] == seen["--served-model-name"] == "Qwen/Qwen3-0.6B"
    assert seen["--dtype"] == "float16" and seen["--port"] == "8080"


@pytest.mark.parametrize(
    ("rank", "allowed"),
    [(1, 1), (2, 8), (8, 8), (12, 16), (16, 16), (64, 64), (65, 128), (300, 320), (512, 512)],
)
def test_lora_rank_rounds_up_to_a_rank_vllm_accepts(rank: int, allowed: int) -> None:
    assert vllm_lora_rank(rank) == allowed
    assert set(VLLM_LORA_RANKS) == VLLM_MAX_LORA_RANKS


def test_adapter_rank_counts_its_rank_pattern(tmp_path: Path) -> None:
    run = _adapter(tmp_path / "run", r=8, rank_pattern={"model.layers.0.self_attn.q_proj": 40})
    assert adapter_rank(run) == 40
    assert vllm_args(_deploy(adapter=run))[-1] == "64"


def test_every_flag_and_value_is_vllms(tmp_path: Path) -> None:
    run = _adapter(tmp_path / "run", r=64)
    comma = _adapter(tmp_path / "a,b", r=4)  # vLLM reads an item with a comma as JSON
    for d in _deployments(tmp_path):
        args = vllm_args(d)
        _check_vllm_args(args)
        argv = shlex.split(vllm_command(d))
        assert argv == ["vllm", "serve", argv[2], *args]
        if d.engine != "vllm":  # the vLLM command whatever the engine
            assert argv[:2] == ["vllm", "serve"]
    seen = _check_vllm_args(vllm_args(_deploy(adapter=comma)))
    assert json.loads(seen["--lora-modules"]) == {"name": "a-b", "path": str(comma / "final")}
    assert _check_vllm_args(vllm_args(_deploy(adapter=run)))["--max-lora-rank"] == "64"


def _deployments(tmp_path: Path) -> list[Launch]:
    run = _adapter(tmp_path / "served-run", r=12)
    model = tmp_path / "checkpoint"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    gguf = tmp_path / "Qwen3-0.6B-Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    out = [
        _deploy(),
        _deploy(quant="fp8", kv_dtype="fp8", max_num_batched_tokens=4096, adapter=run),
        _deploy(gpu="A100 80GB", gpus_per_replica=2, quant="awq", replicas=3, spot=True,
                provider="gcp", region="us-central1", target_rps_per_replica=2.5),
        _deploy(model=str(model), gpu="L40S", quant="fp16", provider="aws", region="us-east-1",
                spot=True, replicas=2, target_rps_per_replica=1.0, engine="sglang"),
        _deploy(gpu="RTX 4090", quant="nf4", provider="vast", region="US", adapter=run),
        _deploy(model="Qwen/Qwen3-0.6B", weights=str(gguf), gpu="L4", quant="gguf-q8_0",
                provider="runpod", port=8080),
        _deploy(gpu="T4", quant="gptq", provider="local", engine="trtllm"),
        _deploy(gpu="H200", gpus_per_replica=8, provider="lambda", region="us-east-1"),
        _deploy(gpu="A10G", provider="azure", region="eastus", spot=True, quant="awq"),
    ]  # fmt: skip
    return out


def test_vllms_own_parser_takes_the_arguments(tmp_path: Path) -> None:
    """Where vllm is installed: its `vllm serve` parser and pre-load checks take them all."""
    pytest.importorskip("vllm")
    try:  # vLLM 0.33's layout, then the one before it
        cli = importlib.import_module("vllm.entrypoints.common.cli_args")
    except ImportError:
        cli = importlib.import_module("vllm.entrypoints.openai.cli_args")
    try:
        argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
    except ImportError:
        argparse_utils = importlib.import_module("vllm.utils")
    parser = cli.make_arg_parser(argparse_utils.FlexibleArgumentParser())
    for d in _deployments(tmp_path):
        for line in (vllm_command(d), yaml.safe_load(skypilot_serve_task(d))["run"]):
            ns = parser.parse_args(shlex.split(line)[2:])
            cli.validate_parsed_serve_args(ns)
            assert ns.tensor_parallel_size == d.gpus_per_replica
            assert ns.max_model_len == d.max_model_len and ns.max_num_seqs == d.max_num_seqs


# -- the SkyPilot Serve task ----------------------------------------------------------------


def _check_skyserve_rules(task: dict[str, Any]) -> None:
    """What SkyServe checks beyond the schema (sky/serve/service_spec.py
    SkyServiceSpec.__init__ and from_yaml_config; sky/serve/serve_utils.py
    validate_service_task, SkyPilot 0.14.1)."""
    service = task["service"]
    assert not ("replicas" in service and "replica_policy" in service)
    policy = service.get("replica_policy")
    if policy is not None:
        if policy.get("target_qps_per_replica") is None:
            assert policy.get("max_replicas", policy["min_replicas"]) == policy["min_replicas"]
        else:
            assert policy["max_replicas"] >= policy["min_replicas"]
    assert service["readiness_probe"]["path"].startswith("/")
    ports = task["resources"]["ports"]  # one port: the service's
    assert isinstance(ports, int) and 1 <= ports <= 65535


def test_skypilot_serve_task_passes_skypilots_schemas(tmp_path: Path) -> None:
    task_schema, resources_schema = skypilot_validator("task"), skypilot_validator("resources")
    service_schema = skypilot_validator("service")
    for d in _deployments(tmp_path):
        text = skypilot_serve_task(d)
        assert text.startswith("# SkyPilot serve task written by frugal serve plan\n")
        task = yaml.safe_load(text)
        task_schema.validate(task)
        resources_schema.validate(task["resources"])
        service_schema.validate(task["service"])
        _check_skyserve_rules(task)
        r, s = task["resources"], task["service"]
        assert r["use_spot"] is d.spot and r["ports"] == d.port
        name, _, n = r["accelerators"].partition(":")
        assert int(n) == d.gpus_per_replica and " " not in name
        clouds = ("aws", "gcp", "azure", "lambda", "runpod")  # as plan/emit.py names them
        assert r.get("cloud") == (d.provider if d.provider in clouds else None)
        assert r.get("region") == (d.region or None if "cloud" in r else None)
        if d.target_rps_per_replica is None:
            assert s["replicas"] == d.replicas
        else:
            assert s["replica_policy"] == {
                "min_replicas": d.replicas, "max_replicas": 2 * d.replicas,
                "target_qps_per_replica": d.target_rps_per_replica,
            }  # fmt: skip
        # the replica runs the same arguments, listening on every interface
        argv = shlex.split(task["run"])
        assert argv[-4:] == ["--host", "0.0.0.0", "--port", str(d.port)]
        _check_vllm_args(argv[3:])
        assert task["setup"].startswith("pip install 'vllm>=")
    # the SkyPilot accelerator name of every GPU in the catalog
    for g in gpus():
        d = _deploy(gpu=g.name, quant="fp16")
        if " " in to_skypilot(g.name):  # a GPU no cloud rents (a laptop's): refused
            with pytest.raises(FrugalError, match="--emit vllm"):
                skypilot_serve_task(d)
            continue
        r = yaml.safe_load(skypilot_serve_task(d))["resources"]
        resources_schema.validate(r)
        assert r["accelerators"] == f"{to_skypilot(g.name)}:1"
    bad = yaml.safe_load(skypilot_serve_task(_deploy()))
    bad["service"]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        service_schema.validate(bad["service"])


def test_local_files_are_copied_to_each_replica(tmp_path: Path) -> None:
    deployments = _deployments(tmp_path)
    with_adapter = yaml.safe_load(skypilot_serve_task(deployments[1]))
    final = tmp_path / "served-run" / "final"
    assert with_adapter["file_mounts"] == {"/frugal/adapter": str(final)}
    assert "served-run=/frugal/adapter" in shlex.split(with_adapter["run"])
    local = yaml.safe_load(skypilot_serve_task(deployments[3]))
    assert local["file_mounts"] == {"/frugal/model": str(tmp_path / "checkpoint")}
    argv = shlex.split(local["run"])
    assert argv[2] == "/frugal/model" and argv[argv.index("--served-model-name") + 1] == (
        "checkpoint"
    )
    gguf = yaml.safe_load(skypilot_serve_task(deployments[5]))
    assert gguf["file_mounts"] == {
        "/frugal/Qwen3-0.6B-Q8_0.gguf": str(tmp_path / "Qwen3-0.6B-Q8_0.gguf")
    }
    assert gguf["setup"] == "pip install 'vllm>=0.33' vllm-gguf-plugin"
    nf4 = yaml.safe_load(skypilot_serve_task(deployments[4]))
    assert nf4["setup"].endswith(" vllm-bnb-plugin")  # bitsandbytes is out of tree in 0.33
    assert "file_mounts" not in yaml.safe_load(skypilot_serve_task(deployments[0]))


# -- what is refused, with the fix named -----------------------------------------------------


def _one_line_error(d: Launch, *words: str) -> None:
    with pytest.raises(FrugalError) as e:
        vllm_command(d)
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_bad_adapter_paths_are_refused(tmp_path: Path) -> None:
    _one_line_error(_deploy(adapter=tmp_path / "missing"), "no LoRA adapter", "final")
    (tmp_path / "empty").mkdir()
    _one_line_error(_deploy(adapter=tmp_path / "empty"), "adapter_config.json")
    _one_line_error(_deploy(adapter=_adapter(tmp_path / "no-r", r=None)), '"r"', "re-save")
    _one_line_error(_deploy(adapter=_adapter(tmp_path / "str-r", r="8")), '"r"')
    broken = _adapter(tmp_path / "broken")
    (broken / "final" / "adapter_config.json").write_text("{not json")
    _one_line_error(_deploy(adapter=broken), "cannot read")
    full = tmp_path / "full" / "final"
    full.mkdir(parents=True)
    (full / "config.json").write_text("{}")
    _one_line_error(_deploy(adapter=tmp_path / "full"), "full fine-tune", "as the model")
    _one_line_error(_deploy(adapter=_adapter(tmp_path / "huge", r=1024)), "512", "merge")
    with pytest.raises(FrugalError):
        adapter_dir(tmp_path / "missing")


def test_deployments_vllm_would_refuse_are_refused(tmp_path: Path) -> None:
    _one_line_error(_deploy(gpu="T4"), "no bf16", "fp16")
    _one_line_error(_deploy(quant="gguf-q4_k_m"), "GGUF", "Q4_K_M")
    _one_line_error(_deploy(quant="gguf-q4_k_m", weights="unsloth/X-GGUF:Q8_0"), "Q4_K_M")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _one_line_error(_deploy(model=str(plain), quant="awq"), "not a AWQ", "pre-quantized")
    awq = tmp_path / "awq"
    awq.mkdir()
    q = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    (awq / "config.json").write_text(json.dumps({"quantization_config": q}))
    _one_line_error(_deploy(model=str(awq)), "awq checkpoint")
    assert "awq_marlin" in vllm_args(_deploy(model=str(awq), quant="awq"))
    ct = tmp_path / "ct"
    ct.mkdir()
    (ct / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "compressed-tensors"}})
    )
    assert "--quantization" not in vllm_args(_deploy(model=str(ct), quant="fp8"))
    for bad in ({"replicas": 0}, {"quant": "int3"}, {"gpu_memory_utilization": 1.5},
                {"kv_dtype": "int8"}, {"port": 0}, {"target_rps_per_replica": 0.0}):  # fmt: skip
        with pytest.raises(FrugalError, match="deployment: fix"):
            _deploy(**bad)
