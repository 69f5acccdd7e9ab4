"""Model specs: bundled configs, short names, local files, and errors that name the fix."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TINY_LLAMA, run_error, write_config

from frugal.errors import FrugalError
from frugal.models import specs
from frugal.models.specs import bundled_model_ids, load_spec

REQUIRED_MODELS = (
    "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B",
    "mistralai/Mixtral-8x7B-v0.1",
    "Qwen/Qwen3-30B-A3B",
    "google/gemma-3-27b-pt",
    "HuggingFaceTB/SmolLM2-135M",
    "microsoft/phi-4",
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
)


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the hub unreachable without touching the network; record what was asked."""
    asked: list[str] = []

    def fake(model_id: str) -> None:
        asked.append(model_id)
        return None

    monkeypatch.setattr(specs, "_from_hub", fake)
    return asked


def test_every_bundled_model_loads() -> None:
    from transformers import CONFIG_MAPPING

    ids = bundled_model_ids()
    assert len(ids) >= 30
    assert len(set(ids)) == len(ids)
    missing = [m for m in REQUIRED_MODELS if m not in ids]
    assert not missing, f"required bundled models missing: {missing}"
    for model_id in ids:
        spec = load_spec(model_id)
        assert spec.id == model_id
        assert spec.origin == "bundled"
        assert spec.model_type in CONFIG_MAPPING, (model_id, spec.model_type)
        assert isinstance(spec.num_layers, int) and spec.num_layers > 0, model_id
        assert spec.vocab_size > 0 and spec.hidden_size > 0, model_id
        assert not any(k.startswith("_frugal") for k in spec.config), model_id
        assert spec.source.get("hub_id") == model_id
        url = spec.source.get("url")
        assert isinstance(url, str) and url.startswith("https://"), (model_id, url)
        assert model_id in url, (model_id, url)


def test_known_bundled_shapes() -> None:
    s = load_spec("meta-llama/Llama-3.1-8B")
    assert (s.model_type, s.num_layers, s.hidden_size, s.vocab_size) == ("llama", 32, 4096, 128256)
    assert s.max_positions == 131072
    assert not s.is_moe
    assert load_spec("mistralai/Mixtral-8x7B-v0.1").is_moe
    assert load_spec("Qwen/Qwen3-30B-A3B").is_moe
    gemma3 = load_spec("google/gemma-3-27b-pt")
    # multimodal: only the text decoder is kept
    assert gemma3.model_type == "gemma3_text"
    assert gemma3.num_layers == 62
    assert any("multimodal" in n for n in gemma3.notes)


@pytest.mark.parametrize(
    "name",
    [
        "Llama-3.1-8B",
        "llama-3.1-8b",
        "LLAMA-3.1-8B",
        "META-LLAMA/llama-3.1-8b",
        "meta-llama/Llama-3.1-8B",
    ],
)
def test_short_and_case_insensitive_names(name: str, no_hub: list[str]) -> None:
    spec = load_spec(name)
    assert spec.id == "meta-llama/Llama-3.1-8B"
    assert spec.origin == "bundled"
    assert no_hub == []


def test_local_directory_and_file(tmp_path: Path) -> None:
    d = write_config(tmp_path / "tiny", TINY_LLAMA)
    by_dir = load_spec(str(d))
    by_file = load_spec(str(d / "config.json"))
    for spec in (by_dir, by_file):
        assert spec.config == TINY_LLAMA
        assert spec.origin.startswith("local ")
        assert spec.num_layers == 4 and spec.vocab_size == 512 and spec.hidden_size == 64
        assert spec.max_positions == 512
    assert by_dir.id == str(d)
    assert by_file.id == str(d / "config.json")


def test_local_config_drops_frugal_keys(tmp_path: Path) -> None:
    cfg = {**TINY_LLAMA, "_frugal_source": {"hub_id": "x/y"}}
    spec = load_spec(str(write_config(tmp_path, cfg)))
    assert spec.config == TINY_LLAMA


def _error(name: str) -> str:
    with pytest.raises(FrugalError) as info:
        load_spec(name)
    return str(info.value)


def test_corrupt_json(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text('{"model_type": "llama", ')
    msg = _error(str(p))
    assert "not valid JSON" in msg
    assert "line 1" in msg
    assert "download the model's config.json again" in msg
    # the directory holding it gives the same error
    assert "not valid JSON" in _error(str(tmp_path))


def test_json_list(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps([TINY_LLAMA]))
    msg = _error(str(p))
    assert "does not hold a JSON object" in msg
    assert "pass a Hugging Face config.json" in msg


def test_missing_hidden_size(tmp_path: Path) -> None:
    cfg = {k: v for k, v in TINY_LLAMA.items() if k != "hidden_size"}
    msg = _error(str(write_config(tmp_path, cfg)))
    assert "'hidden_size'" in msg
    assert "download the model's full config.json again" in msg


def test_missing_model_type(tmp_path: Path) -> None:
    cfg = {k: v for k, v in TINY_LLAMA.items() if k != "model_type"}
    msg = _error(str(write_config(tmp_path, cfg)))
    assert "no 'model_type'" in msg
    assert "pass a Hugging Face config.json" in msg


def test_directory_without_config(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    msg = _error(str(empty))
    assert "has no config.json" in msg
    assert "pass the model's directory or file" in msg


def test_nonexistent_directory(tmp_path: Path, no_hub: list[str]) -> None:
    msg = _error(str(tmp_path / "no-such-model-dir"))
    assert "unknown model" in msg
    assert "not a local path" in msg
    assert "frugal models" in msg  # nothing close: points at the list
    assert no_hub == []  # an absolute path is never looked up on the hub


def test_unknown_offline_id_lists_closest(no_hub: list[str]) -> None:
    msg = _error("meta-llama/Llama-3.1-9B")
    assert no_hub == ["meta-llama/Llama-3.1-9B"]
    assert "unknown model 'meta-llama/Llama-3.1-9B'" in msg
    assert "not in the hub cache, and offline" in msg  # the tests run with HF_HUB_OFFLINE=1
    hint = msg.split("closest bundled: ", 1)[1]
    names = [n.strip() for n in hint.split(",")]
    assert "meta-llama/Llama-3.1-8B" in names
    assert 1 <= len(names) <= 3
    assert all(n in bundled_model_ids() for n in names)


def test_unknown_short_name_is_not_looked_up_on_hub(no_hub: list[str]) -> None:
    msg = _error("mistral-7b")
    assert no_hub == []  # no org/name: not a hub id
    assert "mistralai/Mistral-7B-v0.1" in msg


# -- unknown hub ids: one line, at once, no retries -------------------------------------------


def _frugal(*args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    base = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_ENDPOINT")}
    start = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "frugal.cli.main", *args],
        capture_output=True, text=True, timeout=60, env={**base, **env},
    )  # fmt: skip
    return run, time.perf_counter() - start


@pytest.fixture
def silent_hub() -> Iterator[tuple[str, list[int]]]:
    """A loopback 'hub' that accepts connections and never answers (a black-holed
    network), counting the connections; no real network is touched."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        held = []
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(1)
            held.append(conn)  # never answered
        for c in held:
            c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    stop.set()
    t.join()
    server.close()


@pytest.mark.parametrize("how", ["env", "flag"])
def test_an_unknown_id_fails_at_once_offline(how: str, silent_hub: tuple[str, list[int]]) -> None:
    endpoint, accepted = silent_hub
    args = ("--offline",) if how == "flag" else ()
    env = {"HF_HUB_OFFLINE": "1"} if how == "env" else {}
    unknown = (*args, "estimate", "meta-llama/Llama-3.1-8x")
    run, took = _frugal(*unknown, HF_ENDPOINT=endpoint, **env)
    # "at once": no longer than a name that is never looked up on the hub (the same start-up),
    # give or take a loaded machine's noise; a probe of the silent hub alone would add PROBE_S
    plain, base = _frugal(*args, "estimate", "mistral-7b", HF_ENDPOINT=endpoint, **env)
    assert run.returncode == 2 and plain.returncode == 2, (run.stderr, plain.stderr)
    if took >= base + 1.5 * specs.PROBE_S:  # a pause of a loaded machine: a probe pauses twice
        took = min(took, _frugal(*unknown, HF_ENDPOINT=endpoint, **env)[1])
    assert took < base + 1.5 * specs.PROBE_S, (took, base)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "offline" in lines[0] and "meta-llama/Llama-3.1-8B" in lines[0]
    assert accepted == []  # never asked the hub


@pytest.mark.slow
def test_an_unknown_id_online_costs_one_short_probe(silent_hub: tuple[str, list[int]]) -> None:
    endpoint, accepted = silent_hub
    run, took = _frugal("estimate", "meta-llama/Llama-3.1-8x", HF_ENDPOINT=endpoint)
    # one probe's wait on top of the same start-up (a name never looked up), not retries
    plain, base = _frugal("estimate", "mistral-7b", HF_ENDPOINT=endpoint)
    assert run.returncode == 2 and plain.returncode == 2, (run.stderr, plain.stderr)
    assert len(run.stderr.strip().splitlines()) == 1 and "Retry" not in run.stderr
    assert accepted == [1]  # one probe, no retries
    if took >= base + specs.PROBE_S + 1.5:  # a pause of a loaded machine: retries pause twice
        took = min(took, _frugal("estimate", "meta-llama/Llama-3.1-8x", HF_ENDPOINT=endpoint)[1])
        assert accepted == [1, 1]
    assert took < base + specs.PROBE_S + 1.5, (took, base)


def test_an_unknown_model_type_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    d = write_config(tmp_path / "m", {**TINY_LLAMA, "model_type": "nonesuch"})
    for argv in (["estimate", str(d)], ["plan", str(d), "--tokens", "1M", "--providers", "aws"]):
        msg = run_error(capsys, *argv)
        assert "model_type 'nonesuch' is not a causal language model this transformers" in msg


def test_lora_targets_the_model_lacks_are_named(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path
) -> None:
    # PEFT alone would train q_proj and quietly skip the name it cannot find
    msg = run_error(capsys, "estimate", str(tiny_llama_dir), "--lora-targets", "q_proj,qproj")
    assert "--lora-targets: no module qproj in this model; its linear layers are down_proj" in msg


def test_a_damaged_config_json_is_named_not_taken_for_a_missing_tokenizer(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": ')
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "x"}\n')
    msg = run_error(capsys, "data", "check", str(data), "--model", str(d))
    assert f"{d / 'config.json'} is not valid JSON" in msg


def test_a_bundled_multimodal_config_carries_its_text_decoder_resolved() -> None:
    """What a cold estimate of Gemma 3 or Llama 4 reads instead of importing transformers
    (3.0 s -> 0.7 s): the text decoder with its class defaults, as the installed
    transformers resolves it (`make profiles` writes it)."""
    from frugal.models.specs import RESOLVED_KEY, bundled_text_config, read_bundled

    multimodal = 0
    for model_id in bundled_model_ids():
        raw = read_bundled(model_id)
        text = bundled_text_config(raw)
        if text is None:
            assert RESOLVED_KEY not in raw, model_id
            continue
        multimodal += 1
        assert raw[RESOLVED_KEY] == text, f"{model_id}: run `make profiles`"
        assert load_spec(model_id).config == text
    assert multimodal >= 5
