"""Prices a user can trust: `frugal offers update` downloads real catalog files (served here
by a loopback server from recorded files, tests/data/catalogs), the snapshot is installed
whole and the old one kept, every answer says which prices it used and how old they are,
and suspicious rows stay out of plans."""

from __future__ import annotations

import csv
import functools
import http.server
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import run_error, run_json

from frugal.cli.main import main
from frugal.hardware import offers as offers_mod
from frugal.hardware.catalog import select_offers
from frugal.hardware.gpus import lookup_gpu
from frugal.hardware.offers import Offer, base, bundled
from frugal.hardware.price_files import parse_skypilot
from frugal.hardware.refresh import SKYPILOT_FILES
from frugal.hardware.sanity import error, errors, findings
from frugal.hardware.snapshot import header, offers_dir

CATALOGS = Path(__file__).parent / "data" / "catalogs"
SERVED = sorted(p.parent.name for p in CATALOGS.glob("v*/*/vms.csv"))
SERVE = ("--rate", "5", "--input-len", "1000", "--output-len", "200")
PLAN = ("plan", "meta-llama/Llama-3.1-8B", "--tokens", "20M", "--methods", "qlora", "--json")


@pytest.fixture
def own_offers_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's price cache: an update here is never seen by another test."""
    d = tmp_path / "offers"
    monkeypatch.setenv("FRUGAL_OFFERS_DIR", str(d))
    return d


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def catalog_server(own_offers_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """SkyPilot's catalogs/ directory, served from recorded files on a loopback port."""
    handler = functools.partial(_Quiet, directory=str(CATALOGS))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("FRUGAL_SKYPILOT_URL", url)
    monkeypatch.setenv("FRUGAL_SPOT_ADVISOR_URL", f"{url}/spot-advisor-data.json")
    yield url
    server.shutdown()
    server.server_close()


def _closed_port() -> str:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: a connection is refused at once
    return f"http://127.0.0.1:{port}"


def test_the_recorded_catalogs_are_real_files_of_every_provider_the_update_reads() -> None:
    assert set(SERVED) == set(SKYPILOT_FILES), "record a catalog file for every provider"
    for name, rel in SKYPILOT_FILES.items():
        text = (CATALOGS / rel).read_text()
        assert text.startswith("InstanceType,"), name  # SkyPilot's own header, as published
    sources = (CATALOGS / "SOURCES.md").read_text()
    for rel in SKYPILOT_FILES.values():
        assert rel in sources  # where each was recorded from, with the commit


def test_update_writes_every_served_provider_and_keeps_the_old_snapshot(
    catalog_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first = run_json(capsys, "offers", "update", "--json")
    got = {p["provider"]: p for p in first["providers"]}
    assert set(got) == set(SKYPILOT_FILES)
    assert all(p["offers"] > 0 and p["from"].startswith(catalog_server) for p in got.values())
    current = offers_dir() / "offers.csv"
    before = current.read_text()
    rows = list(csv.DictReader(ln for ln in before.splitlines() if not ln.startswith("#")))
    assert {r["provider"] for r in rows} == {*SKYPILOT_FILES, "modal"}  # Modal's: kept
    fresh = [r for r in rows if r["provider"] != "modal"]
    assert all(r["source"].startswith("SkyPilot catalog v") and r["retrieved"] for r in fresh)
    # the plans price from it now, and say so
    listed = run_json(capsys, "offers", "--json")
    assert listed["prices"]["snapshot"] == "offers update"
    assert listed["prices"]["path"] == str(current)
    # the refreshed providers' prices are new; Modal's kept rows keep their own (older) date,
    # so freshness is judged on what the update wrote
    refreshed = run_json(capsys, "offers", "--providers", ",".join(SKYPILOT_FILES), "--json")
    assert refreshed["prices"]["stale"] is False and refreshed["prices"]["age_days"] < 1
    # a second update: the first is kept beside it, whole
    run_json(capsys, "offers", "update", "--json")
    assert (offers_dir() / "offers.previous.csv").read_text() == before


def test_update_of_some_providers_keeps_the_others_rows(
    catalog_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    done = run_json(capsys, "offers", "update", "--providers", "lambda,aws", "--json")
    assert [p["provider"] for p in done["providers"]] == ["lambda", "aws"]
    snap = base()
    assert {o.provider for o in snap.offers} >= {o.provider for o in bundled().offers} - {"local"}
    kept = [o for o in snap.offers if o.provider == "runpod"]
    assert kept == [o for o in bundled().offers if o.provider == "runpod"]  # untouched
    assert done["kept_from_before"] == len([o for o in snap.offers if o.provider not in
                                            ("lambda", "aws")])  # fmt: skip


def test_no_network_is_one_line_and_plans_keep_their_prices(
    own_offers_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FRUGAL_SKYPILOT_URL", _closed_port())
    msg = run_error(capsys, "offers", "update")
    assert msg.startswith("error: cannot download http://127.0.0.1:") and "\n" not in msg.strip()
    assert not (own_offers_dir / "offers.csv").exists()  # nothing half-written
    plan = run_json(capsys, *PLAN)
    assert plan["prices"]["snapshot"] == "bundled catalog"


def test_a_provider_the_server_lacks_stops_the_update_before_anything_is_written(
    catalog_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    run_json(capsys, "offers", "update", "--providers", "lambda", "--json")
    before = (offers_dir() / "offers.csv").read_text()
    mirror = tmp_path / "mirror"
    (mirror / "v8" / "aws").mkdir(parents=True)
    (mirror / "v8" / "aws" / "vms.csv").write_text((CATALOGS / SKYPILOT_FILES["aws"]).read_text())
    msg = run_error(capsys, "offers", "update", "--source", str(mirror))
    assert "gcp" in msg and "cannot read" in msg
    assert (offers_dir() / "offers.csv").read_text() == before


def test_a_directory_mirror_and_a_single_file_are_sources_too(
    own_offers_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = run_json(capsys, "offers", "update", "--source", str(CATALOGS), "--json")
    assert {p["provider"] for p in done["providers"]} == set(SKYPILOT_FILES)
    own = tmp_path / "mine.csv"
    own.write_text(
        "provider,instance,gpu,gpus,ondemand_usd_h,spot_usd_h,region\n"
        "lambda,gpu_1x_h100_sxm5,H100 SXM,1,2.10,,us-east-1\n"
    )
    before = (offers_dir() / "offers.csv").read_text()
    # one Lambda offer where the last update holds several: refused unless forced
    msg = run_error(capsys, "offers", "update", "--source", str(own))
    assert "lambda has 1 offers, down from" in msg and "--force" in msg
    assert (offers_dir() / "offers.csv").read_text() == before
    # a file whose every price is an error replaces nothing
    zero = tmp_path / "zero.csv"
    zero.write_text(own.read_text().replace(",2.10,", ",0,"))
    msg = run_error(capsys, "offers", "update", "--source", str(zero), "--force")
    assert "every lambda offer's price is an error (on-demand priced at $0" in msg
    assert (offers_dir() / "offers.csv").read_text() == before
    done = run_json(capsys, "offers", "update", "--source", str(own), "--force", "--json")
    assert [p["offers"] for p in done["providers"]] == [1]
    assert [o.ondemand_usd_h for o in base().offers if o.provider == "lambda"] == [2.10]


def test_a_gpu_without_specs_is_reported_never_guessed() -> None:
    text = (
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,SpotPrice\n"
        "x1,H100,1,26,200,2.49,us-east-1,\n"
        "x2,Quantum-9000,1,8,64,0.99,us-east-1,\n"
        "x3,Quantum-9000,2,16,128,1.98,us-east-1,\n"
        "x4,H100,0.5,8,64,1.20,us-east-1,\n"
        "x5,H100,1,8,64,,us-east-1,\n"
    )
    got = parse_skypilot(text, "vms.csv", "lambda")
    assert [o.instance for o in got.offers] == ["x1"]
    assert dict(got.unknown) == {"Quantum-9000": 2}
    assert (got.no_price, got.fractional) == (1, 1)
    assert "Quantum-9000 (2)" in got.summary()


def test_one_offer_per_region_at_its_cheapest_zone() -> None:
    text = (
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,"
        "AvailabilityZone,SpotPrice\n"
        "g5.xlarge,A10G,1,4,16,1.006,us-east-1,use1-az1,0.45\n"
        "g5.xlarge,A10G,1,4,16,1.006,us-east-1,use1-az2,0.39\n"
        "g5.xlarge,A10G,1,4,16,1.006,us-east-1,use1-az4,\n"
        "g5.xlarge,A10G,1,4,16,1.006,us-west-2,usw2-az1,0.00\n"
    )
    got = {o.region: o for o in parse_skypilot(text, "aws/vms.csv", "aws").offers}
    assert (got["us-east-1"].spot_usd_h, got["us-east-1"].zone) == (0.39, "use1-az2")
    assert got["us-west-2"].spot_usd_h is None  # 0.00 is the catalog's "no spot", not free
    assert got["us-east-1"].vcpus == 4 and got["us-east-1"].memory_gib == 16


# -- age and provenance ---------------------------------------------------------------------


def _snapshot(days_old: float, rows: list[Offer] | None = None) -> None:
    from frugal.hardware.offers import offers_csv
    from frugal.hardware.snapshot import install

    when = datetime.now(UTC) - timedelta(days=days_old)
    chosen = rows if rows is not None else list(bundled().offers)
    stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    text = offers_csv([o.__class__(**{**o.__dict__, "retrieved": stamp}) for o in chosen])
    install(header(when, "test") + text)


def test_old_prices_make_every_priced_answer_warn_and_name_the_update(
    own_offers_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _snapshot(days_old=10)
    assert main(list(PLAN)) == 0
    out, err = capsys.readouterr()
    prices = json.loads(out)["prices"]
    assert prices["stale"] is True and 9.9 < prices["age_days"] < 10.1
    assert prices["snapshot"] == "offers update" and prices["max_age_days"] == 7
    assert "warning: the prices are 10.0 days old" in err and "frugal offers update" in err
    assert main(["plan", *PLAN[1:-1]]) == 0
    out, err = capsys.readouterr()
    assert "prices: offers update of" in out and "10.0 days old" in out
    assert "frugal offers update" in err


def test_the_age_limit_is_a_setting(
    own_offers_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    _snapshot(days_old=10)
    settings = tmp_path / "settings.toml"
    settings.write_text("[offers]\nmax_age_days = 30\n")
    monkeypatch.setenv("FRUGAL_SETTINGS", str(settings))
    assert main(list(PLAN)) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["prices"]["stale"] is False and "warning" not in err
    settings.write_text("[offers]\nmax_age_days = -1\n")
    assert "max_age_days" in run_error(capsys, *PLAN)


def test_a_damaged_snapshot_is_passed_over_for_the_one_before(
    own_offers_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _snapshot(days_old=1)
    _snapshot(days_old=0.5)  # the first is now the previous
    (own_offers_dir / "offers.csv").write_bytes(b"\x00garbage")
    assert main(["offers", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "cannot be read" in err and "passed over" in err
    assert json.loads(out)["prices"]["path"] == str(own_offers_dir / "offers.previous.csv")


# -- your own offers ------------------------------------------------------------------------


def test_your_offers_file_replaces_and_adds_rows_from_the_flag_or_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "negotiated.csv"
    mine.write_text(
        "provider,instance,gpu,gpus,ondemand_usd_h,spot_usd_h,region,source\n"
        "aws,p5.48xlarge,H100 SXM,8,30.00,,us-east-1,our 2026 EDP rate\n"
        "local,rack-3,H100 SXM,8,9.50,,dc-1,on-prem: power + amortization\n"
    )
    for argv, env in (([f"--offers={mine}"], None), ([], f'[offers]\nfiles = ["{mine}"]\n')):
        if env:
            (tmp_path / "settings.toml").write_text(env)
            monkeypatch.setenv("FRUGAL_SETTINGS", str(tmp_path / "settings.toml"))
        got = run_json(capsys, "offers", "--gpu", "H100 SXM", "--providers", "aws,local",
                       *argv, "--json")  # fmt: skip
        p5 = [o for o in got["offers"] if o["instance"] == "p5.48xlarge"]
        assert {o["region"]: o["ondemand_usd_h"] for o in p5}["us-east-1"] == 30.0
        assert any(o["instance"] == "rack-3" for o in got["offers"])
        assert str(mine) in got["prices"]["files"]
    (tmp_path / "settings.toml").write_text('[offers]\nfiles = "mine.csv"\n')
    assert "[offers] files" in run_error(capsys, "offers")


# -- sanity ---------------------------------------------------------------------------------


def _offer(gpu: str, od: float, spot: float | None = None, n: int = 1, name: str = "",
           provider: str = "aws") -> Offer:  # fmt: skip
    g = lookup_gpu(gpu)
    assert g is not None
    return Offer(provider, name or f"{gpu}-{od}-{spot}", g, n, od, spot, "r", ">20%", "test")


def test_price_errors_are_zero_spot_above_on_demand_or_a_gpu_count_the_name_contradicts() -> None:
    rows = [
        _offer("H100 SXM", 2.5, provider="lambda"),
        _offer("H100 SXM", 0.0, name="zero"),
        _offer("H100 SXM", 2.0, 2.6, name="spot-above"),
        _offer("T4", 0.5, 0.0, name="free-spot"),
        _offer("A100 80GB", 1.1, name="gpu_8x_a100_80gb_sxm4", provider="lambda"),  # 1 of 8
        _offer("A100 80GB", 8.8, n=8, name="gpu_8x_a100_80gb_sxm4", provider="lambda"),
        _offer("H100 SXM", 4.0, n=2, name="H100:2", provider="modal"),
        _offer("H100 SXM", 4.0, name="H100:2.", provider="modal"),  # no count in the name
    ]
    why = {(o.instance, o.gpus): error(o) for o in rows if error(o)}
    assert len(errors(rows)) == len(why)  # by offer key
    assert set(why) == {("zero", 1), ("spot-above", 1), ("free-spot", 1),
                        ("gpu_8x_a100_80gb_sxm4", 1)}  # fmt: skip
    assert "$0" in why["zero", 1] and "above on-demand" in why["spot-above", 1]
    assert why["gpu_8x_a100_80gb_sxm4", 1] == "listed with 1 GPUs, but the instance's name says 8"


def test_a_price_far_from_its_peers_is_a_finding_judged_per_provider() -> None:
    rows = [
        _offer("H100 SXM", 2.5, provider="lambda"),
        _offer("H100 SXM", 3.0, 1.5, provider="runpod"),
        _offer("H100 SXM", 24.0, n=8, name="8x", provider="nebius"),  # 3.0/GPU: fine
        *(_offer("H100 SXM", 2.0, name=f"lambda-{i}", provider="lambda") for i in range(30)),
        _offer("H100 SXM", 0.01, name="penny", provider="vast"),
        _offer("H100 SXM", 11.0, name="dear", provider="gcp"),
        _offer("H100 SXM", 2.0, name="aws-1"),
        _offer("H100 SXM", 0.0, name="zero"),  # an error: not a finding, nor a vote
    ]
    why = {k[1]: v for k, v in findings(rows).items()}
    assert set(why) == {"penny", "dear"}
    assert "below the median" in why["penny"] and "above the median" in why["dear"]
    # thirty listings of one provider are one vote: the median of the six providers' medians
    # (0.01, 2, 2, 3, 3, 11) is 2.5, where the median of the offers would be lambda's 2.0
    assert "median of 6 providers' H100 SXM on-demand prices ($2.500)" in why["dear"]


def test_the_bundled_catalog_holds_no_price_error() -> None:
    assert bundled().errors == {}


def test_a_finding_is_planned_with_and_said_an_error_is_left_out(
    own_offers_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cheap is not suspicious: a price far below its peers' stays in plans (a plan that
    takes it says so); a price that is an error does not (--include-suspicious keeps it)."""
    rows = list(bundled().offers)
    h100 = next(o for o in rows if o.gpu.name == "H100 SXM" and o.gpus == 1)
    cheap = h100.__class__(**{**h100.__dict__, "instance": "too-good", "ondemand_usd_h": 0.05,
                              "spot_usd_h": None})  # fmt: skip
    free = h100.__class__(**{**h100.__dict__, "instance": "free", "ondemand_usd_h": 0.0})
    _snapshot(days_old=0, rows=[*rows, cheap, free])
    listed = run_json(capsys, "offers", "--suspicious", "--json")
    got = {o["instance"]: o for o in listed["offers"]}
    assert set(got) == {"too-good", "free"}
    assert "below the median" in got["too-good"]["suspicious"] and not got["too-good"]["left_out"]
    assert "$0" in got["free"]["suspicious"] and got["free"]["left_out"]
    everything = run_json(capsys, "offers", "--json")
    shown = {o["instance"] for o in everything["offers"]}
    assert "too-good" in shown and "free" not in shown
    assert everything["prices"]["suspicious_left_out"] == 1
    assert "free" in {o.instance for o in select_offers(include_suspicious=True)}
    plan = run_json(capsys, *PLAN)
    assert plan["recommendation"]["instance"] == "too-good"
    (note,) = [n for n in plan["notes"] if n.startswith("price finding:")]
    assert f"{h100.provider} too-good in {h100.region}" in note and "below the median" in note
    text = run_json(capsys, "offers", "--suspicious", "--json")  # the same rows, as rows
    assert text["offers"] == listed["offers"]


def test_prices_say_where_they_came_from_in_every_priced_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (
        ["offers", "--json"],
        list(PLAN),
        ["serve", "plan", "meta-llama/Llama-3.1-8B", *SERVE, "--json"],
        [
            "serve",
            "estimate",
            "meta-llama/Llama-3.1-8B",
            "--gpu",
            "L4",
            "--concurrency",
            "8",
            *SERVE[2:],
            "--json",
        ],
        ["tco", "meta-llama/Llama-3.1-8B", *SERVE, "--json"],
    ):
        got = run_json(capsys, *argv)
        assert got["prices"]["snapshot"] == "bundled catalog", argv
        assert got["prices"]["retrieved"].startswith("20"), argv


def test_the_bundled_snapshot_header_is_read() -> None:
    b = offers_mod.bundled()
    assert b.snapshot.label == "bundled catalog" and b.snapshot.path is None
    assert all(o.retrieved for o in b.offers)


# -- the bundled catalog's builder, the Spot Advisor, AMD GPUs ------------------------------


def test_the_bundle_builder_normalizes_every_recorded_file_like_the_update(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from frugal.hardware import bundle
    from frugal.hardware.offers import modal_offers, parse_offers

    commits = [f"--commit={c}=0123456789abcdef" for c in SKYPILOT_FILES]
    advisor = str(CATALOGS / "spot-advisor-data.json")
    assert bundle.main([str(CATALOGS), *commits, "--advisor", advisor,
                        "--retrieved", "2026-11-25"]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    rows = parse_offers(out, "built.csv")
    # every provider's rows, Hyperbolic's three H100s at $1.29 among them: 3x below this
    # small sample's median is a finding, named on stderr and kept; price errors are left out
    assert {o.provider for o in rows} == set(SKYPILOT_FILES)
    assert "kept, a finding: hyperbolic" in err
    assert not errors(rows + modal_offers("2026-11-25"))
    assert all("@0123456" in o.source and o.retrieved == "2026-11-25" for o in rows)
    advised = [o for o in rows if o.advised]
    assert advised and all(o.provider == "aws" and o.spot_usd_h for o in advised)
    assert f"{len(rows)} offers of {len({o.provider for o in rows})} providers" in err


def test_the_spot_advisor_feed_is_read_in_its_real_format() -> None:
    from frugal.errors import FrugalError
    from frugal.hardware.refresh import parse_advisor

    got = parse_advisor((CATALOGS / "spot-advisor-data.json").read_text(), "advisor.json")
    assert got[("p3.2xlarge", "us-east-1")] == ">20%"  # as the feed's ranges label index 4
    assert set(got.values()) <= {"<5%", "5-10%", "10-15%", "15-20%", ">20%"}
    with pytest.raises(FrugalError, match="not AWS Spot Instance Advisor data"):
        parse_advisor('{"ranges": []}', "x.json")


def test_amd_gpus_are_planned_for_what_the_trainer_runs_on_them(tiny_llama_dir: Path) -> None:
    from frugal.models.specs import load_spec
    from frugal.plan.constraints import Constraints
    from frugal.plan.search import search
    from frugal.step.job import make_job

    mi300x = [o for o in bundled().offers if o.gpu.name == "MI300X"]
    assert mi300x
    spec = load_spec(str(tiny_llama_dir / "config.json"))
    k = Constraints(tokens=1e6, methods=("qlora", "lora"))
    result = search(spec, make_job(method="qlora", seq=128), mi300x, k)
    assert {p.job.method for p in result.plans} == {"lora"}
    why = [r.why for r in result.rejected if r.kind == "method"]
    assert why and "QLoRA needs bitsandbytes' CUDA kernels" in why[0]


def test_gpuhunt_catalogs_are_a_source_too(
    own_offers_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """dstack's gpuhunt reads its v3 layout (a version file, then a zip of the provider's
    CSV) from a loopback server holding recorded AWS rows."""
    pytest.importorskip("gpuhunt")
    import zipfile

    root = tmp_path / "v3" / "aws"
    (root / "20230829-1").mkdir(parents=True)
    (root / "version").write_text("20230829-1\n")
    with zipfile.ZipFile(root / "20230829-1" / "catalog.zip", "w") as z:
        z.write(CATALOGS / "gpuhunt" / "aws.csv", "aws.csv")
    handler = functools.partial(_Quiet, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v3"
        monkeypatch.setenv("GPUHUNT_CATALOG_URL", url)
        rc = main(["offers", "update", "--source", "gpuhunt", "--providers", "aws", "--json"])
        out, err = capsys.readouterr()
        assert rc == 0 and "Traceback" not in err, err  # its other providers 404: not noise
        done = json.loads(out)
    finally:
        server.shutdown()
        server.server_close()
    monkeypatch.setenv("GPUHUNT_CATALOG_URL", _closed_port() + "/v3")
    before = (offers_dir() / "offers.csv").read_text()
    msg = run_error(capsys, "offers", "update", "--source", "gpuhunt", "--providers", "aws")
    assert msg.startswith("error: cannot read gpuhunt's catalogs from http://127.0.0.1:")
    assert (offers_dir() / "offers.csv").read_text() == before
    assert [p["provider"] for p in done["providers"]] == ["aws"]
    aws = [o for o in base().offers if o.provider == "aws"]
    assert aws and all(o.source == "gpuhunt catalog aws (dstack)" for o in aws)
    p4d = next(o for o in aws if (o.instance, o.region) == ("p4d.24xlarge", "us-east-1"))
    assert (p4d.gpu.name, p4d.gpus, p4d.ondemand_usd_h) == ("A100 40GB", 8, 32.7726)
    # gpuhunt names the 80 GB A100 by its memory: frugal's A100 80GB
    assert any(o.gpu.name == "A100 80GB" for o in aws)


class _CutOff(http.server.BaseHTTPRequestHandler):
    """Serves the recorded catalog file asked for, then closes the connection halfway
    through it: announced whole (Content-Length) or in chunks never finished."""

    chunked = False

    def do_GET(self) -> None:
        path = CATALOGS / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        body = path.read_bytes()
        self.send_response(200)
        if self.chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            half = body[: len(body) // 2]
            self.wfile.write(f"{len(body):x}\r\n".encode() + half)  # a chunk, cut short
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) * 3 // 5])
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_download_cut_off_installs_nothing(
    chunked: bool, catalog_server: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The server closes the connection partway through AWS's catalog: one line saying so,
    and the prices in use stay as they were (the partial catalog held 1 of 3 instances)."""
    run_json(capsys, "offers", "update", "--providers", "aws", "--json")
    before = (offers_dir() / "offers.csv").read_text()
    handler = type("Cut", (_CutOff,), {"chunked": chunked})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("FRUGAL_SKYPILOT_URL", f"http://127.0.0.1:{server.server_address[1]}")
        msg = run_error(capsys, "offers", "update", "--providers", "aws")
    finally:
        server.shutdown()
        server.server_close()
    assert "was cut off" in msg and "v8/aws/vms.csv" in msg and "\n" not in msg.strip()
    assert (offers_dir() / "offers.csv").read_text() == before


def _renamed_gpus(text: str, name: str) -> str:
    """A SkyPilot catalog whose every GPU is `name`."""
    import io

    rows = list(csv.DictReader(io.StringIO(text)))
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows([r | {"AcceleratorName": name} if r["AcceleratorName"] else r for r in rows])
    return out.getvalue()


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda t: t.replace(",Price,", ",Cost,", 1), "without its Price column"),
        (
            lambda t: _renamed_gpus(t, "Quasar9"),
            "GPUs without specs in gpus.csv, left out: Quasar9",
        ),
    ],
    ids=["no-price-column", "unknown-gpus"],
)
def test_a_catalog_frugal_cannot_use_says_why_and_names_the_provider(
    edit: object, words: str, own_offers_dir: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    mirror = tmp_path / "mirror" / "v8" / "aws"
    mirror.mkdir(parents=True)
    text = (CATALOGS / SKYPILOT_FILES["aws"]).read_text()
    (mirror / "vms.csv").write_text(edit(text))  # type: ignore[operator]
    msg = run_error(capsys, "offers", "update", "--source", str(tmp_path / "mirror"),
                    "--providers", "aws")  # fmt: skip
    assert words in msg and "\n" not in msg.strip()
    if "Price" not in words:
        assert "is it the aws catalog?" in msg
    assert not (own_offers_dir / "offers.csv").exists()
