"""Modal as a provider: per-second prices (dated, sourced) priced as offers with the
container's cores and memory, and `frugal plan --emit modal` writing an app that the `modal`
package imports (no network, no credentials) with the planned GPU, a Volume for the run
directory and retries that resume."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from conftest import run_error

from frugal.cli.main import main
from frugal.hardware.offers import (
    MODAL_CORE_USD_S,
    MODAL_CORES_PER_GPU,
    MODAL_GIB_PER_GPU,
    MODAL_GIB_USD_S,
    bundled,
    providers,
)

PLAN = ["plan", "meta-llama/Llama-3.1-8B", "--tokens", "5M", "--methods", "qlora"]


def test_modal_offers_are_gpu_seconds_plus_the_containers_cores_and_memory() -> None:
    h100 = {
        o.gpus: o for o in bundled().offers if o.provider == "modal" and o.gpu.name == "H100 SXM"
    }
    assert set(h100) == {1, 2, 4, 8}
    per_gpu_s = (
        0.001097 + MODAL_CORES_PER_GPU * MODAL_CORE_USD_S + MODAL_GIB_PER_GPU * MODAL_GIB_USD_S
    )
    assert h100[1].ondemand_usd_h == pytest.approx(per_gpu_s * 3600)
    assert h100[8].ondemand_usd_h == pytest.approx(8 * h100[1].ondemand_usd_h)
    assert h100[1].spot_usd_h is None  # preemptible always, one price: no spot market
    assert "modal.com/pricing" in h100[1].source and h100[1].retrieved
    assert providers()["modal"].boot_min <= 2  # containers start in seconds, not minutes
    t4 = [o.gpus for o in bundled().offers if o.provider == "modal" and o.gpu.name == "T4"]
    assert sorted(t4) == [1, 2, 4]  # at most 4 T4s a container


def _load(path: Path) -> object:
    spec = importlib.util.spec_from_file_location("emitted_modal_app", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["emitted_modal_app"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["emitted_modal_app"]
    return module


def test_emit_modal_writes_an_app_modal_imports_with_the_planned_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("modal")
    monkeypatch.chdir(tmp_path)
    rc = main([*PLAN, "--providers", "modal", "--write", "frugal.yaml", "--emit", "modal",
               "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["wrote_modal"] == "modal_app.py"
    rec = out["recommendation"]
    app = _load(tmp_path / "modal_app.py")
    gpus = f"{rec['gpus']}"
    assert app.GPU.endswith(f":{gpus}") and app.CONFIG == "frugal.yaml"  # type: ignore[attr-defined]
    # what modal will ask its servers for (its function spec, as the decorator built it)
    spec = app.train._spec_  # type: ignore[attr-defined]
    assert spec.gpus == app.GPU  # type: ignore[attr-defined]
    assert "/runs" in {str(k) for k in spec.volumes}
    assert spec.cpu == MODAL_CORES_PER_GPU * rec["gpus"]  # the cores frugal priced
    assert spec.memory == MODAL_GIB_PER_GPU * rec["gpus"] * 1024
    text = (tmp_path / "modal_app.py").read_text()
    assert "'--resume', 'auto'" in text and "runs.commit()" in text
    assert "pip install '/frugal[train]'" in text  # QLoRA needs bitsandbytes


def test_emit_modal_needs_a_gpu_modal_sells_and_a_run_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert "--write" in run_error(capsys, *PLAN, "--emit", "modal")
    msg = run_error(capsys, *PLAN, "--local", "RTX 4090", "--providers", "local", "--write",
                    "f.yaml", "--emit", "modal")  # fmt: skip
    assert "priced on local (your 1x RTX 4090)" in msg and "--providers modal" in msg
    assert not (tmp_path / "f.yaml").exists() and not (tmp_path / "modal_app.py").exists()


@pytest.mark.parametrize(
    "name", ["bob's run.yaml", "x'); import os; os.system('touch pwned'); ('.yaml", 'a"""b ü.yaml']
)
def test_the_modal_app_takes_a_run_config_of_any_name_as_data(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name with quotes was a syntax error in modal_app.py, and a crafted one ran as
    code: the name is a string literal of the app, whatever it holds."""
    pytest.importorskip("modal")
    monkeypatch.chdir(tmp_path)
    rc = main([*PLAN, "--providers", "modal", "--write", name, "--emit", "modal", "--json"])
    assert rc == 0, capsys.readouterr().err
    app = _load(tmp_path / "modal_app.py")
    config, in_image = app.CONFIG, app.IN_IMAGE  # type: ignore[attr-defined]
    assert (config, in_image) == (name, "/config/" + name)
    assert not (tmp_path / "pwned").exists()


def test_emit_modal_refuses_a_plan_priced_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Modal app for a GPU the plan priced on AWS would run at a price nobody planned."""
    monkeypatch.chdir(tmp_path)
    msg = run_error(capsys, *PLAN, "--providers", "aws", "--write", "f.yaml", "--emit", "modal")
    assert "priced on aws" in msg and "--providers modal" in msg
    assert not (tmp_path / "f.yaml").exists() and not (tmp_path / "modal_app.py").exists()
