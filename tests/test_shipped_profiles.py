"""The profiles shipped with the package: found by the same key a simulation saves under,
the same bytes a simulation makes today, never used when made by other code or versions,
and a first plan or estimate of a bundled model's common job simulates nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from frugal.cli.main import main
from frugal.estimate import cache, core
from frugal.models.specs import ModelSpec, load_spec
from frugal.step.job import TrainJob, make_job

MADE_BY_OTHERS = ("torch", "transformers", "peft")  # what `make profiles` cannot decide
CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints.txt"


def pinned() -> dict[str, str]:
    """What `make test` installs (constraints.txt): `name==version` lines."""
    lines = [ln.split("==") for ln in CONSTRAINTS.read_text().splitlines() if "==" in ln]
    return {name.strip(): version.strip() for name, version in lines}


def index() -> dict[str, Any]:
    return json.loads((cache.shipped_dir() / "index.json").read_text())


def current_or_skip() -> dict[str, Any]:
    """The index, in the environment `make test` installs; in another one (a user's own
    torch, transformers or peft), the shipped profiles are rightly never found (tested
    below). `make test`'s own versions are held to the index's by the test after this."""
    idx = index()
    now = cache.versions()
    want = {"torch": idx["versions"]["torch"], **pinned()}
    other = [f"{p} {now[p]}" for p in MADE_BY_OTHERS if want[p] != now[p]]
    if other:
        pytest.skip(f"not the environment `make test` installs ({', '.join(other)})")
    return idx


def test_make_test_installs_the_versions_the_shipped_profiles_were_made_with() -> None:
    """A new release of transformers or peft changes every profile's key: unpinned, the
    shipped profiles would all miss (every first plan a simulation) and the tests of them
    skip. `make profiles` writes both files; this holds them together."""
    made = index()["versions"]
    assert pinned() == {p: made[p] for p in ("transformers", "peft")}, "run `make profiles`"
    makefile = (CONSTRAINTS.parent / "Makefile").read_text()
    assert f"torch=={made['torch']}" in makefile and "-c constraints.txt" in makefile


def key_of(entry: dict[str, Any], accum: int) -> str:
    spec = load_spec(entry["model"])
    job = TrainJob.model_validate(entry["job"]).model_copy(update={"grad_accum": accum})
    return cache.profile_key(spec.config, job.profile_key(), str(core.base_length(
        spec, entry["seq"], job.loss_chunks)))  # fmt: skip


def test_every_shipped_profile_is_for_this_code_and_found_by_its_key() -> None:
    idx = current_or_skip()
    assert idx["versions"] == cache.versions(), (
        "the step, the simulation or frugal's version changed since the profiles were made: "
        "run `make profiles`"
    )
    entries = idx["profiles"]
    assert {e["model"] for e in entries} >= {"meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B"}
    shipped = {p.stem for p in cache.shipped_dir().glob("*.npz")}
    for e in entries:
        # a job that accumulates is saved twice: with one micro-step and with two
        accums = (1, 2) if e["job"]["grad_accum"] > 1 else (1,)
        assert e["keys"] == [key_of(e, a) for a in accums]
        assert set(e["keys"]) <= shipped
    assert shipped == {k for e in entries for k in e["keys"]}  # nothing unlisted ships


def test_a_shipped_profile_is_the_bytes_a_simulation_makes_today(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample, one per method, of the smallest model: simulated again with the shipped
    profiles off, into an empty cache, and compared byte for byte."""
    idx = current_or_skip()
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(cache.SHIPPED_ENV, "off")
    plain = {"grad_checkpointing": True, "loss_chunks": 0, "offload_activations": False,
             "optimizer_in_backward": False, "optimizer": "adamw"}  # fmt: skip
    sample = {
        e["job"]["method"]: e
        for e in idx["profiles"]
        if e["model"] == "HuggingFaceTB/SmolLM2-135M"
        and e["job"]["grad_accum"] > 1
        and all(e["job"][k] == v for k, v in plain.items())
    }
    assert set(sample) == {"full", "lora", "qlora"}
    for e in sample.values():
        core.get_profile(load_spec(e["model"]), TrainJob.model_validate(e["job"]), e["seq"])
        for key in e["keys"]:
            made = (tmp_path / "profiles" / f"{key}.npz").read_bytes()
            assert made == (cache.shipped_dir() / f"{key}.npz").read_bytes(), (e["job"], key)


def test_the_first_plan_and_estimates_of_a_bundled_model_simulate_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    current_or_skip()
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path))  # empty: a user's first command
    import frugal.estimate.simulate as sim

    monkeypatch.setattr(sim, "simulate", lambda *a, **k: pytest.fail("simulated"))
    readme = ["plan", "meta-llama/Llama-3.1-8B", "--tokens", "20M", "--methods", "lora,qlora",
              "--deadline", "24", "--json"]  # fmt: skip
    assert main(["--verbose", *readme]) == 0
    err = capsys.readouterr().err
    assert "profiles: 0 simulated, 0 from the cache, " in err
    assert int(err.split("from the cache, ")[1].split()[0]) >= 8  # methods x techniques
    for method in ("full", "lora", "qlora"):
        assert main(["estimate", "meta-llama/Llama-3.1-70B", "--method", method, "--json"]) == 0
    assert not any((tmp_path / "profiles").glob("*.npz"))  # nothing was simulated to save


def test_profiles_made_with_other_versions_are_never_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = current_or_skip()["profiles"][0]
    assert cache.load(entry["keys"][0]) is not None
    real = cache.installed_version
    monkeypatch.setattr(
        cache, "installed_version", lambda p: "99.0" if p == "transformers" else real(p)
    )
    accums = (1, 2) if entry["job"]["grad_accum"] > 1 else (1,)
    for a in accums:
        assert key_of(entry, a) not in entry["keys"]
        assert cache.load(key_of(entry, a)) is None


def test_a_damaged_shipped_profile_is_said_simulated_again_and_left_as_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = index()["profiles"][0]
    key = entry["keys"][0]
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    good = (cache.shipped_dir() / f"{key}.npz").read_bytes()
    (shipped / f"{key}.npz").write_bytes(good[: len(good) // 2])
    monkeypatch.setattr(cache, "shipped_dir", lambda: shipped)
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path / "cache"))
    assert cache.load(key) is None
    assert "the package left as installed" in capsys.readouterr().err
    assert (shipped / f"{key}.npz").stat().st_size == len(good) // 2  # not removed


def test_a_profile_file_is_the_same_bytes_whenever_it_is_written(
    tiny_llama: ModelSpec, tmp_path: Path
) -> None:
    prof = core.get_profile(tiny_llama, make_job(method="lora", seq=128), 128)
    cache.save("a", prof, into=tmp_path)
    blob = cache.dump(prof)
    assert (tmp_path / "a.npz").read_bytes() == blob
    again = cache.read(tmp_path / "a.npz")
    assert cache.dump(again) == blob  # read back, nothing changes


def test_verbose_says_which_profiles_were_simulated_and_where_the_others_came_from(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path))
    cmd = ["estimate", str(tiny_llama_dir / "config.json"), "--method", "qlora", "--json"]
    assert main(["--verbose", *cmd]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "profiles: 1 simulated, 0 from the cache, 0 shipped with frugal"
    line = err[-2]
    assert line.startswith("simulated ") and "qlora" in line and "checkpointing" in line
    assert "depths 1 and 2" in line
    assert "lengths 64, 128, 192" in line and " ops in " in line
    assert line.endswith(": the estimate; none cached or shipped")
    assert main(["--verbose", *cmd]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == (
        "profiles: 0 simulated, 1 from the cache, 0 shipped with frugal"
    )
    assert main(cmd) == 0  # without --verbose: nothing said
    assert "profiles:" not in capsys.readouterr().err
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_verbose_says_which_set_up_asked_for_each_profile_a_plan_simulated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan names the GPU set-up that first asked for each profile it simulated, and the
    memory technique that asked for one and why: here the chunked loss, for a tiny model
    with a vocabulary of 256k, whose logits alone outgrow a 6 GB GPU at 4k tokens."""
    from conftest import TINY_LLAMA

    cfg = {**TINY_LLAMA, "num_hidden_layers": 2, "vocab_size": 262144,
           "max_position_embeddings": 8192}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path / "cache"))
    cmd = ["--verbose", "plan", str(tmp_path / "config.json"), "--tokens", "1M", "--seq",
           "4096", "--local", "RTX 4050 Laptop", "--providers", "local", "--methods", "lora",
           "--json"]  # fmt: skip
    main(cmd)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("simulated ")]
    assert lines and all("first asked for 1x RTX 4050 Laptop" in ln for ln in lines), lines
    assert any("(--loss-chunks: " in ln and "loss in 16 chunks" in ln for ln in lines), lines
