"""The op table the simulation records (class, FLOPs, bytes, views of every op) and the step
time built from it (`frugal.estimate.optime`): each op on its GPU's roofline, the host's
dispatch, the longer of the two per part of the step, any depth from two."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import TINY_LLAMA
from torch._subclasses.fake_tensor import FakeTensorMode

from frugal.estimate.categories import OP_CLASS, OP_CLASSES
from frugal.estimate.optime import (
    Depths,
    OpSpeedConstants,
    OpTable,
    StepOps,
    op_seconds,
    step_seconds,
)
from frugal.estimate.simulate import simulate
from frugal.estimate.tracker import StepTracker, tracking
from frugal.hardware.gpus import find_gpu
from frugal.step import marks
from frugal.step.job import make_job


def test_an_op_is_entered_with_its_class_flops_bytes_and_the_views_before_it() -> None:
    tr = StepTracker(vocab_size=512)
    with FakeTensorMode(), tracking(tr):
        a = torch.empty(64, 128, dtype=torch.bfloat16)
        b = torch.empty(128, 32, dtype=torch.bfloat16)
        c = a @ b.t().t()  # two views dispatched before the product
        d = torch.relu(c)
        d.sum()
        with marks.temporaries():  # a 4-bit weight unpacked: dequantization
            a.clone()
            torch.empty(64, 128, dtype=torch.bfloat16)  # the stand-in's dequantize_4bit
        marks.phase("opt")
        d.mul_(2.0)
    ops = tr.op_table()
    kinds = [OP_CLASSES[int(k)] for k in ops.kind[1:]]
    assert kinds == [
        "alloc",
        "alloc",
        "matmul",
        "elementwise",
        "reduction",
        "dequant",
        "dequant",
        "optimizer",
    ]
    assert not ops.cost(np.arange(1, 3)).any()  # an empty tensor is the allocator's: no kernel
    assert ops.flops[3] == 2 * 64 * 128 * 32  # torch's own FLOP formula
    assert ops.nbytes[3] == 2 * (64 * 128 + 128 * 32 + 64 * 32)  # both inputs and the result
    assert ops.views[3] == 2  # the transposes: views the host dispatches too
    assert ops.nbytes[4] == 2 * 2 * 64 * 32  # relu reads c and writes d
    assert ops.nbytes[7] == 2 * 64 * 128 * 5 // 4  # writes 16-bit values, reads 4-bit codes
    assert ops.nbytes[8] == 2 * 2 * 64 * 32  # in place: reads d and writes it back


@pytest.fixture(scope="module")
def traces() -> dict[str, list]:
    """A tiny Llama's step at two depths, for LoRA and QLoRA, accumulating two micro-steps."""
    out = {}
    for method in ("lora", "qlora"):
        job = make_job(method=method, precision="bf16-mixed", batch=1, seq=64, grad_accum=2)
        out[method] = [simulate(TINY_LLAMA, job, n, [(1, 64)])[0] for n in (1, 2)]
    return out


def test_the_op_table_holds_every_flop_the_step_counts_and_only_the_updates_ops_in_opt(
    traces: dict[str, list],
) -> None:
    for method, (t1, t2) in traces.items():
        for t in (t1, t2):
            first = (t.micro == 1) & (t.segments != "opt")
            counted = sum(t.flops.values()) + sum(t.attn_flops.values())
            assert t.ops.flops[first].sum() == counted, method  # micro-step 1's, all of them
            opt = t.segments == "opt"
            second = (t.micro == 2) & ~opt
            assert not t.ops.cost(second).any()  # the second repeats the first
            assert (t.ops.kind[opt] == OP_CLASS["optimizer"]).all()
            assert (t.ops.kind[~opt] != OP_CLASS["optimizer"]).all()
        dequant = (t2.ops.kind == OP_CLASS["dequant"]).sum()
        assert (dequant > 0) == (method == "qlora")


def test_a_table_merges_identical_ops_and_counts_the_hosts_dispatches_per_part(
    traces: dict[str, list],
) -> None:
    t1, t2 = traces["lora"]
    table = OpTable.from_trace(t2.ops, t2.segments, t2.micro)
    kept = (t2.segments != "setup") & ((t2.micro == 1) | (t2.segments == "opt"))
    kept[0] = False
    assert table.count.sum() == kept.sum() == table.host_ops.sum()
    assert len(table.count) < kept.sum()  # identical ops (the layers' own) merged
    assert table.flops @ table.count == t2.ops.flops[kept].sum()  # no FLOP lost
    assert table.host_views.sum() == t2.ops.views[kept].sum()
    # a second layer adds ops to the forward and backward, none to the update's count
    one = OpTable.from_trace(t1.ops, t1.segments, t1.micro)
    assert (table.host_ops[:2] > one.host_ops[:2]).all()


def test_an_op_takes_the_longer_of_its_flops_and_bytes_and_at_least_a_kernel() -> None:
    c = OpSpeedConstants(matmul_eff=0.5, matmul_half_flop=0.0, elementwise_bw_eff=0.5,
                         kernel_floor_s=1e-6)  # fmt: skip
    kind = np.array([OP_CLASS["matmul"], OP_CLASS["elementwise"], OP_CLASS["elementwise"]])
    flops = np.array([1e12, 0.0, 0.0])
    nbytes = np.array([1e6, 1e9, 10.0])
    t = op_seconds(kind, flops, nbytes, 1e15, 1e12, 1e11, c)
    assert t == pytest.approx([1e12 / 5e14, 1e9 / 5e11, 1e-6])
    # a small product reaches less of the peak: half of it at matmul_half_flop
    half = replace(c, matmul_half_flop=1e12)
    assert op_seconds(kind[:1], flops[:1], nbytes[:1], 1e15, 1e12, 1e11, half) == (
        pytest.approx(2 * t[0])
    )


def test_a_step_is_the_longer_of_gpu_and_host_per_part_and_any_depth_is_the_line(
    traces: dict[str, list],
) -> None:
    t1, t2 = traces["lora"]
    tables = (OpTable.from_trace(t.ops, t.segments, t.micro) for t in (t1, t2))
    ops = StepOps(*tables, Depths(1, 2))
    h200 = find_gpu("H200")
    peak = h200.peak_tflops("bf16") * 1e12
    c = OpSpeedConstants()
    g1, h1 = ops.parts(1, h200, peak, c)
    g2, h2 = ops.parts(2, h200, peak, c)
    g5, h5 = ops.parts(5, h200, peak, c)
    assert g5 == pytest.approx(g1 + 4 * (g2 - g1)) and h5 == pytest.approx(h1 + 4 * (h2 - h1))
    # a tiny model on an H200: the host's dispatch holds the step (launch-bound)
    fast = step_seconds(ops, 5, h200, peak, accum=4, c=c)
    assert fast.bound == "host" and fast.host_s > fast.gpu_s
    micro = max(g5[0], h5[0]) + max(g5[1], h5[1])
    assert fast.seconds == pytest.approx(4 * micro + max(g5[2], h5[2]) + c.step_fixed_s)
    # a host ten times as fast leaves the GPU's work to set the pace
    quick = step_seconds(ops, 5, h200, peak, accum=4, c=c, host=0.01)
    assert quick.bound == "gpu" and quick.seconds < fast.seconds
    assert quick.seconds >= quick.gpu_s + c.step_fixed_s - 1e-12


def test_the_fit_reads_every_loans_rows_as_the_jobs_that_ran() -> None:
    """benchmarks/speed_fit.py: each configuration of frugal's GPU rows, every loan's
    measurement of it, and the job it ran (micro-batch, accumulation, settings of its id)."""
    from conftest import load_benchmark

    fit = load_benchmark("speed_fit")
    rows = fit._own_rows()
    loans = {loan for r in rows.values() for loan in r["measured"]}
    assert len(loans) == len(list(fit.DATA.glob("gpu_truth-*.csv"))) >= 3
    for id_, r in rows.items():
        job = fit._own_job(r)
        assert (job.batch, job.grad_accum) == (int(r["micro_batch"]), int(r["grad_accum"]))
        assert job.packing == (not id_.endswith("-padded"))
        assert ("-ckpt-" in id_) == job.grad_checkpointing
    assert fit.not_fitted("C3-1.8b-f-256") and not fit.not_fitted("C3-1.8b-l-256")


@pytest.mark.parametrize("method", ["lora", "qlora", "full"])
def test_a_profiles_op_table_at_any_shape_is_the_one_traced_at_that_shape(method: str) -> None:
    """The plan times a step from its profile (three short runs at batch 1); a run traced at
    the step's own micro-batch and length gives the same ops, FLOPs, bytes and dispatches."""
    from frugal.estimate.profile import LayerFit, features, grid

    job = make_job(method=method, precision="bf16-mixed", batch=1, seq=64)
    shapes = grid(32)
    fit = LayerFit.from_traces(2, shapes, simulate(TINY_LLAMA, job, 2, shapes))

    for b, s in ((1, 32), (3, 80), (2, 256)):
        t = simulate(TINY_LLAMA, job.model_copy(update={"batch": b, "seq": s}), 2, [(b, s)])[0]
        direct = OpTable.from_trace(t.ops, t.segments, t.micro)
        fitted = fit.op_table(features(b, s))
        np.testing.assert_array_equal(fitted.host_ops, direct.host_ops)
        np.testing.assert_array_equal(fitted.host_views, direct.host_views)
        # FLOPs exactly; bytes exactly at batch 1, above it the few sizes that grow with the
        # length alone (the positions) are counted per row, as memory counts them
        for col, rtol in (("flops", 1e-9), ("nbytes", 1e-9 if b == 1 else 3e-3)):  # per part, class
            want = np.zeros((3, len(OP_CLASSES)))
            got = np.zeros_like(want)
            for table, out in ((direct, want), (fitted, got)):
                where = (table.part.astype(int), table.kind.astype(int))
                np.add.at(out, where, getattr(table, col) * table.count)
            np.testing.assert_allclose(got, want, rtol=rtol, err_msg=f"{method} {b}x{s} {col}")
        h200 = find_gpu("H200")
        c, peak = OpSpeedConstants(), h200.peak_tflops("bf16") * 1e12
        want_s = direct.gpu_seconds(h200, peak, c)
        assert fitted.gpu_seconds(h200, peak, c) == pytest.approx(want_s, rel=3e-3)


def test_the_plans_step_time_is_the_op_model_with_its_bound_and_range(tiny_llama_dir) -> None:
    """`throughput.step_time` (what the plan prices) times the profile's op table with the
    op model: a tiny model's short step is launch-bound and its range spans the hosts
    seen; a long one is the GPU's, and its range is the model's own spread."""
    from frugal.estimate.core import get_profile
    from frugal.estimate.throughput import SpeedConstants, step_time
    from frugal.models.specs import load_spec

    spec = load_spec(str(tiny_llama_dir / "config.json"))
    h200, c = find_gpu("H200"), SpeedConstants()
    short = make_job(method="lora", batch=1, seq=64)
    prof = get_profile(spec, short, 64)
    s = step_time(prof, short, h200, c=c)
    assert s is not None and s.bound == "launch" and s.host_share > 0.5
    peak = h200.peak_tflops("bf16") * 1e12
    own = step_seconds(prof.step_ops(1, 64), prof.n_layers, h200, peak, 1, c)
    assert s.step_time_s == pytest.approx(own.seconds)  # the op model, nothing added
    figures = (s.step_time_s, s.tokens_per_s, s.efficiency, s.host_share, *s.tokens_per_s_range)
    assert all(type(v) is float for v in figures)  # numpy's scalars break comparisons downstream
    lo, hi = s.tokens_per_s_range  # the same step on the slowest and the fastest hosts seen
    for end, host, spread in ((lo, c.host_slow, c.spread_lo), (hi, c.host_fast, c.spread_hi)):
        on = step_seconds(prof.step_ops(1, 64), prof.n_layers, h200, peak, 1, c, host=host)
        assert end == pytest.approx(64 / on.seconds * spread)
    assert hi / lo > 1.5 * c.spread_hi / c.spread_lo  # the host's spread dominates
    long = make_job(method="lora", batch=512, seq=4096)
    g = step_time(get_profile(spec, long, 4096), long, h200, c=c)
    assert g is not None and g.bound in ("compute", "memory") and g.host_share < 0.5
    lo, hi = g.tokens_per_s_range
    assert lo / g.tokens_per_s == pytest.approx(c.spread_lo, rel=0.02)
    assert hi / g.tokens_per_s == pytest.approx(c.spread_hi, rel=0.02)
