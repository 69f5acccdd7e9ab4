"""Where a model's architecture comes from: a bundled config, a local file, or the hub.

Only `config.json` is ever read: no weights, no tokenizer. Bundled configs live in
`configs/<org>--<name>.json` and carry a `_frugal_source` object (hub id, url, date).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from frugal.errors import FrugalError
from frugal.names import closest

SOURCE_KEY = "_frugal_source"
REQUIRED = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads")


EXPERTS_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# the keys a config names its experts per token by (gpt-oss writes both of the first two)
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk")


def is_moe_config(config: dict[str, Any]) -> bool:
    """Whether a config has routed experts (Mixtral, Qwen-MoE, DeepSeek style keys)."""
    return any(config.get(k) for k in EXPERTS_KEYS)


def routed_experts(config: dict[str, Any]) -> int:
    """Routed experts of each MoE layer (0: a dense model)."""
    return next((int(config[k]) for k in EXPERTS_KEYS if config.get(k)), 0)


def experts_per_token(config: dict[str, Any]) -> int:
    """Experts each token is routed to (1 where the config does not say)."""
    return next((int(config[k]) for k in TOP_K_KEYS if config.get(k)), 1)


@dataclass(frozen=True)
class ModelSpec:
    """A model's architecture as its Hugging Face config, reduced to the text decoder."""

    id: str
    config: dict[str, Any]  # the text decoder's config.json (no frugal keys)
    origin: str  # "bundled", "local <path>" or "hub"
    source: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def max_positions(self) -> int | None:
        v = self.config.get("max_position_embeddings")
        return int(v) if v else None

    @property
    def soft_caps_logits(self) -> bool:
        """Gemma 2's tanh cap on the logits: the chunked loss cannot run such a model."""
        return bool(self.config.get("final_logit_softcapping"))

    @property
    def sliding_window(self) -> int | None:
        """The sliding-attention window, when some layers use one."""
        w = self.config.get("sliding_window")
        if not w:
            return None
        if self.config.get("use_sliding_window") is False:
            return None
        return int(w)

    @property
    def trained_dtype(self) -> str | None:
        return self.config.get("torch_dtype") or self.config.get("dtype")

    @property
    def is_moe(self) -> bool:
        return is_moe_config(self.config)

    @property
    def num_experts(self) -> int:
        return routed_experts(self.config)


def _config_dir() -> Any:
    return resources.files("frugal.models") / "configs"


@cache
def _bundled_index() -> dict[str, str]:
    """hub id -> file name, for every bundled config."""
    out = {}
    for entry in _config_dir().iterdir():
        if entry.name.endswith(".json"):
            out[entry.name[: -len(".json")].replace("--", "/")] = entry.name
    return dict(sorted(out.items(), key=lambda kv: kv[0].lower()))


def bundled_model_ids() -> list[str]:
    return list(_bundled_index())


def read_bundled(model_id: str) -> dict[str, Any]:
    text = (_config_dir() / _bundled_index()[model_id]).read_text()
    return dict(json.loads(text))


RESOLVED_KEY = "_frugal_text_config"  # a bundled multimodal config's resolved text decoder


def resolved_text_config(inner: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config's text decoder with its config class's defaults written out
    (imports transformers)."""
    from transformers import CONFIG_MAPPING

    defaults = CONFIG_MAPPING[inner["model_type"]]().to_dict()
    # not the per-layer lists a class derives from its own default depth (Gemma 3's 26
    # layer types beside the 62 layers of the 27B): its __init__ derives them again
    derived = ("layer_types",)
    keep = {
        k: v
        for k, v in defaults.items()
        if not k.startswith("_") and v is not None and k not in derived
    }
    return dict(json.loads(json.dumps({**keep, **inner})))  # as a bundled file holds it


def bundled_text_config(raw: dict[str, Any]) -> dict[str, Any] | None:
    """What `make profiles` stores as a bundled multimodal config's `RESOLVED_KEY`: its text
    decoder resolved with the installed transformers (None: not multimodal)."""
    plain = {k: v for k, v in raw.items() if k != RESOLVED_KEY}
    cfg, notes = _text_decoder(plain, "bundled config")
    return cfg if notes else None


def _text_decoder(
    raw: dict[str, Any], where: str, resolve_defaults: bool = True
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Strip frugal keys and, for a multimodal config, keep its text decoder.

    `resolve_defaults` fills the text decoder's class defaults (imports transformers);
    listings that only show a few fields skip it.
    """
    cfg = {k: v for k, v in raw.items() if not k.startswith("_frugal")}
    notes: tuple[str, ...] = ()
    text = cfg.get("text_config")
    if isinstance(text, dict) and "model_type" in cfg and "vision_config" in cfg:
        inner = dict(text)
        inner.setdefault("model_type", f"{cfg['model_type']}_text")
        if "torch_dtype" in cfg or "dtype" in cfg:
            inner.setdefault("torch_dtype", cfg.get("torch_dtype") or cfg.get("dtype"))
        # multimodal text configs rely on their class defaults (vocab, head_dim, ...): make
        # them explicit so every reader of the spec sees the same numbers; a bundled
        # config carries them, resolved by `make profiles` (no transformers to import)
        if isinstance(raw.get(RESOLVED_KEY), dict):
            inner = dict(raw[RESOLVED_KEY])
        elif resolve_defaults:
            inner = resolved_text_config(inner)
        notes = (
            f"{cfg['model_type']} is multimodal: only its text decoder is estimated "
            "(the vision tower is left out, as in text-only fine-tuning)",
        )
        cfg = inner
    if "model_type" not in cfg:
        raise FrugalError(f"{where} has no 'model_type': pass a Hugging Face config.json")
    missing = [k for k in REQUIRED if k not in cfg and k != "num_attention_heads"]
    if missing and (resolve_defaults or not notes):
        raise FrugalError(
            f"{where} lacks {', '.join(repr(m) for m in missing)}: the file is incomplete; "
            "download the model's full config.json again"
        )
    return cfg, notes


def _load_json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise FrugalError(
            f"{path} is not valid JSON (line {e.lineno}, column {e.colno}): "
            "download the model's config.json again"
        ) from e
    except OSError as e:
        raise FrugalError(f"cannot read {path}: {e.strerror}") from e
    if not isinstance(data, dict):
        raise FrugalError(f"{path} does not hold a JSON object: pass a Hugging Face config.json")
    return data


PROBE_S = 1.0  # the one look at the hub: a model id that is not there fails in under 2 s


def offline() -> bool:
    """Whether to stay off the network: `frugal --offline` or HF_HUB_OFFLINE."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _from_hub(model_id: str) -> dict[str, Any] | None:
    """config.json of a hub model: from the local hub cache, else (when online) after one
    short probe of the hub, so that a typo or a closed network fails at once instead of
    after huggingface_hub's retries. None when it cannot be had."""
    try:
        from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache
    except ImportError:
        return None
    cached = try_to_load_from_cache(model_id, "config.json")  # the file system only
    if isinstance(cached, str):
        return _load_json_file(Path(cached))
    if offline():
        return None

    url = f"{constants.ENDPOINT}/{model_id}/resolve/main/config.json"
    try:  # plain urllib: one request, no retries (huggingface_hub's session retries)
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=PROBE_S):
            pass
    except (urllib.error.URLError, OSError, ValueError):  # absent, gated, no network, slow
        return None
    try:
        return _load_json_file(Path(hf_hub_download(model_id, "config.json")))
    except Exception:
        return None


def load_spec(name: str) -> ModelSpec:
    """Resolve a bundled hub id, a local directory or config.json, or (online) a hub id."""
    path = Path(name).expanduser()
    if path.exists():
        file = path / "config.json" if path.is_dir() else path
        if not file.exists():
            raise FrugalError(f"{path} has no config.json: pass the model's directory or file")
        cfg, notes = _text_decoder(_load_json_file(file), str(file))
        return ModelSpec(id=str(path), config=cfg, origin=f"local {file}", notes=notes)

    index = _bundled_index()
    lower = {k.lower(): k for k in index}
    short = {k.split("/", 1)[1].lower(): k for k in index}
    key = lower.get(name.lower()) or short.get(name.lower())
    if key:
        raw = read_bundled(key)
        cfg, notes = _text_decoder(raw, f"bundled config {key}")
        return ModelSpec(
            id=key, config=cfg, origin="bundled", source=raw.get("_frugal_source", {}), notes=notes
        )

    if "/" in name and not name.startswith((".", "/")):
        raw_hub = _from_hub(name)
        if raw_hub is not None:
            cfg, notes = _text_decoder(raw_hub, f"hub config {name}")
            return ModelSpec(id=name, config=cfg, origin="hub", notes=notes)
    hint = closest(name, index)
    tail = f"; closest bundled: {', '.join(hint)}" if hint else "; see `frugal models`"
    raise FrugalError(
        f"unknown model {name!r} (not bundled, not a local path, not in the hub cache"
        f"{', and offline' if offline() else ', and not on the hub or the hub not reachable'})"
        f"{tail}"
    )
