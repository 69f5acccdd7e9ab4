"""`frugal plan`: the search, its constraints and outputs, and the issue's must-shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import run_error, run_json

from frugal.cli.main import main
from frugal.config import load_run_config
from frugal.errors import FrugalError
from frugal.hardware.catalog import catalog
from frugal.models.specs import ModelSpec, load_spec
from frugal.plan.constraints import Constraints
from frugal.plan.plans import pareto
from frugal.plan.search import search
from frugal.step.job import make_job

# the step's memory techniques off: for tests about something else (each is simulated apart)
PLAIN = {"auto_loss_chunks": False, "auto_offload": False, "auto_in_backward": False}


def test_search_recommends_the_cheapest_feasible(tiny_llama: ModelSpec) -> None:
    r = search(tiny_llama, make_job(seq=128), catalog(), Constraints(tokens=1e7))
    best = r.recommendation
    assert best.device_total_gib <= best.offer.gpu.usable_gib
    assert best.cost_usd == min(p.cost_usd for p in r.frontier)
    assert best.reasons and "fits" in best.reasons[0]
    for a in r.frontier:  # nothing on the frontier is beaten on both axes
        assert not any(b.cost_usd < a.cost_usd and b.hours < a.hours for b in r.frontier)
    fastest = search(
        tiny_llama, make_job(seq=128), catalog(), Constraints(tokens=1e7, objective="time")
    ).recommendation
    assert fastest.hours <= best.hours


@pytest.mark.slow
def test_plan_memory_is_the_estimate_of_the_printed_job(tiny_llama: ModelSpec) -> None:
    """Fit is judged with the accumulation the plan prints: an accumulating job holds its
    gradients through the next forward pass."""
    from frugal.estimate.core import estimate
    from frugal.hardware.gpus import GIB

    r = search(
        tiny_llama,
        make_job(method="full", seq=1024),
        catalog(),
        Constraints(
            tokens=1e9, effective_batch=4096, methods=("full",), optimizers=("adamw",), **PLAIN
        ),
    )
    assert any(p.job.grad_accum > 1 for p in r.plans)
    for p in r.plans[:20]:
        want = estimate(tiny_llama, p.job).memory.device_total / GIB
        assert p.device_total_gib == pytest.approx(want, rel=1e-6), p.label()


def test_pareto_drops_dominated(tiny_llama: ModelSpec) -> None:
    r = search(tiny_llama, make_job(seq=128), catalog(), Constraints(tokens=1e7))
    everything = r.frontier
    assert pareto(everything) == everything


def test_spot_modes(tiny_llama: ModelSpec) -> None:
    never = search(tiny_llama, make_job(seq=128), catalog(), Constraints(tokens=1e8, spot="never"))
    assert not never.recommendation.spot and all(not p.spot for p in never.frontier)
    only = search(tiny_llama, make_job(seq=128), catalog(), Constraints(tokens=1e8, spot="only"))
    assert only.recommendation.spot
    assert only.recommendation.checkpoint_interval_min is not None


def test_spot_fallback_when_the_deadline_is_at_risk(tiny_llama: ModelSpec) -> None:
    k = Constraints(tokens=5e9, spot="only", mtbi_h=0.5, deadline_h=1e6)
    calm = search(tiny_llama, make_job(seq=128), catalog(), k).recommendation
    tight = Constraints(tokens=5e9, spot="only", mtbi_h=0.5, deadline_h=calm.hours * 0.9)
    plan = search(tiny_llama, make_job(seq=128), catalog(), tight).recommendation
    assert plan.fallback is not None and plan.fallback.spot_share < 1
    assert plan.hours <= tight.deadline_h  # type: ignore[operator]
    assert any("switch to on-demand" in r for r in plan.reasons)


def test_infeasible_names_the_closest_miss(tiny_llama: ModelSpec) -> None:
    job = make_job(seq=128)
    with pytest.raises(FrugalError, match=r"0.01 h deadline: the fastest \(.*\) takes [\d.]+ h"):
        search(tiny_llama, job, catalog(), Constraints(tokens=1e12, deadline_h=0.01))
    with pytest.raises(FrugalError, match=r"\$0.00 budget: the cheapest \(.*\) costs \$[\d,.]+"):
        search(tiny_llama, job, catalog(), Constraints(tokens=1e10, budget_usd=0.001))


def test_cli_plan_json_write_and_emit(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path, tmp_path: Path
) -> None:
    cfg, sky = tmp_path / "frugal.yaml", tmp_path / "sky.yaml"
    out = run_json(
        capsys,
        "plan",
        str(tiny_llama_dir),
        "--tokens",
        "10M",
        "--seq",
        "128",
        "--write",
        str(cfg),
        "--emit",
        "skypilot",
        "--emit-file",
        str(sky),
        "--json",
    )
    rec = out["recommendation"]
    for key in (
        "provider",
        "instance",
        "gpu",
        "gpus",
        "spot",
        "method",
        "micro_batch",
        "grad_accum",
        "grad_checkpointing",
        "optimizer",
        "est_hours",
        "est_cost_usd",
        "peak_reserved_gib",
        "tokens_per_s",
        "checkpoint_interval_min",
        "reasons",
    ):
        assert key in rec
    assert out["frontier"] and isinstance(out["rejected"], list)
    run = load_run_config(cfg)  # the schema `frugal train` reads
    assert run.job.batch == rec["micro_batch"] and run.plan is not None
    assert run.plan.est_cost_usd == rec["est_cost_usd"]
    task = yaml.safe_load(sky.read_text())
    assert task["resources"]["use_spot"] == rec["spot"]
    # the run config, written outside the synced workdir, is mounted where the run reads it
    assert task["run"].startswith("frugal train ~/frugal-config/frugal.yaml ")
    assert task["file_mounts"]["~/frugal-config/frugal.yaml"] == str(cfg)


def test_the_plan_chooses_the_training_settings_and_writes_what_it_chose(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """Each setting not given is chosen with its reason and source; the run config holds
    the chosen values, and what the user gave is theirs, in the plan and in the config."""
    cfg = tmp_path / "frugal.yaml"
    argv = ["plan", str(tiny_llama_dir), "--tokens", "2M", "--seq", "128", "--method", "lora"]
    out = run_json(capsys, *argv, "--lora-r", "4", "--write", str(cfg), "--json")
    by = {s["setting"]: s for s in out["settings"]}
    mine = by["job.lora_r"]
    assert (mine["value"], mine["yours"], mine["frugal_would_choose"]) == (4, True, 16)
    assert mine["reason"] and mine["source"]  # why frugal would have chosen 16
    assert by["data.epochs"]["value"] == 3.0 and by["data.epochs"]["source"] == "Stanford Alpaca"
    assert out["tokens"] == 6e6  # three passes of 2M tokens are what the plan prices
    run = load_run_config(cfg)
    assert (run.job.lora_r, run.job.lora_alpha, run.data.epochs) == (4, 32, 3.0)
    assert run.training.learning_rate == by["training.learning_rate"]["value"] == 2e-4
    assert run.training.effective_batch == by["training.effective_batch"]["value"]
    # full fine-tuning learns at a full fine-tune's rate; given epochs are the user's
    full = run_json(capsys, *argv, "--method", "full", "--epochs", "1", "--json")
    got = {s["setting"]: s for s in full["settings"]}
    assert got["training.learning_rate"]["value"] == 2e-5 and "job.lora_r" not in got
    assert got["data.epochs"]["yours"] and full["tokens"] == 2e6
    # full fine-tuning compared first: the adapters' settings ride on the LoRA plans
    mixed = run_json(capsys, *argv, "--methods", "full,lora", "--lora-r", "4", "--json")
    assert mixed["feasible_plans"] > 0
    text = main([*argv])  # the table lists them too
    assert text == 0 and "settings" in capsys.readouterr().out


def test_run_config_rejects_unknown_keys(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("model: x\njob: {method: lora, bacth: 4}\n")
    with pytest.raises(FrugalError, match="bacth"):
        load_run_config(p)


def test_cli_emit_hf(
    capsys: pytest.CaptureFixture[str],
    tiny_llama_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    rc = main(["plan", str(tiny_llama_dir), "--tokens", "1M", "--seq", "128", "--emit", "hf"])
    out = capsys.readouterr().out
    assert rc == 0 and "wrote train_hf.py (run it with: python train_hf.py)" in out
    script = (tmp_path / "train_hf.py").read_text()
    assert "TrainingArguments(" in script and "LoraConfig(" in script


def test_cli_dataset_tokens(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path, tmp_path: Path
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": "x" * 400}) for _ in range(10)) + "\n")
    out = run_json(
        capsys,
        "plan",
        str(tiny_llama_dir),
        "--dataset",
        str(data),
        "--epochs",
        "2",
        "--seq",
        "128",
        "--json",
    )
    assert out["tokens"] == 2 * 10 * 100  # 4 characters per token, said in the notes
    assert any("characters" in n for n in out["notes"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--seq", "128"], "--tokens"),
        (["--tokens", "lots"], "--tokens"),
        (["--tokens", "1M", "--optimize", "speed"], "--optimize"),
        (["--tokens", "1M", "--methods", "lora,dora"], "--method"),
        (["--tokens", "1M", "--providers", "amazon"], "closest"),
        (["--tokens", "1M", "--deadline", "-1"], "--deadline"),
        (["--tokens", "1M", "--deadline", "24x"], "--deadline '24x' is not a duration"),
        (["--tokens", "1M", "--spot-mtbi-hours", "soon"], "--spot-mtbi-hours"),
        (["--tokens", "1M", "--seq", "128", "--deadline", "0.0001"], "--deadline"),
    ],
)
def test_plan_bad_input(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path, args: list[str], needle: str
) -> None:
    assert needle in run_error(capsys, "plan", str(tiny_llama_dir), *args)


def test_catalog_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert len(run_json(capsys, "gpus", "--json")["gpus"]) >= 15
    rows = run_json(capsys, "offers", "--gpu", "rtx4090", "--json")["offers"]
    assert rows and all(r["gpu"] == "RTX 4090" for r in rows)


# -- the must-shows on bundled models (simulated once, then cached) -----------------


@pytest.mark.slow
def test_70b_full_plans_multi_gpu_with_sharding() -> None:
    spec = load_spec("meta-llama/Llama-3.1-70B")
    k = Constraints(tokens=5e7, methods=("full",), **PLAIN)
    r = search(spec, make_job(method="full"), catalog(), k)
    rec = r.recommendation
    assert rec.gpus > 1 and rec.job.sharding in ("fsdp", "zero3")


@pytest.mark.slow
def test_135m_plans_a_small_gpu() -> None:
    spec = load_spec("HuggingFaceTB/SmolLM2-135M")
    rec = search(spec, make_job(), catalog(), Constraints(tokens=5e6, **PLAIN)).recommendation
    assert rec.gpus == 1 and rec.offer.gpu.memory_gb <= 24


@pytest.mark.slow
def test_8b_qlora_fits_a_24gb_card() -> None:
    spec = load_spec("meta-llama/Llama-3.1-8B")
    offers = catalog(local=["RTX 4090"], bundled=False)
    rec = search(
        spec, make_job(method="qlora"), offers, Constraints(tokens=5e6, methods=("qlora",))
    ).recommendation
    assert rec.offer.gpu.name == "RTX 4090" and rec.device_total_gib <= 24


def test_plot_html_and_png(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path, tmp_path: Path
) -> None:
    args = ["plan", str(tiny_llama_dir), "--tokens", "10M", "--seq", "128", "--budget", "50"]
    page = tmp_path / "plan.html"
    d = run_json(capsys, *args, "--plot", str(page), "--json")
    assert d["wrote_plot"] == str(page)
    text = page.read_text()
    # one point per feasible plan, a bigger one per frontier plan, one for the recommendation
    assert text.count('class="p"') == d["feasible_plans"]
    assert text.count('class="fp"') == len(d["frontier"])
    assert text.count('class="r"') == 1 and "budget</text>" in text
    assert d["recommendation"]["provider"] in text.split("recommended: ")[1].split("<")[0]
    png = tmp_path / "plan.png"
    run_json(capsys, *args, "--plot", str(png), "--json")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_bad_suffix(capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path) -> None:
    msg = run_error(capsys, "plan", str(tiny_llama_dir), "--tokens", "1M", "--plot", "x.jpg")
    assert ".png, .svg, .pdf or .html" in msg


@pytest.mark.slow
def test_plans_only_shardings_train_runs() -> None:
    # 4-bit 70B needs ~49 GiB a GPU unsharded, more than an L40S; FSDP would split it, but
    # `frugal train` runs QLoRA with DDP only, so no such plan may be offered
    spec = load_spec("meta-llama/Llama-3.1-70B")
    offers = catalog(local=["8x L40S"], bundled=False)
    with pytest.raises(FrugalError, match="nothing fits"):
        search(
            spec, make_job(method="qlora"), offers,
            Constraints(tokens=2e6, methods=("qlora",), **PLAIN),
        )  # fmt: skip
    lora = search(spec, make_job(method="lora"), offers, Constraints(tokens=2e6, methods=("lora",)))
    assert lora.recommendation.job.sharding == "fsdp"  # LoRA shards: train runs that


def test_gpu_counts_that_cannot_share_the_batch_are_rejected(tiny_llama: ModelSpec) -> None:
    """frugal train needs each GPU to take an equal share of the effective batch."""
    r = search(
        tiny_llama, make_job(seq=128), catalog(), Constraints(tokens=1e7, effective_batch=12)
    )
    assert {p.gpus for p in r.plans} and all(12 % p.gpus == 0 for p in r.plans)
    assert any(x.kind == "batch" and "8 GPUs cannot share" in x.why for x in r.rejected)


@pytest.mark.slow
def test_plan_and_train_take_the_same_micro_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rule and one margin: the micro-batch a plan writes for a GPU is the one `frugal
    train` starts from on that GPU, and the largest `estimate --gpu` accepts at it."""
    import torch

    from frugal.estimate.core import estimate
    from frugal.hardware.gpus import find_gpu
    from frugal.plan.emit import to_run_config
    from frugal.run.build import auto_micro_batch

    spec = load_spec("HuggingFaceTB/SmolLM2-360M")
    k = Constraints(tokens=1e8, effective_batch=24, methods=("full",), optimizers=("adamw",))
    offers = [o for o in catalog() if o.gpu.name == "L4" and o.gpus == 1]
    plan = search(spec, make_job(method="full", seq=2048), offers, k).recommendation
    assert 1 < plan.job.batch < 24 and 24 % plan.job.batch == 0  # the memory decided it
    cfg = to_run_config(spec.id, plan, k, str(tmp_path / "d.jsonl"), 1e8, 1.0)
    l4 = find_gpu("L4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (0, int(l4.usable_gib * 2**30)))
    micro, why = auto_micro_batch(cfg, per_rank=24)
    assert micro == plan.job.batch and why.startswith("estimator")
    at = estimate(spec, plan.job, gpu=l4)
    assert at.fits
    bigger = min(d for d in range(plan.job.batch + 1, 25) if 24 % d == 0)
    over = estimate(
        spec, plan.job.model_copy(update={"batch": bigger, "grad_accum": 24 // bigger}), gpu=l4
    )
    assert not over.fits


def test_durations_are_written_as_people_write_them(
    capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path
) -> None:
    def feasible(*deadline: str) -> int:
        out = run_json(capsys, "plan", str(tiny_llama_dir), "--tokens", "20M", "--seq", "128",
                       *(("--deadline", *deadline) if deadline else ()), "--json")  # fmt: skip
        return int(out["feasible_plans"])

    # the same limit however it is written, and a plain number still means hours
    limit = {feasible(t) for t in ("0.25", "0.25h", "15m", "0h15m", "900s")}
    assert len(limit) == 1 and limit.pop() < feasible()
    assert feasible("2d") == feasible("48")


# -- infeasible plans say which changes would give one (each tried) ---------------------------


def _apply(argv: list[str], flags: dict[str, str | None]) -> list[str]:
    out = list(argv)
    for flag, value in flags.items():
        if flag == "MODEL":
            out[1] = str(value)
        elif flag in out:
            i = out.index(flag)
            del out[i : i + 2]
            if value is not None:
                out[i:i] = [flag, value]
        elif value is not None:
            out += [flag, value]
    return out


@pytest.mark.parametrize(
    "argv",
    [
        # nothing fits a small local GPU, whose weights alone overflow it (no memory
        # technique is tried): a leaner method, a smaller model
        ["plan", "HuggingFaceTB/SmolLM2-1.7B", "--tokens", "2M", "--epochs", "1",
         "--methods", "full", "--optimizers", "adamw", "--seq", "4096",
         "--local", "RTX 4050 Laptop", "--providers", "local"],
        # the deadline is too short: the fastest plan's hours
        ["plan", "HuggingFaceTB/SmolLM2-135M", "--tokens", "50M", "--deadline", "5m"],
        # the budget is too small: the cheapest plan's cost
        ["plan", "HuggingFaceTB/SmolLM2-135M", "--tokens", "50M", "--budget", "0.01"],
    ],
)  # fmt: skip
@pytest.mark.slow
def test_every_suggested_change_gives_a_plan(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    from frugal.hardware.catalog import select_offers
    from frugal.plan.plans import Infeasible
    from frugal.plan.relax import Ask, suggest

    msg = run_error(capsys, *argv)
    assert msg.count("\n") == 0 and "these would give a plan: " in msg, msg
    # the same suggestions, structured, and each applied to the command line
    rc = main([*argv, "--json"])
    assert rc == 2
    capsys.readouterr()
    spec = load_spec(argv[1])
    args = dict(zip(argv[2::2], argv[3::2], strict=True))
    local = [args["--local"]] if "--local" in args else []
    offers = select_offers((), (), local, providers_csv=args.get("--providers"))
    methods = tuple(args.get("--methods", "lora").split(","))
    optimizers = tuple(args.get("--optimizers", "adamw,adamw-8bit").split(","))
    k = Constraints(tokens=float(args["--tokens"].rstrip("M")) * 1e6, methods=methods,
                    optimizers=optimizers,
                    deadline_h=1 / 12 if "--deadline" in args else None,
                    budget_usd=float(args["--budget"]) if "--budget" in args else None)  # fmt: skip
    base = make_job(method=methods[0], seq=int(args.get("--seq", "2048")))
    with pytest.raises(Infeasible) as info:
        search(spec, base, offers, k)
    every = select_offers((), (), local) if "--providers" in args else None
    found = suggest(info.value, Ask(spec, base, offers, k), every)
    assert found
    for s in found:
        assert s.text in msg
        out = run_json(capsys, *_apply(argv, s.flags), "--json")
        assert out["recommendation"]["est_cost_usd"] == pytest.approx(s.plan.cost_usd, abs=0.01)


@pytest.mark.slow
def test_without_checkpointing_is_not_simulated_where_checkpointing_does_not_fit(
    tiny_llama: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Turning checkpointing off never needs less memory (checked on the tiny model for each
    method), so a set-up that does not fit with it is not simulated without it."""
    import frugal.plan.fit as s
    from frugal.estimate.core import estimate

    for method in ("full", "lora", "qlora"):
        on, off = (
            estimate(tiny_llama, make_job(method=method, seq=256, grad_checkpointing=c))
            for c in (True, False)
        )
        assert off.memory.device_total >= on.memory.device_total, method
    seen: list[bool] = []
    real = s.get_profile
    monkeypatch.setattr(
        s,
        "get_profile",
        lambda spec, job, seq, why="": (
            seen.append(job.grad_checkpointing) or real(spec, job, seq, why)
        ),
    )
    k = Constraints(tokens=1e6, methods=("full",), optimizers=("adamw",), **PLAIN)
    laptop = [o for o in catalog(local=["RTX 4050 Laptop"], bundled=False)]
    with pytest.raises(FrugalError, match="nothing fits"):
        search(load_spec("Qwen/Qwen2.5-1.5B"), make_job(method="full"), laptop, k)
    assert seen and not any(c is False for c in seen)


def test_the_paged_8bit_optimizer_shares_the_8bit_profile() -> None:
    paged = make_job(method="full", optimizer="paged-adamw-8bit").profile_key()
    assert paged == make_job(method="full", optimizer="adamw-8bit").profile_key()
    assert paged != make_job(method="full", optimizer="adamw").profile_key()


def test_an_instance_sold_in_several_regions_is_rejected_once(tiny_llama: ModelSpec) -> None:
    """The same instance in five regions fails for the same reason five times: the rejected
    list names it once, so that the five lines it shows are five different options."""
    offers = catalog()
    many = [o for o in offers if o.gpu.name == "T4" and o.gpus == 1]
    regions = {o.instance: 0 for o in many}
    for o in many:
        regions[o.instance] += 1
    assert max(regions.values()) > 1  # the catalog sells a T4 instance in several regions
    r = search(tiny_llama, make_job(seq=128), offers, Constraints(tokens=1e7, effective_batch=12))
    lines = [(x.label, x.why) for x in r.rejected]
    assert lines and len(lines) == len(set(lines))


def test_multi_node_plans_say_the_network_and_need_one() -> None:
    """A multi-node plan names the bandwidth between its nodes and whose figure it is; a
    provider with no multi-node network frugal knows of (Lambda's terms say 0) gets plans on
    one node only, unless --network-gbps vouches for one."""
    spec = load_spec("meta-llama/Llama-3.1-70B")
    k = {"tokens": 2e8, "deadline_h": 2.5}
    lam = [o for o in catalog() if o.provider == "lambda"]
    assert lam and all(o.terms.node_network_gbps == 0 for o in lam)
    with pytest.raises(FrugalError, match="deadline"):
        search(spec, make_job(), lam, Constraints(**k))  # one 8-GPU node is too slow
    vouched = search(spec, make_job(), lam, Constraints(**k, network_gbps=3200))
    best = vouched.recommendation
    assert best.nodes > 1
    line = next(r for r in best.reasons if "between nodes" in r)
    assert "3,200 Gbit/s between nodes (--network-gbps)" in line
    aws = search(spec, make_job(), [o for o in catalog() if o.provider == "aws"], Constraints(**k))
    line = next(r for r in aws.recommendation.reasons if "between nodes" in r)
    assert "400 Gbit/s between nodes (aws's, providers.csv)" in line


def test_every_plan_carries_its_range_priced_as_the_plan_is(tiny_llama: ModelSpec) -> None:
    """The hours and dollars of a plan at the slowest and the fastest speed expected: the
    same pricing (set-up, spot interruptions and fallback) at the ends of the speed's
    range, so the point lies inside and the ends move as the speed does."""
    r = search(tiny_llama, make_job(seq=128), catalog(), Constraints(tokens=1e8, **PLAIN))
    for p in r.plans[:50]:
        sp = p.speed
        lo, hi = sp.tokens_per_s_range
        assert lo < sp.tokens_per_s < hi
        assert p.hours_range[0] < p.hours < p.hours_range[1]
        assert p.cost_range[0] < p.cost_usd < p.cost_range[1]
        if not p.spot:  # on demand the hours of work scale with 1 / tokens/s; set-up does not
            work = p.hours - p.setup_h
            assert p.hours_range[1] - p.setup_h == pytest.approx(work * sp.tokens_per_s / lo)
            assert p.hours_range[0] - p.setup_h == pytest.approx(work * sp.tokens_per_s / hi)
    j = r.recommendation.to_json()
    assert j["est_cost_usd_range"][0] <= j["est_cost_usd"] <= j["est_cost_usd_range"][1]
    assert j["est_hours_range"][0] <= j["est_hours"] <= j["est_hours_range"][1]
    assert j["bound"] in ("compute", "memory", "communication", "launch")
    assert j["host_share"] > 0 and j["tokens_per_s_range"][0] < j["tokens_per_s"]


def test_a_launch_bound_step_is_said_and_a_larger_micro_batch_preferred(
    tiny_llama: ModelSpec,
) -> None:
    """A tiny model's step is launch-bound on any datacenter GPU (the host dispatches its
    ops slower than the GPU runs them): the plan takes the largest micro-batch that fits,
    which holds fewer dispatches per token, and says the bound."""
    r = search(tiny_llama, make_job(seq=128), catalog(), Constraints(tokens=1e8, **PLAIN))
    best = r.recommendation
    assert best.speed.bound == "launch" and best.speed.host_share > 0.5
    said = [x for x in best.reasons if x.startswith("launch-bound")]
    assert len(said) == 1 and f"{best.speed.host_share:.0%} of the step" in said[0]
    # the same step one sequence at a time dispatches as many ops for fewer tokens
    from frugal.estimate.throughput import step_time

    one = best.job.model_copy(
        update={"batch": 1, "grad_accum": best.job.batch * best.job.grad_accum}
    )
    assert best.job.batch > 1
    slow = step_time(best.profile, one, best.offer.gpu)  # type: ignore[arg-type]
    assert slow is not None and slow.tokens_per_s < best.speed.tokens_per_s
