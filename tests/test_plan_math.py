"""Spot and checkpoint maths, and the throughput model's shape."""

from __future__ import annotations

import math

import pytest

from frugal.errors import FrugalError
from frugal.estimate.core import get_profile
from frugal.estimate.throughput import step_time
from frugal.hardware.gpus import find_gpu
from frugal.hardware.offers import ADVISED, Offer
from frugal.models.specs import ModelSpec
from frugal.plan import spot
from frugal.step.job import make_job


@pytest.mark.parametrize(("mtbi_min", "expected"), [(24 * 60, 116.7), (6 * 60, 56.7), (15, 9.1)])
def test_daly_worked_examples(mtbi_min: float, expected: float) -> None:
    assert round(spot.daly_interval(5, mtbi_min), 1) == expected


def test_young_and_daly_limits() -> None:
    assert spot.young_interval(5, 24 * 60) == pytest.approx(math.sqrt(2 * 5 * 24 * 60))
    assert spot.daly_interval(50, 20) == 20  # delta >= 2M: checkpoint every M


def test_expected_wall_prices_in_interruptions() -> None:
    solve = 10.0
    calm = spot.spot_run(solve, 0.01, 0.1, 10_000)
    stormy = spot.spot_run(solve, 0.01, 0.1, 5)
    assert solve < calm.hours < stormy.hours
    assert stormy.interruptions > calm.interruptions
    # no interruptions at all: only checkpoint writes are added
    assert spot.expected_wall(solve, 1.0, 0.0, 0.0, 1e12) == pytest.approx(solve, rel=1e-6)


def test_fallback_meets_the_deadline_exactly() -> None:
    fb = spot.fallback(spot_wall_h=30, ondemand_h=10, deadline_h=20)
    assert fb is not None
    assert fb.hours == pytest.approx(20)
    assert 0 < fb.spot_share < 1
    # the work left after the switch takes exactly the on-demand time that remains
    assert (1 - fb.spot_share) * 10 == pytest.approx(20 - fb.switch_at_h)
    assert spot.fallback(30, 25, 20) is None  # on-demand misses too
    assert spot.fallback(15, 10, 20).spot_share == 1.0  # type: ignore[union-attr]


def test_buckets() -> None:
    assert spot.mtbi_hours("<5%") > spot.mtbi_hours("10-15%") > spot.mtbi_hours(">20%")
    with pytest.raises(FrugalError, match="bucket"):
        spot.mtbi_hours("often")


def _aws(instance: str, bucket: str, source: str = f"catalog; {ADVISED}") -> Offer:
    return Offer("aws", instance, find_gpu("T4"), 1, 0.526, 0.21, "us-east-1", bucket, source)


def test_an_8_hour_spot_run_on_a_busy_gpu_expects_interruptions() -> None:
    """The >20% bucket read as a monthly probability gave 0.00 expected interruptions for 8 h
    of T4 spot; the GPU traces measure one every few hours held."""
    mtbi, why = spot.offer_mtbi(_aws("g4dn.xlarge", ">20%"))
    run = spot.spot_run(8.0, 0.05, 0.1, mtbi)
    assert 2 < run.interruptions < 6 and 2 < mtbi < 3
    assert "Spot Advisor's >20% for g4dn.xlarge in us-east-1" in why and "measured" in why
    # the scale is the measured rate: >20% is the median held p3.2xlarge zone trace
    held = spot.measured()[("aws", "p3.2xlarge")]
    assert 1 / spot.mtbi_hours(">20%") == pytest.approx(held.rate_per_h)
    assert spot.mtbi_hours("<5%") == pytest.approx(12 * spot.mtbi_hours(">20%"))


def test_a_traced_instance_type_uses_its_measured_rate() -> None:
    mtbi, why = spot.offer_mtbi(_aws("p3.16xlarge", ">20%"))
    assert mtbi == pytest.approx(1 / 1.0882) and "668 interruptions in 614 h" in why
    default = spot.offer_mtbi(
        Offer("runpod", "x", find_gpu("T4"), 1, 0.4, 0.2, "US", ">20%", "catalog")
    )
    assert "runpod publishes no rate: >20% assumed" in default[1]
    unlisted = spot.offer_mtbi(_aws("g6e.2xlarge", ">20%", source="catalog"))
    assert "no Spot Advisor figure for g6e.2xlarge in us-east-1" in unlisted[1]


def _speed(spec: ModelSpec, gpu: str = "A100 80GB", **kw: object) -> float:
    job = make_job(**kw)
    s = step_time(get_profile(spec, job, job.seq), job, find_gpu(gpu))
    assert s is not None
    return s.tokens_per_s


def test_throughput_shape(tiny_llama: ModelSpec) -> None:
    small = _speed(tiny_llama, batch=1, seq=64)
    big = _speed(tiny_llama, batch=8, seq=64)
    assert big > small  # bigger micro-steps use the GPU better
    assert _speed(tiny_llama, method="qlora", batch=4, seq=64) < _speed(
        tiny_llama, method="lora", batch=4, seq=64
    )  # dequantization costs time
    # a small step is launch-bound: the host's dispatch sets its pace on any GPU; a large
    # one is the GPU's
    small_h100 = _speed(tiny_llama, "H100 SXM", batch=4, seq=64)
    assert small_h100 == _speed(tiny_llama, "L4", batch=4, seq=64)
    assert _speed(tiny_llama, "H100 SXM", batch=256, seq=2048) > 2 * _speed(
        tiny_llama, "L4", batch=256, seq=2048
    )
    nvlink = _speed(tiny_llama, "A100 80GB", method="full", gpus=4, sharding="fsdp", seq=64)
    pcie = _speed(tiny_llama, "L40S", method="full", gpus=4, sharding="fsdp", seq=64)
    assert nvlink >= pcie  # a tiny model's exchange hides behind its step
    from frugal.estimate.throughput import SpeedConstants, comm_seconds

    job = make_job(method="full", gpus=4, sharding="fsdp")
    gb = 16e9  # an 8B model's bf16 weights
    on = [
        comm_seconds(gb, gb, job, find_gpu(g), 4, 0.0, SpeedConstants())
        for g in ("A100 80GB", "L40S")
    ]
    assert 0 < 10 * on[0] < on[1]  # NVLink, then PCIe through the host


def test_no_bf16_gpu_has_no_bf16_speed(tiny_llama: ModelSpec) -> None:
    job = make_job(seq=64)
    assert step_time(get_profile(tiny_llama, job, 64), job, find_gpu("T4")) is None
