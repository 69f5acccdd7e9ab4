"""What `frugal serve plan --emit vllm|skypilot` hands on: the serving plan's decisions
(`Launch`) as a `vllm serve` command line and as a SkyPilot Serve task that runs it.

Checked against (flag names, accepted values, defaults):
- vLLM 0.33.0 (the release wheel's source, Apache-2.0): `vllm/engine/arg_utils.py`
  `EngineArgs.add_cli_args` (--tensor-parallel-size, --max-model-len, --max-num-seqs,
  --max-num-batched-tokens, --gpu-memory-utilization, --dtype, --quantization,
  --kv-cache-dtype, --tokenizer, --served-model-name, --enable-lora, --max-lora-rank) and
  `vllm/entrypoints/common/cli_args.py` (`FrontendArgs`: --host, --port, --lora-modules,
  whose `LoRAParserAction` reads NAME=PATH and takes an item holding a comma for JSON);
  `vllm/config/lora.py` `MaxLoRARanks` = 1, 8, 16, 32, 64, 128, 256, 320, 512;
  `vllm/config/model.py` `ModelDType` and `_verify_quantization`;
  `vllm/config/cache.py` `CacheDType` (holds "fp8");
  `vllm/model_executor/layers/quantization/__init__.py` `QuantizationMethods`: "awq",
  "awq_marlin", "gptq", "gptq_marlin" and "fp8" are there, "bitsandbytes" and "gguf" are
  not: both moved out of tree, to the vllm-bnb-plugin (which registers "bitsandbytes") and
  the vllm-gguf-plugin (docs/features/quantization/gguf.md).
  The arguments were parsed by that release's own `make_arg_parser` and
  `validate_parsed_serve_args`.
- SkyPilot 0.14.1 (Apache-2.0): `sky/utils/schemas.py` `get_service_schema`, kept in
  tests/data/skypilot/service.schema.json, and the rules of `sky/serve/service_spec.py`:
  `replicas` and `replica_policy` exclude each other, `target_qps_per_replica` needs
  `max_replicas`, and without it max must equal min; the service port is the one port in
  `resources.ports`; the readiness probe waits `initial_delay_seconds` (default 1200).

Formats, as vLLM serves them:
    bf16, fp16   --dtype bfloat16 | float16 (a GPU without bf16 refuses bfloat16)
    fp8          --quantization fp8: FP8 weights made on load from a 16-bit checkpoint, or
                 a checkpoint saved with quant_method "fp8" (0.33 logs that fp8_per_tensor
                 is the new name for the first use; that name refuses the second)
    awq, gptq    a pre-quantized checkpoint (vLLM cannot make one on load):
                 --quantization awq_marlin | gptq_marlin on GPUs with bf16 (Ampere and
                 later), awq | gptq on older ones. Releases with `AWQMarlinConfig`
                 (awq_marlin.py: min capability 80) run Marlin only there, read "awq" as
                 "force the slow kernel" and refuse awq_marlin elsewhere; 0.33 maps all
                 four names to one config (auto_awq.py, auto_gptq.py) that picks its kernel.
    nf4          --quantization bitsandbytes, quantized on load (plus vllm-bnb-plugin)
    gguf-*       vLLM loads `weights`, a .gguf file or HUB_REPO:QUANT (plus
                 vllm-gguf-plugin), with --tokenizer MODEL, the original model, as vLLM's
                 GGUF docs advise (converting the GGUF tokenizer is slow and unreliable),
                 and --dtype float16, as every example there has it
A local checkpoint whose config.json names another quantization than the plan is refused;
one in compressed-tensors form (llm-compressor) gets no --quantization: vLLM reads it.

`vllm_command` writes vLLM's command whatever `Launch.engine` says: the user asked for
vLLM's arguments (SGLang and TensorRT-LLM commands are not written here).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from frugal.errors import FrugalError
from frugal.hardware.gpus import lookup_gpu
from frugal.hardware.skypilot import CLOUDS, to_skypilot

Quant = Literal["bf16", "fp16", "fp8", "awq", "gptq", "nf4", "gguf-q4_k_m", "gguf-q8_0"]
EngineName = Literal["vllm", "sglang", "trtllm"]
QUANTS: tuple[str, ...] = get_args(Quant)
ENGINES: tuple[str, ...] = get_args(EngineName)

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm/config/lora.py MaxLoRARanks
VLLM_PORT = 8000  # vLLM's default --port
VLLM_REQUIREMENT = "vllm>=0.33"  # the release whose parser these arguments were checked with
PLUGINS = {
    "nf4": "vllm-bnb-plugin",
    "gguf-q4_k_m": "vllm-gguf-plugin",
    "gguf-q8_0": "vllm-gguf-plugin",
}
# what a checkpoint's config.json says (quantization_config.quant_method) for each format
CHECKPOINT_METHOD = {"fp8": "fp8", "awq": "awq", "gptq": "gptq", "nf4": "bitsandbytes"}

READINESS_PATH = "/v1/models"  # vLLM answers once the model is loaded (SkyPilot's vLLM example)
INITIAL_DELAY_S = 1800  # download, load and CUDA graphs of a large model outlast the 1200 s
REMOTE = "/frugal"  # where the task puts local files (model, .gguf, adapter) on each replica


@dataclass(frozen=True, kw_only=True)
class Launch:
    """What a serving plan hands on to launch: the model, the machines and vLLM's settings
    (`frugal.serve.deployment.Deployment` is what the plan estimated)."""

    model: str  # hub id or local path: the model the plan estimated (the tokenizer's source)
    gpu: str  # frugal GPU name, e.g. "H100 SXM"
    max_model_len: int
    max_num_seqs: int
    gpus_per_replica: int = 1  # = tensor parallel size
    replicas: int = 1
    spot: bool = False
    provider: str = ""
    region: str = ""
    engine: EngineName = "vllm"
    quant: Quant = "bf16"
    kv_dtype: Literal["auto", "fp8"] = "auto"
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = 0.9
    adapter: str | Path | None = None  # a LoRA adapter dir, or the `frugal train` output dir
    port: int = VLLM_PORT
    target_rps_per_replica: float | None = None
    weights: str | None = None  # what vLLM loads when not `model`: a .gguf file or REPO:QUANT
    # for the gguf formats, or a pre-quantized AWQ/GPTQ checkpoint of `model`

    def __post_init__(self) -> None:
        bad = []
        if self.quant not in QUANTS:
            bad.append(f"quant={self.quant!r} (one of {', '.join(QUANTS)})")
        if self.engine not in ENGINES:
            bad.append(f"engine={self.engine!r} (one of {', '.join(ENGINES)})")
        if self.kv_dtype not in ("auto", "fp8"):
            bad.append(f"kv_dtype={self.kv_dtype!r} (auto or fp8)")
        for name in ("gpus_per_replica", "replicas", "max_model_len", "max_num_seqs"):
            if getattr(self, name) < 1:
                bad.append(f"{name}={getattr(self, name)} (at least 1)")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            bad.append(f"max_num_batched_tokens={self.max_num_batched_tokens} (at least 1)")
        if not 0 < self.gpu_memory_utilization <= 1:
            bad.append(f"gpu_memory_utilization={self.gpu_memory_utilization} (in (0, 1])")
        if not 1 <= self.port <= 65535:
            bad.append(f"port={self.port} (1 to 65535)")
        if self.target_rps_per_replica is not None and self.target_rps_per_replica <= 0:
            bad.append(f"target_rps_per_replica={self.target_rps_per_replica} (above 0)")
        if bad:
            raise FrugalError(f"deployment: fix {'; '.join(bad)}")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["adapter"] = None if self.adapter is None else str(self.adapter)
        return out


# -- the LoRA adapter ---------------------------------------------------------------------


def adapter_dir(path: str | Path) -> Path:
    """The PEFT adapter directory: `path` itself, or `path/final`, where `frugal train`
    saves the adapter of a LoRA or QLoRA run (run/export.py)."""
    p = Path(path).expanduser()
    for d in (p, p / "final"):
        if (d / "adapter_config.json").is_file():
            return d
    if (p / "final" / "config.json").is_file() or (p / "config.json").is_file():
        whole = p / "final" if (p / "final" / "config.json").is_file() else p
        raise FrugalError(
            f"{whole} holds a whole model (a full fine-tune), not a LoRA adapter: serve it as "
            "the model, without an adapter"
        )
    raise FrugalError(
        f"no LoRA adapter at {p} (no adapter_config.json there or in {p / 'final'}): give the "
        "adapter directory `frugal train` wrote (OUTPUT_DIR/final) or the run's OUTPUT_DIR"
    )


def adapter_rank(path: str | Path) -> int:
    """The adapter's largest LoRA rank: its `r`, or a larger one in `rank_pattern`."""
    cfg_file = adapter_dir(path) / "adapter_config.json"
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as e:
        raise FrugalError(f"cannot read {cfg_file} ({e}): re-save the adapter with PEFT") from e
    r = cfg.get("r") if isinstance(cfg, dict) else None
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise FrugalError(
            f'{cfg_file} has no LoRA rank ("r": a positive integer): re-save the adapter with '
            "PEFT (model.save_pretrained) or add its rank"
        )
    pattern = cfg.get("rank_pattern") or {}
    return max([r, *(v for v in pattern.values() if isinstance(v, int))])


def vllm_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise FrugalError(
        f"LoRA rank {rank} is above vLLM's largest --max-lora-rank ({VLLM_LORA_RANKS[-1]}): "
        "merge the adapter into the model (training.merge=true) and serve the merged model"
    )


def adapter_name(path: Path) -> str:
    """The name clients request the adapter by: the run's directory for OUTPUT_DIR/final."""
    name = path.parent.name if path.name == "final" and path.parent.name else path.name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "adapter"


def _lora_module(name: str, path: str) -> str:
    """One --lora-modules item: NAME=PATH, or JSON where a comma would make vLLM read JSON."""
    if "," in path:
        return json.dumps({"name": name, "path": path})
    return f"{name}={path}"


# -- the vLLM command -----------------------------------------------------------------------


def _is_local(path: str) -> bool:
    return Path(path).expanduser().exists()


def _declared_quant(model: str) -> str | None:
    """The quant_method a local checkpoint's config.json names (hub ids: not looked up)."""
    cfg = Path(model).expanduser() / "config.json"
    if not cfg.is_file():
        return None
    try:
        q = json.loads(cfg.read_text()).get("quantization_config") or {}
    except (OSError, ValueError, AttributeError):
        return None
    method = q.get("quant_method") if isinstance(q, dict) else None
    return str(method).lower() if method else None


def served_weights(d: Launch) -> str:
    """What vLLM loads: `weights` where given, else the model; gguf formats need `weights`."""
    if d.quant.startswith("gguf-"):
        want = d.quant.removeprefix("gguf-").upper()
        if not d.weights:
            raise FrugalError(
                f"quant {d.quant} serves a GGUF file: give its weights (a .gguf file, or "
                f"HUB_REPO:{want} to load from the hub)"
            )
        if not d.weights.endswith(".gguf"):
            repo, _, tag = d.weights.rpartition(":")
            if not repo or tag.upper() != want:
                raise FrugalError(
                    f"weights {d.weights!r} for quant {d.quant}: give a .gguf file or "
                    f"HUB_REPO:{want}"
                )
    return d.weights or d.model


def _quant_args(d: Launch, loaded: str) -> list[str]:
    gpu = lookup_gpu(d.gpu)
    ampere = gpu is None or gpu.bf16  # unknown GPUs: assume a current one
    declared = _declared_quant(loaded)
    if declared is not None:
        expected = CHECKPOINT_METHOD.get(d.quant)
        if declared == "compressed-tensors" and expected is not None:
            return []  # vLLM reads the scheme from the checkpoint
        if declared != expected:
            raise FrugalError(
                f"{loaded} is a {declared} checkpoint, the plan serves {d.quant}: plan with "
                "the checkpoint's format, or serve the unquantized model"
            )
    elif d.quant in ("awq", "gptq") and _is_local(loaded):
        raise FrugalError(
            f"{loaded} is not a {d.quant.upper()} checkpoint (its config.json has no "
            f"quantization_config): serve a pre-quantized {d.quant.upper()} checkpoint "
            "(weights=...), or plan with fp8 or nf4, which vLLM makes on load"
        )
    if d.quant == "bf16":
        if not ampere:
            raise FrugalError(f"the {d.gpu} has no bf16: plan with quant fp16")
        return ["--dtype", "bfloat16"]
    if d.quant == "fp16":
        return ["--dtype", "float16"]
    if d.quant == "fp8":
        return ["--quantization", "fp8"]
    if d.quant in ("awq", "gptq"):
        return ["--quantization", f"{d.quant}_marlin" if ampere else d.quant]
    if d.quant == "nf4":
        return ["--quantization", "bitsandbytes"]
    return ["--dtype", "float16"]  # gguf


def _argv(d: Launch, where: dict[str, str]) -> list[str]:
    """`vllm serve` and its arguments; `where` maps local paths to where they are read."""
    loaded = served_weights(d)
    at = where.get(loaded, loaded)
    served = Path(d.model).name if _is_local(d.model) else d.model
    args = [
        "--tensor-parallel-size",
        str(d.gpus_per_replica),
        "--max-model-len",
        str(d.max_model_len),
        "--max-num-seqs",
        str(d.max_num_seqs),
    ]
    if d.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(d.max_num_batched_tokens)]
    args += ["--gpu-memory-utilization", f"{d.gpu_memory_utilization:g}"]
    args += _quant_args(d, loaded)
    if d.kv_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    if d.quant.startswith("gguf-"):
        args += ["--tokenizer", where.get(d.model, d.model)]
    if at != served:
        args += ["--served-model-name", served]
    if d.adapter is not None:
        lora = adapter_dir(d.adapter)
        rank = vllm_lora_rank(adapter_rank(lora))
        path = where.get(str(lora), str(lora))
        args += ["--enable-lora", "--lora-modules", _lora_module(adapter_name(lora), path)]
        args += ["--max-lora-rank", str(rank)]
    return ["vllm", "serve", at, *args]


def vllm_args(d: Launch) -> list[str]:
    """The arguments after `vllm serve MODEL`: parallelism, limits, memory, format, KV cache
    dtype, the LoRA adapter, and --port where it is not vLLM's 8000."""
    args = _argv(d, {})[3:]
    return [*args, "--port", str(d.port)] if d.port != VLLM_PORT else args


def vllm_command(d: Launch) -> str:
    """`vllm serve MODEL ...` as one shell line (for any `d.engine`: see the module doc)."""
    return shlex.join(["vllm", "serve", served_weights(d), *vllm_args(d)])


# -- the SkyPilot Serve task ----------------------------------------------------------------


def _mounts(d: Launch) -> dict[str, str]:
    """Local files the replicas need (model, .gguf file, tokenizer, adapter): local path ->
    path on the replica. Hub ids are downloaded there by vLLM itself."""
    out: dict[str, str] = {}
    loaded = served_weights(d)
    if _is_local(loaded):
        out[loaded] = f"{REMOTE}/{Path(loaded).name if loaded.endswith('.gguf') else 'model'}"
    if d.model != loaded and d.quant.startswith("gguf-") and _is_local(d.model):
        out[d.model] = f"{REMOTE}/tokenizer"
    if d.adapter is not None:
        out[str(adapter_dir(d.adapter))] = f"{REMOTE}/adapter"
    return out


def skypilot_serve_task(d: Launch) -> str:
    """A SkyPilot Serve task YAML (`sky serve up THIS_FILE`): replicas of `d.gpus_per_replica`
    GPUs each running `vllm serve`, a readiness probe, autoscaling to twice the replicas when
    a target rate per replica is given, and local files copied to each replica."""
    accelerator = to_skypilot(d.gpu)
    if not re.fullmatch(r"[A-Za-z0-9._-]+", accelerator):
        raise FrugalError(
            f"the {d.gpu} has no SkyPilot accelerator name (no cloud rents it): run it "
            "yourself with --emit vllm"
        )
    mounts = _mounts(d)
    argv = _argv(d, mounts)
    run = shlex.join([*argv, "--host", "0.0.0.0", "--port", str(d.port)])
    resources: dict[str, Any] = {
        "accelerators": f"{accelerator}:{d.gpus_per_replica}",
        "ports": d.port,
        "use_spot": bool(d.spot),
    }
    if d.provider in CLOUDS:  # a region only with its cloud: SkyPilot cannot guess it
        resources["cloud"] = d.provider
        if d.region:
            resources["region"] = d.region
    service: dict[str, Any] = {
        "readiness_probe": {"path": READINESS_PATH, "initial_delay_seconds": INITIAL_DELAY_S},
    }
    if d.target_rps_per_replica is not None:
        service["replica_policy"] = {
            "min_replicas": d.replicas,
            "max_replicas": 2 * d.replicas,
            "target_qps_per_replica": d.target_rps_per_replica,
        }
    else:
        service["replicas"] = d.replicas
    packages = [VLLM_REQUIREMENT, *([PLUGINS[d.quant]] if d.quant in PLUGINS else [])]
    task: dict[str, Any] = {"name": "frugal-serve", "service": service, "resources": resources}
    if mounts:
        task["file_mounts"] = {remote: local for local, remote in mounts.items()}
    task["setup"] = shlex.join(["pip", "install", *packages])
    task["run"] = run
    head = [
        "# SkyPilot serve task written by frugal serve plan",
        "# sky serve up -n NAME THIS_FILE   (a gated model: add --secret HF_TOKEN)",
    ]
    return "\n".join(head) + "\n" + yaml.safe_dump(task, sort_keys=False, width=1 << 16)
