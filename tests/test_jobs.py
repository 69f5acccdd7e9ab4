"""`frugal plan --jobs`: many fine-tunes packed onto shared VMs, spot VMs timed by a price
history, the data's movement priced."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_error, run_json, skypilot_validator

from frugal.config import validate_run_config
from frugal.hardware.catalog import catalog
from frugal.hardware.offers import bundled_offers
from frugal.models.specs import ModelSpec
from frugal.plan.constraints import Constraints
from frugal.plan.search import search
from frugal.step.job import make_job

JOBS = str(ROOT / "examples" / "jobs.yaml")
NOW = "2026-11-20T18:00"


def _history(path: Path, provider: str = "aws", dip: float = 0.4) -> Path:
    """7 days of hourly spot prices for every spot offer of `provider`: the catalog's price
    by day, `dip` of it from 02:00 to 06:00 UTC."""
    start = datetime(2026, 11, 13, 18, tzinfo=UTC)
    lines = ["time,provider,instance,region,spot_usd_h"]
    for o in bundled_offers():
        if o.provider != provider or o.spot_usd_h is None:
            continue
        for h in range(7 * 24):
            t = start + timedelta(hours=h)
            price = o.spot_usd_h * (dip if 2 <= t.hour < 6 else 1.0)
            lines.append(f"{t.isoformat()},{o.provider},{o.instance},{o.region},{price:.4f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _jobs(path: Path, jobs: list[dict[str, object]]) -> str:
    defaults = {"model": "meta-llama/Llama-3.1-8B", "method": "lora", "tokens": "20M"}
    path.write_text(yaml.safe_dump({"defaults": defaults, "jobs": jobs}))
    return str(path)


@pytest.mark.slow
def test_eight_small_jobs_share_fewer_vms_than_one_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_json(capsys, "plan", "--jobs", JOBS, "--providers", "aws", "--no-spot", "--json")
    assert out["jobs"] == 8
    assert len(out["vms"]) < 8
    assert out["total_usd"] < out["one_vm_per_job_usd"]
    assert out["saving_usd"] == pytest.approx(out["one_vm_per_job_usd"] - out["total_usd"], 0.01)
    jobs = {j["name"]: j for vm in out["vms"] for j in vm["jobs"]}
    assert set(jobs) == {"lr-5e-5", "lr-1e-4", "lr-2e-4", "lr-4e-4", "r8", "r32", "r64", "urgent"}
    for j in jobs.values():  # every job by its deadline
        assert j["end_h"] <= j["deadline_h"]
    assert jobs["urgent"]["end_h"] <= 3
    # a shared VM boots once: its hours are less than its jobs' own VMs' hours together
    assert sum(vm["hours"] for vm in out["vms"]) < sum(j["train_h"] for j in jobs.values()) + 8 * (
        6 / 60
    )


@pytest.mark.slow
def test_text_output_prints_the_saving(capsys: pytest.CaptureFixture[str]) -> None:
    from frugal.cli.main import main

    assert main(["plan", "--jobs", JOBS, "--providers", "aws", "--no-spot"]) == 0
    text = capsys.readouterr().out
    assert "8 jobs on" in text and "one VM per job" in text and "saving $" in text


@pytest.mark.slow
def test_spot_vms_start_in_the_nightly_dip_when_the_slack_allows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    history = str(_history(tmp_path / "spot.csv"))
    base = ["--providers", "aws", "--spot", "--now", NOW, "--price-history", history, "--json"]
    slack = _jobs(tmp_path / "slack.yaml", [{"name": "a", "deadline": "36h"},
                                            {"name": "b", "deadline": "36h"}])  # fmt: skip
    out = run_json(capsys, "plan", "--jobs", slack, *base)
    vm = out["vms"][0]
    assert vm["spot"] and vm["start_h"] > 0
    hour = (datetime.fromisoformat(NOW) + timedelta(hours=vm["start_h"])).hour
    assert 2 <= hour < 6  # 18:00 + 8 h: in the dip
    w = vm["price_window"]
    assert w["saving_usd"] > 0 and w["expected_usd"] < w["now_usd"]
    for j in vm["jobs"]:
        assert j["end_h"] <= j["deadline_h"]
    # the same jobs that must be done soon start at once
    tight = _jobs(tmp_path / "tight.yaml", [{"name": "a", "deadline": "4h"}])
    out = run_json(capsys, "plan", "--jobs", tight, *base)
    assert all(vm["start_h"] == 0 for vm in out["vms"])
    # no history: the plan says timing needs one, and starts now
    out = run_json(capsys, "plan", "--jobs", slack, "--providers", "aws", "--spot", "--json")
    assert all(vm["start_h"] == 0 for vm in out["vms"])
    assert any("--price-history" in n for n in out["notes"])


@pytest.mark.slow
def test_data_where_it_is_wins_when_moving_it_costs_more(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    here = _jobs(tmp_path / "here.yaml", [{"name": "a", "deadline": "48h", "data": "local"}])
    far = _jobs(tmp_path / "far.yaml", [{"name": "a", "deadline": "48h", "data_gb": 300,
                                         "data": "aws:us-east-1"}])  # fmt: skip
    cheap = run_json(capsys, "plan", "--jobs", here, "--json")["vms"][0]
    out = run_json(capsys, "plan", "--jobs", far, "--json")
    vm = out["vms"][0]
    assert (cheap["provider"], cheap["region"]) != ("aws", "us-east-1")  # elsewhere is cheaper
    assert (vm["provider"], vm["region"]) == ("aws", "us-east-1")  # the data is here
    assert any("moving it would cost $" in n for n in out["notes"])


@pytest.mark.slow
def test_write_gives_a_config_per_job_and_a_resumable_task_per_vm(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = run_json(capsys, "plan", "--jobs", JOBS, "--providers", "aws", "--no-spot",
                   "--write", str(tmp_path / "sweep"), "--json")  # fmt: skip
    wrote = [Path(p) for p in out["wrote"]]
    configs = [p for p in wrote if p.name.endswith(".yaml") and not p.name.endswith(".sky.yaml")]
    tasks = [p for p in wrote if p.name.endswith(".sky.yaml")]
    assert len(configs) == 8 and len(tasks) == len(out["vms"])
    cfg = validate_run_config(yaml.safe_load((tmp_path / "sweep" / "lr-5e-5.yaml").read_text()),
                              "lr-5e-5")  # fmt: skip
    assert cfg.training.learning_rate == 5e-5 and cfg.tags["project"] == "sweep"
    assert validate_run_config(yaml.safe_load((tmp_path / "sweep" / "r64.yaml").read_text()),
                               "r64").job.lora_r == 64  # fmt: skip
    task_schema, resources_schema = skypilot_validator("task"), skypilot_validator("resources")
    for t in tasks:
        task = yaml.safe_load(t.read_text())
        task_schema.validate(task)
        resources_schema.validate(task["resources"])
        # a restart skips finished jobs and resumes the running one
        assert "run_summary.json ]; then" in task["run"] and "--resume auto" in task["run"]
        # the configs were written outside the synced workdir: mounted, never named as paths
        # of this machine in what the VM runs
        assert str(tmp_path) not in task["run"]
        mounted = {Path(v).name for k, v in task["file_mounts"].items() if k != "/checkpoints"}
        assert mounted and mounted <= {p.name for p in configs}
    first = yaml.safe_load(tasks[0].read_text())["run"]
    names = [j["name"] for j in out["vms"][0]["jobs"]]
    assert [first.index(f"/checkpoints/{n} ") for n in names] == sorted(
        first.index(f"/checkpoints/{n} ") for n in names
    )  # in the VM's order


@pytest.mark.parametrize(
    ("jobs", "fix"),
    [
        ([{"name": "a"}], "give tokens or dataset"),
        ([{"name": "a", "tokens": "lots"}], "not a token count"),
        ([{"name": "a", "deadline": "soon"}], "not a duration"),
        ([{"name": "a", "method": "dora"}], "job a: method"),
        ([{"name": "a", "tokens": "1M"}, {"name": "a", "tokens": "1M"}], "two jobs are named"),
        ([{"name": "a", "tokens": "1M", "data": "s3://bucket"}], "job a: data: "),
    ],
)
def test_bad_jobs_files_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, jobs: list[dict[str, object]], fix: str
) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump({"defaults": {"model": "meta-llama/Llama-3.1-8B"},
                                    "jobs": jobs}))  # fmt: skip
    assert fix in run_error(capsys, "plan", "--jobs", str(path))


def test_jobs_flags_are_refused_without_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    err = run_error(capsys, "plan", "meta-llama/Llama-3.1-8B", "--tokens", "1M",
                    "--price-history", "x.csv")  # fmt: skip
    assert "add --jobs FILE" in err
    assert "drop MODEL" in run_error(capsys, "plan", "meta-llama/Llama-3.1-8B", "--jobs", JOBS)
    assert "give MODEL" in run_error(capsys, "plan", "--tokens", "1M")


@pytest.mark.slow
def test_a_single_plan_prices_its_data_and_stays_where_the_data_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "meta-llama/Llama-3.1-8B", "--tokens", "20M", "--json"]
    free = run_json(capsys, *args)["recommendation"]
    far = run_json(capsys, *args, "--data", "aws:us-east-1", "--data-gb", "300")["recommendation"]
    assert (free["provider"], free["region"]) != ("aws", "us-east-1")
    assert (far["provider"], far["region"]) == ("aws", "us-east-1")
    assert any(r.startswith("data: dataset 300.0 GB") for r in far["reasons"])
    assert any("runs where its data is cheaper to reach" in r for r in far["reasons"])
    # elsewhere, the move is in the bill: the source cloud's egress for 300 GB
    gcp = run_json(capsys, *args, "--data", "aws:us-east-1", "--data-gb", "300",
                   "--providers", "gcp")["recommendation"]  # fmt: skip
    assert gcp["cost_breakdown_usd"]["egress"] >= 300 * 0.09
    assert "--data: data location 's3://x'" in run_error(capsys, *args, "--data", "s3://x")


@pytest.mark.slow
def test_a_shallow_dip_is_not_worth_waiting_for(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    history = str(_history(tmp_path / "spot.csv", dip=0.98))
    jobs = _jobs(tmp_path / "slack.yaml", [{"name": "a", "deadline": "36h"}])
    out = run_json(capsys, "plan", "--jobs", jobs, "--providers", "aws", "--spot", "--now", NOW,
                   "--price-history", history, "--json")  # fmt: skip
    assert all(vm["start_h"] == 0 for vm in out["vms"])
    assert any("under 5%" in n for n in out["notes"])


def test_multi_node_jobs_share_only_vms_of_as_many_nodes(tiny_llama: ModelSpec) -> None:
    """A job planned on two nodes is packed only with jobs planned on two nodes of the same
    offer, and its VM's task asks for both nodes and joins them into one job."""
    from dataclasses import replace

    from frugal.plan.emit import skypilot_jobs_task
    from frugal.plan.jobs import JobQuote, pack

    plan = search(tiny_llama, make_job(seq=128), catalog(), Constraints(tokens=1e6)).recommendation
    two = replace(plan, nodes=2, compute_usd=2 * plan.compute_usd)  # twice the machines
    runs = {
        "one": [JobQuote("one", "m", "d", None, plan)],
        "two": [JobQuote("two", "m", "d", None, two)],
        "also-two": [JobQuote("also-two", "m", "d", None, two)],
    }
    vms = pack(runs).vms
    together = {tuple(sorted(r.job for r in vm.runs)): vm.nodes for vm in vms}
    assert together == {("also-two", "two"): 2, ("one",): 1}
    vm = next(vm for vm in vms if vm.nodes == 2)
    task = yaml.safe_load(skypilot_jobs_task(vm, {"two": "two.yaml", "also-two": "a.yaml"}, "v"))
    skypilot_validator("task").validate(task)
    assert task["num_nodes"] == 2 and task["run"].count('--node-rank "$SKYPILOT_NODE_RANK"') == 2
    assert vm.to_json()["nodes"] == 2
