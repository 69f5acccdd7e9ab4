"""How estimates move with shapes and settings, and that a profile reproduces a direct run.

A profile is fitted on 1-2 layer runs at two or three short lengths; evaluated at the model's
full depth and another (batch, seq), it must give what simulating that step directly gives.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TINY_LLAMA, write_config

from frugal.estimate import core
from frugal.estimate.categories import CATEGORIES, DEVICE, PHASES
from frugal.estimate.core import base_length, estimate, get_profile, memory_at
from frugal.estimate.overheads import MIB, Overheads
from frugal.estimate.simulate import simulate
from frugal.models.specs import ModelSpec, load_spec
from frugal.step.job import TrainJob, make_job
from frugal.step.model import build_model, count_params
from frugal.step.qlora import packed_bytes

TINY_GEMMA2 = {
    **TINY_LLAMA,
    "model_type": "gemma2",
    "head_dim": 16,
    "sliding_window": 32,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "query_pre_attn_scalar": 16,
}

TINY_MOE = {
    **TINY_LLAMA,
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "head_dim": 16,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}


@pytest.fixture(scope="module")
def tiny_gemma2(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    return load_spec(str(write_config(tmp_path_factory.mktemp("gemma2"), TINY_GEMMA2)))


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    return load_spec(str(write_config(tmp_path_factory.mktemp("moe"), TINY_MOE)))


# -- (a) monotone in batch and sequence length --------------------------------------------


def test_memory_grows_with_batch(tiny_llama: ModelSpec) -> None:
    peaks = [
        estimate(tiny_llama, make_job(batch=b, seq=128)).memory.peak_allocated for b in (1, 2, 4)
    ]
    assert peaks[0] < peaks[1] < peaks[2]


def test_memory_grows_with_seq(tiny_llama: ModelSpec) -> None:
    peaks = [estimate(tiny_llama, make_job(seq=s)).memory.peak_allocated for s in (128, 256, 512)]
    assert peaks[0] < peaks[1] < peaks[2]


def test_flops_and_tokens_scale_with_batch(tiny_llama: ModelSpec) -> None:
    one = estimate(tiny_llama, make_job(batch=1, seq=128))
    two = estimate(tiny_llama, make_job(batch=2, seq=128, grad_accum=1))
    assert two.tokens_per_step == 2 * one.tokens_per_step == 256
    assert two.flops_per_step["total"] == pytest.approx(2 * one.flops_per_step["total"], rel=1e-9)
    f = one.flops_per_step
    assert f["total"] == pytest.approx(f["forward"] + f["backward"] + f["recompute"], rel=1e-12)
    # backward of a matmul is two matmuls; checkpointing recomputes the layers' forward
    assert 1.5 * f["forward"] < f["backward"] < 2.5 * f["forward"]
    assert 0 < f["recompute"] <= f["forward"]


@pytest.mark.slow
def test_an_accumulating_run_also_gives_the_single_micro_step_profile(
    tiny_llama: ModelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import frugal.estimate.simulate as sim

    accum = make_job(method="full", seq=128, grad_accum=4)
    single = accum.model_copy(update={"grad_accum": 1})
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path / "both"))
    two = get_profile(tiny_llama, accum, 128)
    with monkeypatch.context() as m:  # the single-step profile comes from that one run
        m.setattr(sim, "simulate", lambda *a, **k: pytest.fail("simulated again"))
        derived = get_profile(tiny_llama, single, 128)
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path / "direct"))
    direct = get_profile(tiny_llama, single, 128)
    grads = CATEGORIES.index("gradients")
    for b, s in ((1, 128), (3, 200)):
        np.testing.assert_allclose(derived.segment_peaks(b, s), direct.segment_peaks(b, s))
        assert derived.flops(b, s) == direct.flops(b, s)
        # accumulating, the forward pass runs with the last micro-step's gradients alive
        assert derived.segment_peaks(b, s)[0, grads] == 0
        assert two.segment_peaks(b, s)[0, grads] > 0


def test_a_lora_rank_comes_from_two_others_without_simulating(
    tiny_llama: ModelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every LoRA size is linear in the rank and no op depends on it, so two cached ranks
    give any other exactly (a rank sweep simulates two). QLoRA: LoRA's path and the 4-bit
    base's; rank 32 from 4 and 8, eight times the step between them."""
    import frugal.estimate.simulate as sim

    def job(r: int) -> TrainJob:
        return make_job(method="qlora", seq=128, lora_r=r)

    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path / "sweep"))
    get_profile(tiny_llama, job(4), 128)
    get_profile(tiny_llama, job(8), 128)
    with monkeypatch.context() as m:
        m.setattr(sim, "simulate", lambda *a, **k: pytest.fail("simulated again"))
        got = get_profile(tiny_llama, job(32), 128)
    monkeypatch.setenv("FRUGAL_CACHE_DIR", str(tmp_path / "direct"))
    direct = get_profile(tiny_llama, job(32), 128)
    assert got.trainable_params == direct.trainable_params
    for b, s in ((1, 128), (3, 200)):
        np.testing.assert_allclose(got.segment_peaks(b, s), direct.segment_peaks(b, s))
        assert got.flops(b, s) == pytest.approx(direct.flops(b, s), rel=1e-12)


# -- (b) activation checkpointing ---------------------------------------------------------


@pytest.mark.slow
def test_checkpointing_saves_activations(tiny_llama: ModelSpec) -> None:
    on = estimate(tiny_llama, make_job(method="full", batch=2, seq=256, grad_checkpointing=True))
    off = estimate(tiny_llama, make_job(method="full", batch=2, seq=256, grad_checkpointing=False))
    assert off.memory.breakdown["activations"] > on.memory.breakdown["activations"]
    assert off.memory.peak_allocated > on.memory.peak_allocated
    # nothing is recomputed without checkpointing
    assert off.flops_per_step["recompute"] == 0
    assert on.flops_per_step["recompute"] > 0
    # the same parameters and state either way
    for k in ("frozen_weights", "trainable_weights"):
        assert off.memory.breakdown[k] == pytest.approx(on.memory.breakdown[k], rel=1e-9)


# -- (c) QLoRA keeps the base model in 4 bits ---------------------------------------------


@pytest.mark.slow
def test_qlora_frozen_weights_are_a_quarter() -> None:
    spec = load_spec("meta-llama/Llama-3.1-8B")
    lora = estimate(spec, make_job(method="lora")).memory.breakdown["frozen_weights"]
    qlora = estimate(spec, make_job(method="qlora")).memory.breakdown["frozen_weights"]
    emb_bytes = spec.vocab_size * spec.hidden_size * 2  # embedding and LM head stay bf16
    ratio = (qlora - 2 * emb_bytes) / (lora - 2 * emb_bytes)
    assert 0.24 < ratio < 0.30

    # and exactly: LoRA's frozen base is the bf16 model; QLoRA's is bitsandbytes' layout
    h, kv, f, n = 4096, 1024, 14336, spec.num_layers
    linears = [(h, h), (h, kv), (h, kv), (h, h), (h, f), (h, f), (f, h)]
    norms = 2 * (2 * h * n + h)  # two RMSNorms per layer and the final one, bf16
    expect_q = n * sum(packed_bytes(i * o) for i, o in linears) + 2 * emb_bytes + norms
    assert lora == pytest.approx(2 * 8030261248, abs=4096)  # + rotary inv_freq buffers
    assert qlora == pytest.approx(expect_q, abs=4096)


@pytest.mark.slow
def test_old_bitsandbytes_keeps_each_4bit_input(tiny_llama: ModelSpec) -> None:
    """Before 0.43.2, bitsandbytes held each 4-bit layer's input on the autograd context: the
    forward keeps it (what LitGPT's QLoRA rows measured), and since checkpointing only frees
    saved tensors, it keeps every layer's inputs even with checkpointing on."""
    h, f, n, t = 64, 128, 4, 2 * 256  # TINY_LLAMA: hidden, MLP, layers; tokens

    def acts(version: str, ckpt: bool) -> float:
        job = make_job(
            method="qlora", batch=2, seq=256, grad_checkpointing=ckpt, bitsandbytes=version
        )
        return estimate(tiny_llama, job).memory.breakdown["activations"]

    assert acts("0.41.1", ckpt=False) > acts("0.45.0", ckpt=False)
    kept = acts("0.43.1", ckpt=True) - acts("0.43.2", ckpt=True)
    # per layer, in bf16: the attention input (q, k, v share it), o_proj's input, the MLP's
    # (gate and up share it) and down_proj's
    assert kept == n * (3 * h + f) * t * 2


def test_bitsandbytes_version_default_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    import frugal.step.job as jobmod
    from frugal.errors import FrugalError

    monkeypatch.setattr(jobmod, "installed_version", lambda pkg: "0.42.0")
    assert make_job(method="qlora").keeps_4bit_input  # the installed bitsandbytes decides
    assert not make_job(method="qlora", bitsandbytes="0.44.1").keeps_4bit_input
    assert not make_job(method="lora").keeps_4bit_input  # no 4-bit layers at all
    monkeypatch.setattr(jobmod, "installed_version", lambda pkg: None)
    assert not make_job(method="qlora").keeps_4bit_input  # not installed: the current one
    # the profile depends on the behaviour, not on the version string
    key = make_job(method="qlora", bitsandbytes="0.45.0").profile_key()
    assert key == make_job(method="qlora", bitsandbytes="0.48.2").profile_key()
    with pytest.raises(FrugalError, match="--bitsandbytes 'new' is not a version"):
        make_job(method="qlora", bitsandbytes="new")


# -- (d) the profile reproduces a direct simulation ---------------------------------------


@cache
def _compare(
    config_json: str, method: str, attention: str, shapes: tuple[tuple[int, int], ...]
) -> list[dict[str, Any]]:
    """For each shape: the profile's prediction and a direct full-depth simulation."""
    config = json.loads(config_json)
    spec = ModelSpec(id="t", config=config, origin="test")
    job = make_job(method=method, attention=attention)  # batch and seq are not in a profile
    traces = simulate(config, job, spec.num_layers, list(shapes))
    out = []
    for (b, s), trace in zip(shapes, traces, strict=True):
        prof = get_profile(spec, job, s)
        direct_flops = {p: trace.flops[p] + trace.attn_flops[p] for p in PHASES}
        out.append(
            {
                "profile": prof,
                "pred": float(prof.segment_peaks(b, s).sum(axis=1).max()),
                "direct": float(trace.live.sum(axis=1).max()),
                "pred_flops": prof.flops(b, s),
                "direct_flops": direct_flops,
                "total_params": trace.total_params,
                "trainable_params": trace.trainable_params,
            }
        )
    return out


def _key(spec: ModelSpec) -> str:
    return json.dumps(spec.config, sort_keys=True)


CASES = [("full", "sdpa"), ("lora", "sdpa"), ("qlora", "sdpa"), ("full", "eager")]
SHAPES = ((3, 200), (1, 200))


def _check_close(r: dict[str, Any], batch: int) -> None:
    rel = r["pred"] / r["direct"] - 1
    if batch == 1:
        # every size is a polynomial in b·s (and b·s²) at batch 1: the fit is exact
        assert abs(rel) < 1e-6, f"profile {r['pred']:.0f} vs direct {r['direct']:.0f} ({rel:+.4%})"
    else:
        # per-sequence tensors (rotary tables, position ids) are fitted as if they grew with
        # b·s: a little conservative above batch 1, never below
        assert -0.001 <= rel <= 0.01, f"profile vs direct: {rel:+.4%}"
    for p in PHASES:
        assert r["pred_flops"][p] == pytest.approx(r["direct_flops"][p], rel=5e-3, abs=1), p
    assert sum(r["pred_flops"].values()) == pytest.approx(sum(r["direct_flops"].values()), rel=5e-3)
    prof = r["profile"]
    assert (prof.total_params, prof.trainable_params) == (r["total_params"], r["trainable_params"])


@pytest.mark.parametrize(("method", "attention"), CASES)
@pytest.mark.slow
def test_profile_matches_direct_simulation(
    tiny_llama: ModelSpec, method: str, attention: str
) -> None:
    job = make_job(method=method, attention=attention, batch=3, seq=200)
    r = _compare(_key(tiny_llama), method, attention, SHAPES)[0]
    _check_close(r, batch=3)
    # memory_at reports that peak plus the modelled workspace
    ov = Overheads()
    mem = memory_at(r["profile"], job, 3, 200, ov)
    assert sum(mem.breakdown[CATEGORIES[i]] for i in DEVICE) == pytest.approx(r["pred"], rel=1e-12)
    expect_alloc = r["pred"] * (1 + ov.kernel_slack) + ov.cublas_workspace_mib * MIB
    assert mem.peak_allocated == pytest.approx(expect_alloc, rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(("method", "attention"), CASES)
def test_profile_exact_at_batch_one(tiny_llama: ModelSpec, method: str, attention: str) -> None:
    _check_close(_compare(_key(tiny_llama), method, attention, SHAPES)[1], batch=1)


def test_profile_exact_at_long_seq(tiny_llama: ModelSpec) -> None:
    """Far outside the fitted lengths (64, 128) the linear fit must still be exact."""
    _check_close(_compare(_key(tiny_llama), "lora", "sdpa", ((1, 480),))[0], batch=1)


# -- (e) sliding-window attention ---------------------------------------------------------


@pytest.mark.parametrize("seq", [100, 24])  # beyond the 32-token window, and within it
@pytest.mark.slow
def test_sliding_window_profile_matches_direct(tiny_gemma2: ModelSpec, seq: int) -> None:
    # the simulated lengths stay on the side of the window that `seq` is on
    assert base_length(tiny_gemma2, seq) == (32 + 64 if seq > 32 else 32 // 3)
    (r,) = _compare(_key(tiny_gemma2), "lora", "sdpa", ((1, seq),))
    _check_close(r, batch=1)


def test_base_length_of_dense_model(tiny_llama: ModelSpec) -> None:
    assert base_length(tiny_llama, 4096) == base_length(tiny_llama, 16) == 64


# -- (f) mixture of experts ---------------------------------------------------------------


@pytest.mark.slow
def test_moe_lora_estimate(tiny_moe: ModelSpec) -> None:
    job = make_job(method="lora", seq=128)
    est = estimate(tiny_moe, job)
    total_full, _ = count_params(
        build_model(tiny_moe.config, make_job(method="full"), "meta", n_layers=4)
    )
    _, trainable = count_params(build_model(tiny_moe.config, job, "meta", n_layers=4))
    assert est.trainable_params > 0
    assert est.trainable_params == trainable
    assert est.total_params == total_full
    assert est.trainable_params < est.total_params
    assert est.memory.peak_allocated > 0
    assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= set(est.lora_targets)


@pytest.mark.slow
def test_moe_full_finetune(tiny_moe: ModelSpec) -> None:
    est = estimate(tiny_moe, make_job(method="full", seq=128))
    total, trainable = count_params(
        build_model(tiny_moe.config, make_job(method="full"), "meta", n_layers=4)
    )
    assert est.total_params == total == trainable == est.trainable_params
    # fp32 master weights, gradients and two AdamW moments
    b = est.memory.breakdown
    assert b["trainable_weights"] >= 4 * total
    assert b["optimizer_state"] >= 8 * total


@pytest.mark.slow
def test_moe_full_finetune_bf16_true(tiny_moe: ModelSpec) -> None:
    est = estimate(tiny_moe, make_job(method="full", precision="bf16-true", seq=128))
    total, _ = count_params(
        build_model(tiny_moe.config, make_job(method="full"), "meta", n_layers=4)
    )
    assert est.total_params == est.trainable_params == total


def test_profile_is_reused_from_cache(
    tiny_llama: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job(method="lora", seq=128)
    first = get_profile(tiny_llama, job, 128)

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("simulated again despite a cached profile")

    import frugal.estimate.simulate as sim

    monkeypatch.setattr(sim, "simulate", boom)
    again = get_profile(tiny_llama, make_job(method="lora", seq=999, batch=7, gpus=2), 999)
    assert again.n_layers == first.n_layers == 4
    assert np.array_equal(again.segment_peaks(2, 300), first.segment_peaks(2, 300))
    # the cache is the test session's private dir, never the user's
    d = core.cache.cache_dir()
    assert d == Path(os.environ["FRUGAL_CACHE_DIR"]) / "profiles"
    assert any(d.glob("*.npz"))


MAKE_ONE = """
import sys, time
import frugal.estimate.simulate as sim
from frugal.estimate.core import get_profile
from frugal.models.specs import load_spec
from frugal.step.job import make_job
real = sim.simulate
def slow(*a, **k):
    print("simulated", flush=True)
    time.sleep(2)  # long enough for the other process to be waiting
    return real(*a, **k)
sim.simulate = slow
get_profile(load_spec(sys.argv[1]), make_job(method="full", seq=96), 96)
"""


@pytest.mark.slow
def test_two_processes_simulate_one_profile_once(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """Two plans at once (or two test workers) wanting the same profile: one simulates it,
    the other waits for it and loads it."""
    import subprocess
    import sys

    env = {**os.environ, "FRUGAL_CACHE_DIR": str(tmp_path)}
    cmd = [sys.executable, "-c", MAKE_ONE, str(tiny_llama_dir / "config.json")]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert sum(o.count("simulated") for o in outs) == 2  # two depths, in one process


def test_sharded_estimates_say_how_far_to_trust_them(tiny_llama: ModelSpec) -> None:
    fsdp = estimate(tiny_llama, make_job(gpus=2, sharding="fsdp", seq=128))
    assert any("6-25% above" in n for n in fsdp.notes)
    ddp = estimate(tiny_llama, make_job(gpus=2, sharding="ddp", seq=128))
    assert not any("6-25% above" in n for n in ddp.notes)
