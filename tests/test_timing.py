"""Spot-price timing: reading price histories, the step lookup and the best start window."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from frugal.errors import FrugalError
from frugal.plan.timing import PricePoint, best_start, price_at, read_price_history

DAY_USD_H, DIP_USD_H = 10.0, 4.0  # the night dip, 02:00-06:00 UTC, at 40% of the day price
START = datetime(2026, 11, 14, tzinfo=UTC)  # seven days of history, 14 to 20 November
NOW = datetime(2026, 11, 20, 18, tzinfo=UTC)
OFFER = ("aws", "p5.48xlarge", "us-east-1")
HEADER = "time,provider,instance,region,spot_usd_h\n"


def night_dip(days: int = 7, dips: tuple[range, ...] = (range(2, 6),)) -> list[PricePoint]:
    out = []
    for h in range(days * 24):
        t = START + timedelta(hours=h)
        cheap = any(t.hour in r for r in dips)
        out.append(PricePoint(t, *OFFER, DIP_USD_H if cheap else DAY_USD_H))
    return out


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def error(path: str) -> str:
    with pytest.raises(FrugalError) as e:
        read_price_history(path)
    msg = str(e.value)
    assert "\n" not in msg and path in msg
    return msg


# reading ---------------------------------------------------------------------------------------


def aws_entry(zone: str, price: str, ts: str, product: str = "Linux/UNIX") -> dict[str, str]:
    return {
        "AvailabilityZone": zone,
        "InstanceType": "p5.48xlarge",
        "ProductDescription": product,
        "SpotPrice": price,
        "Timestamp": ts,
    }


def test_reads_aws_json_keeping_linux_rows_per_zone(tmp_path: Path) -> None:
    rows = [  # newest first, as AWS lists them; both timestamp spellings AWS prints
        aws_entry("us-east-1b", "11.000000", "2026-11-20T04:00:00+00:00"),
        aws_entry("us-east-1a", "12.345600", "2026-11-20T03:00:00+00:00"),
        aws_entry("us-east-1a", "99.000000", "2026-11-20T02:00:00+00:00", "Windows"),
        aws_entry("us-east-1a", "13.000000", "2026-11-20T01:10:55.000Z", "Linux/UNIX (Amazon VPC)"),
    ]
    path = write(tmp_path, "spot.json", json.dumps({"SpotPriceHistory": rows, "NextToken": ""}))
    points = read_price_history(path)
    assert [p.usd_h for p in points] == [13.0, 12.3456, 11.0]  # sorted by time, Windows gone
    first = points[0]
    assert (first.provider, first.instance, first.region, first.zone) == (
        "aws",
        "p5.48xlarge",
        "us-east-1",
        "us-east-1a",
    )
    assert first.time == datetime(2026, 11, 20, 1, 10, 55, tzinfo=UTC)
    assert points[2].zone == "us-east-1b" and points[2].region == "us-east-1"


def test_reads_csv_with_naive_times_as_utc(tmp_path: Path) -> None:
    text = (
        "# spot prices we saved, November 2026\n"
        + HEADER
        + "2026-11-20T03:00:00,aws,p5.48xlarge,us-east-1,12.5\n"
        + "2026-11-20T02:00:00+02:00,AWS,p5.48xlarge,us-east-1,$14\n"
    )
    points = read_price_history(write(tmp_path, "spot.csv", text))
    assert [(p.time.hour, p.usd_h) for p in points] == [(0, 14.0), (3, 12.5)]
    assert all(p.time.tzinfo is not None and p.time.utcoffset() == timedelta(0) for p in points)
    assert points[0].provider == "aws" and points[0].zone == ""


def test_csv_errors_name_the_file_line_and_fix(tmp_path: Path) -> None:
    good = "2026-11-20T03:00:00Z,aws,p5.48xlarge,us-east-1,12.5\n"
    msg = error(write(tmp_path, "a.csv", HEADER + good + "yesterday,aws,p5.48xlarge,x,1\n"))
    assert ":3:" in msg and "'time'" in msg and "ISO 8601" in msg
    msg = error(write(tmp_path, "b.csv", HEADER + "2026-11-20T03:00Z,aws,p5.48xlarge,x,-2\n"))
    assert ":2:" in msg and "spot_usd_h" in msg and ">= 0" in msg
    msg = error(write(tmp_path, "c.csv", "time,provider,instance,region\n" + good[:-6] + "\n"))
    assert ":1:" in msg and "missing column(s) spot_usd_h" in msg
    msg = error(write(tmp_path, "d.csv", "2026-11-20T03:00Z,nimbus,p5,x,1\n".join([HEADER, ""])))
    assert ":2:" in msg and "unknown 'nimbus'" in msg
    assert ":1:" in error(write(tmp_path, "empty.csv", ""))
    assert ":2:" in error(write(tmp_path, "header-only.csv", "# note\n" + HEADER))


def test_aws_errors_name_the_entry(tmp_path: Path) -> None:
    ok = aws_entry("us-east-1a", "1.0", "2026-11-20T03:00:00+00:00")
    bad_time = aws_entry("us-east-1a", "1.0", "20/11/2026 03:00")
    msg = error(write(tmp_path, "t.json", json.dumps({"SpotPriceHistory": [ok, bad_time]})))
    assert "SpotPriceHistory[1]" in msg and "Timestamp" in msg
    negative = aws_entry("us-east-1a", "-1.0", "2026-11-20T03:00:00+00:00")
    msg = error(write(tmp_path, "n.json", json.dumps({"SpotPriceHistory": [negative]})))
    assert "SpotPriceHistory[0]" in msg and "SpotPrice" in msg and ">= 0" in msg
    no_price = {k: v for k, v in ok.items() if k != "SpotPrice"}
    msg = error(write(tmp_path, "m.json", json.dumps({"SpotPriceHistory": [no_price]})))
    assert "SpotPriceHistory[0]" in msg and "missing SpotPrice" in msg
    windows = aws_entry("us-east-1a", "1.0", "2026-11-20T03:00:00+00:00", "Windows")
    msg = error(write(tmp_path, "w.json", json.dumps({"SpotPriceHistory": [windows]})))
    assert "no Linux/UNIX" in msg and "Windows" in msg
    assert "no Linux/UNIX" in error(write(tmp_path, "e.json", '{"SpotPriceHistory": []}'))
    assert ":2:" in error(write(tmp_path, "bad.json", '{"SpotPriceHistory":\n ['))
    assert "SpotPriceHistory" in error(write(tmp_path, "other.json", '{"Reservations": []}'))


# the step function -------------------------------------------------------------------------------


def test_price_in_effect_is_the_last_change_at_or_before() -> None:
    t0 = datetime(2026, 11, 20, 3, tzinfo=UTC)
    history = [
        PricePoint(t0, *OFFER, 5.0),
        PricePoint(t0 + timedelta(hours=3), *OFFER, 7.0),
        PricePoint(t0, "aws", "p4d.24xlarge", "us-east-1", 1.0),  # another offer
    ]
    assert price_at(history, *OFFER, t0 - timedelta(seconds=1)) is None
    assert price_at(history, *OFFER, t0) == 5.0
    assert price_at(history, *OFFER, t0 + timedelta(hours=2, minutes=59)) == 5.0
    assert price_at(history, *OFFER, t0 + timedelta(hours=3)) == 7.0
    assert price_at(history, *OFFER, t0 + timedelta(days=30)) == 7.0
    assert price_at(history, "aws", "p5.48xlarge", "us-west-2", t0) is None


def test_cheapest_zone_of_the_region_each_hour() -> None:
    t0 = datetime(2026, 11, 20, 3, tzinfo=UTC)
    history = [
        PricePoint(t0, *OFFER, 10.0, zone="us-east-1a"),
        PricePoint(t0 + timedelta(hours=1), *OFFER, 6.0, zone="us-east-1b"),
        PricePoint(t0 + timedelta(hours=2), *OFFER, 3.0, zone="us-east-1a"),
    ]
    assert price_at(history, *OFFER, t0) == 10.0
    assert price_at(history, *OFFER, t0 + timedelta(hours=1)) == 6.0
    assert price_at(history, *OFFER, t0 + timedelta(hours=2)) == 3.0
    flat = [
        PricePoint(START, *OFFER, 9.0, "us-east-1a"),
        PricePoint(START, *OFFER, 7.0, "us-east-1b"),
    ]
    w = best_start([*flat, PricePoint(NOW, *OFFER, 9.0, "us-east-1a")], *OFFER, 2.0, 0.0, NOW)
    assert w is not None and w.now_usd == pytest.approx(14.0)


# the best start ----------------------------------------------------------------------------------


def test_waits_for_the_night_dip_when_the_slack_allows() -> None:
    w = best_start(night_dip(), *OFFER, run_h=3.0, slack_h=12.0, now=NOW)
    assert w is not None
    assert w.start_h == 8.0  # 02:00 UTC; 03:00 costs the same and ties go to the earliest
    assert w.expected_usd == pytest.approx(3 * DIP_USD_H)
    assert w.now_usd == pytest.approx(3 * DAY_USD_H)
    assert w.saving_usd == pytest.approx(w.now_usd - w.expected_usd) and w.saving_usd > 0
    assert w.slack_left_h == pytest.approx(4.0) and w.days >= 6
    assert "02:00 UTC" in w.reason and "$18.00" in w.reason
    j = w.to_json()
    assert {"start_h", "run_h", "expected_usd", "now_usd", "saving_usd", "p90_usd"} <= set(j)
    assert {"slack_left_h", "days", "reason"} <= set(j)
    json.dumps(j)


def test_no_waiting_without_the_slack() -> None:
    w = best_start(night_dip(), *OFFER, run_h=3.0, slack_h=2.0, now=NOW)
    assert w is not None and w.start_h == 0.0 and w.saving_usd == 0.0
    assert w.expected_usd == pytest.approx(3 * DAY_USD_H) and "start now" in w.reason
    for slack in (0.5, 0.0, -3.0):  # less than a step: never delayed
        w = best_start(night_dip(), *OFFER, run_h=3.0, slack_h=slack, now=NOW)
        assert w is not None and w.start_h == 0.0 and w.slack_left_h >= 0


def test_start_never_passes_the_slack() -> None:
    w = best_start(night_dip(), *OFFER, run_h=3.0, slack_h=7.5, now=NOW)  # the dip is at 8 h
    assert w is not None and w.start_h <= 7.5
    assert w.expected_usd == pytest.approx(DAY_USD_H + 2 * DIP_USD_H)  # 01:00-04:00


def test_history_read_from_a_file(tmp_path: Path) -> None:
    rows = "".join(
        f"{p.time.isoformat()},aws,p5.48xlarge,us-east-1,{p.usd_h}\n" for p in night_dip()
    )
    history = read_price_history(write(tmp_path, "spot.csv", HEADER + rows))
    w = best_start(history, *OFFER, run_h=3.0, slack_h=12.0, now=NOW)
    assert w is not None and w.start_h == 8.0


def test_partial_last_step() -> None:
    w = best_start(night_dip(), *OFFER, run_h=2.5, slack_h=12.0, now=NOW)
    assert w is not None and w.start_h == 8.0
    assert w.expected_usd == pytest.approx(2.5 * DIP_USD_H)
    assert w.now_usd == pytest.approx(2.5 * DAY_USD_H)


def test_job_longer_than_a_day() -> None:
    w = best_start(night_dip(), *OFFER, run_h=30.0, slack_h=12.0, now=NOW)
    assert w is not None
    # 30 h = one whole day (one dip) + 6 h; starting at 00:00 puts the dip in those 6 h too
    assert w.start_h == 6.0
    assert w.expected_usd == pytest.approx(22 * DAY_USD_H + 8 * DIP_USD_H)
    assert w.now_usd == pytest.approx(26 * DAY_USD_H + 4 * DIP_USD_H)


def test_ties_go_to_the_earliest() -> None:
    two_dips = night_dip(dips=(range(2, 6), range(10, 14)))  # 8 h and 16 h from now
    w = best_start(two_dips, *OFFER, run_h=3.0, slack_h=20.0, now=NOW)
    assert w is not None and w.start_h == 8.0
    flat = night_dip(dips=())
    w = best_start(flat, *OFFER, run_h=3.0, slack_h=20.0, now=NOW)
    assert w is not None and w.start_h == 0.0 and w.saving_usd == 0.0


def test_no_history_for_the_offer() -> None:
    assert best_start(night_dip(), "aws", "p4d.24xlarge", "us-east-1", 3.0, 12.0, NOW) is None
    assert best_start(night_dip(), "aws", "p5.48xlarge", "eu-west-1", 3.0, 12.0, NOW) is None
    assert best_start([], *OFFER, 3.0, 12.0, NOW) is None


def test_too_short_a_history_says_so() -> None:
    with pytest.raises(FrugalError, match="more than a day"):
        best_start(night_dip()[:6], *OFFER, run_h=3.0, slack_h=12.0, now=START)


def test_p90_prices_the_risk_of_a_noisy_history() -> None:
    rng = random.Random(17)
    noisy = [PricePoint(p.time, *OFFER, p.usd_h * rng.uniform(0.6, 1.6)) for p in night_dip(14)]
    w = best_start(noisy, *OFFER, run_h=3.0, slack_h=12.0, now=START + timedelta(days=13, hours=18))
    assert w is not None and w.days >= 13
    assert w.p90_usd >= w.expected_usd
    assert w.p90_usd > 1.1 * w.expected_usd  # the noise is wide: the risk is visible
    steady = best_start(night_dip(), *OFFER, run_h=3.0, slack_h=12.0, now=NOW)
    assert steady is not None and steady.p90_usd == pytest.approx(steady.expected_usd)
