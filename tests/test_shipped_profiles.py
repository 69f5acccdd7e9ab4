"""The profiles shipped with the package: found by the same key a simulation saves under,
the same bytes a simulation makes today, never used when made by other code or versions,
and a first plan or estimate of a bundled model's common job simulates nothing."""

from __future__ import annotations

import datetime
import json
import os
import random
import shutil
import subprocess
import sys
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
    job = TrainJob.model_validate(entry["job"]).model_copy(update={"grad_accum": accum})
    return core.profile_key(load_spec(entry["model"]), job, entry["seq"])


def test_every_shipped_profile_is_for_this_step_and_found_by_its_key() -> None:
    idx = current_or_skip()
    assert idx["versions"] == cache.versions(), (
        "the step's format (frugal.step.STEP_FORMAT) or a library changed since the profiles "
        "were made: run `make profiles`"
    )
    entries = idx["profiles"]
    assert {e["model"] for e in entries} >= {"meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B"}
    shipped = {p.stem for p in cache.shipped_dir().glob("*.npz")}
    for e in entries:
        spec, job = load_spec(e["model"]), TrainJob.model_validate(e["job"])
        assert e["keys"] == core.keys_of(spec, job, e["seq"])
        assert set(e["keys"]) <= shipped
    assert shipped == {k for e in entries for k in e["keys"]}  # nothing unlisted ships


def test_a_docstring_edited_under_step_leaves_every_shipped_profile_found(
    tmp_path: Path,
) -> None:
    """frugal's package copied, a docstring of a step module edited and a comment added to
    another: each shipped profile's key, computed by the copy, is still the one shipped."""
    idx = current_or_skip()
    src = Path(cache.__file__).resolve().parents[2]
    shutil.copytree(src / "frugal", tmp_path / "frugal",
                    ignore=shutil.ignore_patterns("profiles", "__pycache__"))  # fmt: skip
    model = tmp_path / "frugal" / "step" / "model.py"
    text = model.read_text()
    doc = text.index('"""') + 3
    model.write_text(text[:doc] + "An edited docstring. " + text[doc:])
    loop = tmp_path / "frugal" / "step" / "loop.py"
    loop.write_text(loop.read_text() + "\n# a comment\n")
    entries = idx["profiles"][:: max(1, len(idx["profiles"]) // 40)]
    script = (
        "import json, sys\n"
        "import frugal\n"
        "print(frugal.__file__)\n"
        "from frugal.estimate import core\n"
        "from frugal.models.specs import load_spec\n"
        "from frugal.step.job import TrainJob\n"
        "for e in json.load(sys.stdin):\n"
        "    job = TrainJob.model_validate(e['job'])\n"
        "    print(' '.join(core.keys_of(load_spec(e['model']), job, e['seq'])))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(entries), capture_output=True,
        text=True, check=True, env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert "An edited docstring" in model.read_text()
    lines = out.stdout.split("\n")[:-1]
    assert lines[0] == str(tmp_path / "frugal" / "__init__.py")  # the edited copy ran
    assert lines[1:] == [" ".join(e["keys"]) for e in entries]


def facets(job: dict[str, Any]) -> set[str]:
    """What kind of step a shipped profile is of: its task, method and techniques."""
    out = {f"task {job['task']}", f"method {job['method']}", f"optimizer {job['optimizer']}"}
    out.add("checkpointing" if job["grad_checkpointing"] else "no checkpointing")
    out.add("accumulating" if job["grad_accum"] > 1 else "one micro-step")
    flags = {"loss_chunks": "chunked loss", "offload_activations": "offloaded activations",
             "optimizer_in_backward": "optimizer in backward"}  # fmt: skip
    out |= {name for field, name in flags.items() if job[field]}
    if not job["packing"]:
        out.add("unpacked rows")
    if job["task"] == "preference":
        out |= {f"preference {job['preference']}", f"reference {job['reference']}"}
    if job["task"] == "distill":
        out.add(f"teacher logits {job['teacher_logits']}")
    return out


def makers(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries whose simulation made every file they list. A job that accumulates also
    saves the profile without accumulation (from its first micro-step), over the one a job
    of one micro-step saved under that key: the same step, fitted from other runs, so
    other bytes; that key's file is the accumulating job's."""
    by: dict[str, dict[str, Any]] = {}
    for e in entries:
        for k in e["keys"]:
            if e["job"]["grad_accum"] > 1 or k not in by:
                by[k] = e
    return [e for e in entries if all(by[k] is e for k in e["keys"])]


def sample(entries: list[dict[str, Any]], day: datetime.date) -> list[dict[str, Any]]:
    """Shipped profiles that cover every facet (task, method and technique) of the shipped
    ones: for each facet not yet covered, one of the three cheapest entries that have it
    (by ops simulated), chosen by the day, so that the sample rotates from day to day."""
    rng = random.Random(day.toordinal())
    entries = makers(entries)
    every = sorted(set().union(*(facets(e["job"]) for e in entries)))
    chosen: list[dict[str, Any]] = []
    covered: set[str] = set()
    for facet in every:
        if facet in covered:
            continue
        cheapest = sorted((e for e in entries if facet in facets(e["job"])),
                          key=lambda e: (e["ops"], e["keys"][0]))[:3]  # fmt: skip
        pick = rng.choice(cheapest)
        chosen.append(pick)
        covered |= facets(pick["job"])
    return chosen


def remade(entry: dict[str, Any], into: Path) -> list[str]:
    """The keys of `entry` whose profile today's code simulates to other bytes than the
    shipped file's (the shipped profiles off, the cache `into` empty)."""
    core.get_profile(load_spec(entry["model"]), TrainJob.model_validate(entry["job"]),
                     entry["seq"])  # fmt: skip
    shipped = cache.shipped_dir()
    return [k for k in entry["keys"]
            if (into / "profiles" / f"{k}.npz").read_bytes()
            != (shipped / f"{k}.npz").read_bytes()]  # fmt: skip


REMAKE = "the step runs otherwise than when the shipped profiles were made: bump " \
    "frugal.step.STEP_FORMAT and run `make profiles`"  # fmt: skip
SAMPLE = 8  # the sample's tests; the entries are shared among them, so the workers share it


@pytest.mark.parametrize("part", range(SAMPLE))
def test_a_sample_of_shipped_profiles_is_the_bytes_a_simulation_makes_today(
    part: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One per task, method and technique of the shipped profiles, rotating by date:
    simulated again with the shipped profiles off, into an empty cache, and compared byte
    for byte. A change of what the step runs, made without a new step format, fails here."""
    idx = current_or_skip()
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(cache.SHIPPED_ENV, "off")
    mine = sample(idx["profiles"], datetime.date.today())[part::SAMPLE]
    for e in mine:
        differ = remade(e, tmp_path)
        assert not differ, f"{e['model']} {sorted(facets(e['job']))}: {REMAKE}"


def test_the_sample_covers_every_task_method_and_technique_and_rotates() -> None:
    entries = index()["profiles"]
    days = [datetime.date(2026, 12, 1) + datetime.timedelta(days=d) for d in range(7)]
    samples = [sample(entries, d) for d in days]
    every = set().union(*(facets(e["job"]) for e in entries))
    assert {"task causal", "task classification", "task preference", "task distill",
            "method full", "method lora", "method qlora", "chunked loss",
            "offloaded activations", "optimizer in backward"} <= every  # fmt: skip
    for s in samples:
        assert set().union(*(facets(e["job"]) for e in s)) == every
        assert len(s) <= 2 * SAMPLE  # a few entries each test
    assert len({tuple(e["keys"][0] for e in s) for s in samples}) > 1  # not the same every day


def test_a_step_that_saves_a_larger_tensor_is_caught_by_the_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's loss made to keep its logits in fp32 for backward (a tensor of another
    size saved): the re-simulated profile differs from the shipped one."""
    import torch

    from frugal.step import forward

    idx = current_or_skip()
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(cache.SHIPPED_ENV, "off")
    real = forward.forward

    def widened(model: Any, b: dict[str, torch.Tensor]) -> Any:
        out = real(model, b)
        out.logits = out.logits.float() * 1.0  # a new fp32 tensor, saved by the product
        return out

    entry = next(e for e in sample(idx["profiles"], datetime.date.today())
                 if e["job"]["task"] == "causal" and not e["job"]["loss_chunks"])  # fmt: skip
    assert not remade(entry, tmp_path)
    for p in (tmp_path / "profiles").glob("*.npz"):
        p.unlink()
    monkeypatch.setattr(forward, "forward", widened)  # the tasks import it as they run
    assert remade(entry, tmp_path) == entry["keys"]


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
