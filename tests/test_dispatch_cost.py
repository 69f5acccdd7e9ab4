"""benchmarks/dispatch_cost.py: a layer's dispatch cost on the CPU, the recompute counted."""

from __future__ import annotations

from conftest import TINY, load_benchmark

dc = load_benchmark("dispatch_cost")


def test_checkpointing_dispatches_the_recompute_too() -> None:
    on = dc.measure(str(TINY), "lora", 1, checkpointing=True)
    off = dc.measure(str(TINY), "lora", 1, checkpointing=False)
    assert on["layers"] == off["layers"] > 0
    # the recompute is a second forward: about half as many ops again
    assert 1.3 < on["ops"] / off["ops"] < 1.8
    assert on["us_per_op"] > 0 and on["step_ms"] > 0  # times: a loaded machine's, not compared
