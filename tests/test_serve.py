"""`frugal serve`: weights, KV cache, engine memory, speed under load, plans, and the CLI."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import load_benchmark, run_error, run_json

from frugal.errors import FrugalError
from frugal.hardware.catalog import select_offers
from frugal.hardware.gpus import GIB, find_gpu
from frugal.models.specs import ModelSpec, load_spec
from frugal.serve.engines import engines, find_engine
from frugal.serve.estimate import Deployment, estimate
from frugal.serve.kv import kv_layout
from frugal.serve.memory import kv_budget_gib
from frugal.serve.plan import ServeAsk, plan
from frugal.serve.speed import Load
from frugal.serve.weights import FORMATS, find_format, params, weight_bytes

LLAMA8 = "meta-llama/Llama-3.1-8B"


def deploy(model: str = LLAMA8, gpu: str = "H100", tp: int = 1, **kw: object) -> Deployment:
    quant = str(kw.pop("quant", "bf16"))
    engine = str(kw.pop("engine", "vllm"))
    return Deployment(
        load_spec(model), find_gpu(gpu), tp, find_engine(engine), find_format(quant), **kw
    )  # type: ignore[arg-type]


# ---- bytes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "per_token"),
    [(LLAMA8, 131_072), ("meta-llama/Llama-3.1-70B", 327_680), ("Qwen/Qwen2.5-7B", 57_344)],
)
def test_kv_bytes_per_token_pinned(model: str, per_token: int) -> None:
    # 2 x layers x KV heads x head_dim x 2 B (shared reference S6: 128 / 320 / 56 KiB)
    assert kv_layout(load_spec(model)).bytes_per_token == per_token
    assert kv_layout(load_spec(model), kv_bytes=1).bytes_per_token == per_token // 2  # fp8 KV


def test_sliding_window_layers_hold_window_plus_batch() -> None:
    mistral = kv_layout(load_spec("mistralai/Mistral-7B-v0.1"))  # every layer: window 4096
    assert (mistral.full_layers, mistral.window_layers, mistral.window) == (0, 32, 4096)
    assert mistral.bytes_per_token == 131_072
    # a 32,000-token sequence keeps window + batched tokens (6,144) per layer, not 32,000
    assert mistral.seq_bytes_gpu(32_000, 2048) == 32 * 6144 * 4096
    assert mistral.seq_bytes_gpu(1000, 2048) == 32 * 1008 * 4096  # whole 16-token blocks
    gemma2 = kv_layout(load_spec("google/gemma-2-9b"))  # alternating local / global
    assert (gemma2.full_layers, gemma2.window_layers) == (21, 21)
    gemma3 = kv_layout(load_spec("google/gemma-3-27b-pt"))  # 5 local : 1 global
    assert (gemma3.full_layers, gemma3.window_layers, gemma3.window) == (10, 52, 1024)
    qwen = kv_layout(load_spec("Qwen/Qwen2.5-7B"))  # use_sliding_window false: all full
    assert (qwen.full_layers, qwen.window_layers) == (28, 0)


def test_mla_cache_is_one_latent_and_every_rank_holds_it() -> None:
    # DeepSeek-V3's attention: 61 layers x (512 + 64) x 2 B = 70,272 B (68.6 KiB) per token
    cfg = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
           "vocab_size": 129280, "num_attention_heads": 128, "kv_lora_rank": 512,
           "qk_rope_head_dim": 64}  # fmt: skip
    spec = ModelSpec("deepseek-ai/DeepSeek-V3", cfg, "test")
    assert kv_layout(spec).bytes_per_token == 70_272
    tp8 = kv_layout(spec, tp=8)
    assert tp8.bytes_per_token_gpu == 70_272 and tp8.replicated


def test_tensor_parallel_past_kv_heads_replicates_the_cache() -> None:
    qwen = load_spec("Qwen/Qwen2.5-7B")  # 4 KV heads
    assert kv_layout(qwen, tp=4).bytes_per_token_gpu == 57_344 // 4
    tp8 = kv_layout(qwen, tp=8)  # one head per GPU: twice the cache over 8 GPUs
    assert tp8.replicated and tp8.bytes_per_token_gpu * 8 == 2 * 57_344


def test_weight_bytes_by_format() -> None:
    p = params(load_spec(LLAMA8))
    assert p.total == 8_030_261_248
    gib = {q: weight_bytes(p, f).total / GIB for q, f in FORMATS.items()}
    assert gib["bf16"] == pytest.approx(14.96, abs=0.01)
    # AWQ: 4 + 20/128 bits per linear weight; embeddings and LM head stay 16 bit
    linear = p.linear * (4 + 20 / 128) / 8
    assert gib["awq"] == pytest.approx((linear + (p.embed + p.head + p.other) * 2) / GIB)
    assert gib["awq"] < gib["fp8"] < gib["bf16"]
    # GGUF Q4_K_M packs the embeddings too: 4.89 bits over the whole file (4.58 GiB for 8B)
    assert gib["gguf-q4_k_m"] == pytest.approx(4.58, abs=0.05)
    moe = params(load_spec("mistralai/Mixtral-8x7B-v0.1"))
    assert moe.total == pytest.approx(46.7e9, rel=0.01) and moe.active_linear < moe.linear / 3


def test_vllm_memory_rule_reproduces_its_log() -> None:
    # vLLM issue #11251: 15.77 GiB x 0.90 = 14.20; weights 7.51, non-torch 0.39, activation
    # peak 2.53 -> 3.76 GiB of KV cache
    assert kv_budget_gib("vllm", 15.77, 0.90, 7.51, 2.53, 0.39) == pytest.approx(3.76, abs=0.01)
    # SGLang leaves activations to the rest; TensorRT-LLM takes its fraction of what is free
    assert kv_budget_gib("sglang", 80, 0.88, 15, 2, 0.4) == pytest.approx(55.4)
    assert kv_budget_gib("trtllm", 80, 0.9, 15, 2, 0.4) == pytest.approx(56.34)


def test_kv_capacity_and_concurrency_follow_from_memory() -> None:
    e = estimate(deploy(), 1000, 200, Load(concurrency=1))
    m = e.memory
    per_token = 131_072
    assert m.kv_cache_tokens == int(m.kv_cache_gib * GIB // per_token) // 16 * 16
    assert m.max_concurrency == int(m.kv_cache_gib * GIB // (1200 * per_token))
    fp8 = estimate(deploy(kv_dtype="fp8"), 1000, 200, Load(concurrency=1))
    assert fp8.memory.kv_cache_tokens == pytest.approx(2 * m.kv_cache_tokens, rel=0.001)


# ---- speed -------------------------------------------------------------------------------


def test_throughput_rises_with_concurrency_until_the_kv_limit_then_flattens() -> None:
    d = deploy(gpu="L4")  # 15 GiB of weights on 22 GiB: a few dozen requests fit
    limit = estimate(d, 1000, 200, Load(concurrency=1)).memory.max_concurrency
    assert 4 < limit < 256
    tps = []
    for c in (1, 2, 4, 8, 16, limit, 2 * limit, 8 * limit):
        tps.append(estimate(d, 1000, 200, Load(concurrency=c)).speed.output_tokens_per_s)
    rising = tps[:6]
    assert all(b > a for a, b in itertools.pairwise(rising))
    assert tps[6] == pytest.approx(tps[5]) and tps[7] == pytest.approx(tps[5])  # flat
    # the requests past the limit wait: TTFT grows with them
    ttfts = [estimate(d, 1000, 200, Load(concurrency=c)).ttft_s for c in (limit, 8 * limit)]
    assert ttfts[1] > 5 * ttfts[0]  # type: ignore[operator]


def test_ttft_grows_without_bound_as_the_rate_reaches_capacity() -> None:
    d = deploy()
    cap = estimate(d, 1000, 200, Load(rate=1)).speed.capacity_requests_per_s
    ttft = [estimate(d, 1000, 200, Load(rate=f * cap)).ttft_s for f in (0.5, 0.9, 0.99, 0.999)]
    assert all(b > a for a, b in itertools.pairwise(ttft))  # type: ignore[operator]
    assert ttft[-1] > 10 * ttft[0]  # type: ignore[operator]
    over = estimate(d, 1000, 200, Load(rate=1.2 * cap))
    assert over.speed.saturated and over.ttft_s is None
    j = over.to_json()
    assert j["ttft_ms"] is None and j["e2e_latency_ms"] is None and "without bound" in j["notes"][0]


def test_prefix_cache_lowers_ttft_and_fp8_raises_throughput_on_hopper() -> None:
    base = estimate(deploy(), 4000, 200, Load(rate=5))
    cached = estimate(deploy(), 4000, 200, Load(rate=5), prefix_hit=0.9)
    assert cached.ttft_s < 0.5 * base.ttft_s  # type: ignore[operator]
    off = Load(burst=1000)
    bf16 = estimate(deploy(), 1000, 1000, off).speed.output_tokens_per_s
    fp8 = estimate(deploy(quant="fp8"), 1000, 1000, off).speed.output_tokens_per_s
    assert fp8 > 1.2 * bf16  # FP8 GEMMs at twice the bf16 rate, half the weight bytes


def test_price_gives_dollars_per_token_and_request() -> None:
    e = estimate(deploy(), 1000, 200, Load(rate=10), price=(4.0, "test"))
    j = e.to_json()
    assert j["usd_per_million_output_tokens"] == pytest.approx(4.0 / 3600 / 2000 * 1e6, rel=1e-3)
    assert j["usd_per_request"] == pytest.approx(4.0 / 3600 / 10, rel=1e-3)


def test_reference_rows_within_the_accuracy_targets() -> None:
    acc = load_benchmark("serve_accuracy")
    rows = acc.rows()
    assert len(rows) >= 50
    med = acc.medians(acc.errors(rows))
    assert med["out_tok_s"] <= 0.20
    assert med["ttft_ms"] <= 0.30
    assert med["itl_ms"] <= 0.30


def test_engines_file_has_every_engine_with_a_source() -> None:
    assert set(engines()) == {"vllm", "sglang", "trtllm"}
    for e in engines().values():
        assert e.source and 0 < e.bw_eff < 1 and 0 < e.flops_eff < 1 and e.memory_fraction <= 1


# ---- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "lengths", "fix"),
    [
        ({}, (130_000, 2000), "shorten the prompt"),
        ({"engine": "trtllm", "quant": "nf4"}, (100, 100), "--engine vllm or sglang"),
        ({"gpu": "T4", "quant": "fp8"}, (100, 100), "--quant awq"),
        ({"tp": 3}, (100, 100), "--gpus 1 or 2 or 4 or 8"),
        ({"model": "meta-llama/Llama-3.1-70B"}, (100, 100), "use --gpus 2"),
    ],
)
def test_bad_deployments_name_the_fix(change: dict, lengths: tuple[int, int], fix: str) -> None:
    with pytest.raises(FrugalError, match=fix.replace(".", r"\.")):
        estimate(deploy(**change), *lengths, Load(rate=1))


# ---- plans -------------------------------------------------------------------------------


def test_plan_adds_replicas_as_the_rate_grows() -> None:
    offers = select_offers(gpu="H100 SXM", providers_csv="aws")
    spec = load_spec(LLAMA8)
    replicas = []
    for rate in (2, 20, 80, 320):
        p = plan(ServeAsk(spec, rate, 1000, 200, ttft_s=0.5, quants=("bf16",)), offers)
        b = p.best
        assert b.replicas * b.cap.rate >= rate  # carries the load
        assert b.cap.at.ttft_s <= 0.5  # type: ignore[operator]
        replicas.append(b.replicas)
    assert replicas == sorted(replicas) and replicas[-1] >= 4 * replicas[1] > 0


def test_plan_refuses_what_cannot_meet_the_targets() -> None:
    ask = ServeAsk(load_spec(LLAMA8), 10, 1000, 200, itl_s=0.001)
    with pytest.raises(FrugalError, match="relax --ttft-ms / --itl-ms"):
        plan(ask, select_offers())


def test_offline_work_may_use_spot_and_online_never() -> None:
    spec, offers = load_spec(LLAMA8), select_offers(providers_csv="aws")
    online = plan(ServeAsk(spec, 5, 1000, 200, ttft_s=1.0), offers)
    assert all(o.pricing != "spot" for o in online.options)
    offline = plan(ServeAsk(spec, 5, 1000, 200, offline=True), offers)
    assert any(o.pricing == "spot" for o in offline.options)
    assert offline.best.usd_h <= online.best.usd_h


def test_response_cache_and_commitments_lower_the_bill(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["serve", "plan", LLAMA8, "--rate", "40", "--input-len", "1000",
            "--output-len", "200", "--ttft-ms", "500", "--providers", "aws", "--quant", "bf16",
            "--json"]  # fmt: skip
    plain = run_json(capsys, *args, "--commitment-months", "")
    cached = run_json(capsys, *args, "--commitment-months", "", "--response-cache-hit", "0.5")
    assert cached["rate_requests_per_s"] == 20
    assert cached["recommendation"]["usd_h"] < plain["recommendation"]["usd_h"]
    committed = run_json(capsys, *args)
    assert committed["recommendation"]["pricing"] == "commitment 12 months"
    assert committed["recommendation"]["usd_h"] < plain["recommendation"]["usd_h"]


def test_plan_json_compares_apis_and_platforms(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "serve", "plan", LLAMA8, "--rate", "20", "--input-len", "1000",
                   "--output-len", "200", "--ttft-ms", "500", "--json")  # fmt: skip
    rec = out["recommendation"]
    for key in ("gpu", "gpus_per_replica", "replicas", "usd_per_month",
                "usd_per_million_output_tokens", "usd_per_request", "reasons"):  # fmt: skip
        assert key in rec
    assert rec["ttft_ms"] <= 500
    apis = out["apis"]
    assert apis and apis == sorted(apis, key=lambda a: a["usd_per_request"])
    cheapest = apis[0]
    # DeepInfra Llama-3.1-8B: $0.02 in / $0.05 out per million tokens
    assert cheapest["usd_per_request"] == pytest.approx((1000 * 0.02 + 200 * 0.05) / 1e6)
    be = out["break_even"]
    assert be["api"] == cheapest["provider"] and "requests/s" in be["text"]
    assert {f["quant"] for f in out["formats"]} == {"bf16", "fp8", "awq"}


def test_cli_estimate_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "serve", "estimate", LLAMA8, "--gpu", "H100", "--input-len", "1000",
                   "--output-len", "200", "--rate", "5", "--price", "2", "--json")  # fmt: skip
    for key in ("weights_gib", "kv_bytes_per_token", "kv_cache_gib", "kv_cache_tokens",
                "max_concurrency", "output_tokens_per_s", "requests_per_s", "ttft_ms", "itl_ms",
                "e2e_latency_ms", "usd_per_million_output_tokens", "usd_per_request"):  # fmt: skip
        assert key in out, key
    assert out["kv_bytes_per_token"] == 131_072


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (["estimate", LLAMA8, "--gpu", "H100", "--input-len", "10", "--output-len", "10"],
         "give the load"),
        (["estimate", LLAMA8, "--gpu", "H100", "--input-len", "10", "--output-len", "10",
          "--rate", "1", "--quant", "int3"], "--quant 'int3': use one of"),
        (["plan", LLAMA8, "--input-len", "10", "--output-len", "10"], "--rate R or"),
        (["plan", LLAMA8, "--rate", "1", "--input-len", "10", "--output-len", "10",
          "--offline", "--ttft-ms", "100"], "drop --ttft-ms"),
    ],
)  # fmt: skip
def test_cli_bad_input_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], fix: str
) -> None:
    assert fix in run_error(capsys, "serve", *args)


def test_estimate_and_plan_agree() -> None:
    """The plan's replica is the estimator's deployment at the plan's rate."""
    offers = select_offers(gpu="H100 SXM", providers_csv="aws")
    p = plan(ServeAsk(load_spec(LLAMA8), 10, 1000, 200, ttft_s=0.5, quants=("bf16",)), offers)
    b = p.best
    again = estimate(replace(b.cap.d), 1000, 200, Load(rate=b.cap.rate))
    assert again.to_json() == b.cap.at.to_json()
    assert json.dumps(b.to_json())  # serializable


def test_plan_emits_the_vllm_command_of_its_choice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["serve", "plan", LLAMA8, "--rate", "20", "--input-len", "1000", "--output-len",
            "200", "--ttft-ms", "500", "--providers", "aws", "--json"]  # fmt: skip
    out = run_json(capsys, *args, "--quant", "bf16", "--emit", "vllm")
    rec, cmd = out["recommendation"], out["vllm_command"]
    assert cmd.startswith(f"vllm serve {LLAMA8} ")
    assert f"--tensor-parallel-size {rec['gpus_per_replica']}" in cmd
    assert "--max-model-len 1200" in cmd and "--dtype bfloat16" in cmd
    sky = tmp_path / "serve.yaml"
    out = run_json(capsys, *args, "--quant", "bf16", "--emit", "skypilot", "--emit-file", str(sky))
    task = yaml.safe_load(sky.read_text())
    assert task["service"]["replica_policy"]["min_replicas"] >= out["recommendation"]["replicas"]
    # a pre-quantized format needs its checkpoint
    err = run_error(capsys, *args, "--quant", "awq", "--emit", "vllm")
    assert "give --weights" in err


def test_emitter_knows_every_format_and_engine_the_estimator_does() -> None:
    from frugal.serve import emit

    assert set(emit.QUANTS) == set(FORMATS)
    assert set(emit.ENGINES) == set(engines())


def test_peak_sizes_the_servers_and_the_mean_is_billed(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["serve", "plan", LLAMA8, "--requests-per-day", "172800", "--input-len", "1000",
            "--output-len", "200", "--ttft-ms", "500", "--json"]  # fmt: skip
    flat = run_json(capsys, *args)
    peaky = run_json(capsys, *args, "--peak-factor", "4")
    assert flat["mean_rate_requests_per_s"] == peaky["mean_rate_requests_per_s"] == 2
    assert peaky["rate_requests_per_s"] == 8
    # the API bills the same mean load; the servers are sized for the peak
    assert peaky["apis"][0]["usd_per_month"] == flat["apis"][0]["usd_per_month"]
    rec = peaky["recommendation"]
    assert rec["usd_per_request"] == pytest.approx(rec["usd_h"] / 3600 / 2, rel=1e-3)
    be = peaky["break_even"]
    assert be["self_hosted_cheaper"] == (be["self_hosted_usd_h"] < be["api_usd_h"])
    assert be["api_usd_h"] == pytest.approx(peaky["apis"][0]["usd_per_request"] * 2 * 3600)


def test_latencies_are_at_the_load_and_replicas_keep_headroom(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_json(capsys, "serve", "plan", LLAMA8, "--rate", "7", "--input-len", "500",
                   "--output-len", "100", "--providers", "aws", "--json")  # fmt: skip
    rec = out["recommendation"]
    assert rec["utilization"] <= 0.8 + 1e-9  # no targets: never planned past 80% of capacity
    share = 7 / rec["replicas_running"]
    again = run_json(capsys, "serve", "estimate", LLAMA8, "--gpu", rec["gpu"], "--gpus",
                     str(rec["gpus_per_replica"]), "--quant", rec["quant"], "--input-len", "500",
                     "--output-len", "100", "--rate", str(share), "--json")  # fmt: skip
    assert rec["ttft_ms"] == pytest.approx(again["ttft_ms"], rel=0.01)
    assert rec["itl_ms"] == pytest.approx(again["itl_ms"], rel=0.01)


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (["--prefix-hit", "1.5"], "'--prefix-hit': 1.5: give a number from 0, below 1"),
        (["--kv-dtype", "int4"], "--kv-dtype 'int4': use auto or fp8"),
        (["--input-len", "200000"], "is past meta-llama/Llama-3.1-8B's"),
        (["--rate", "nan"], "'--rate': nan: give a number above 0"),
        (["--ttft-ms", "0"], "'--ttft-ms': 0: give a number above 0"),
        (["--quant", ""], "--quant and --engine need at least one value"),
    ],
)
def test_plan_checks_its_input_before_any_search(
    capsys: pytest.CaptureFixture[str], args: list[str], fix: str
) -> None:
    base = {"--rate": "5", "--input-len": "1000", "--output-len": "200"}
    flags = dict(zip(args[::2], args[1::2], strict=True))
    argv = [x for k, v in {**base, **flags}.items() for x in (k, v)]
    assert fix in run_error(capsys, "serve", "plan", LLAMA8, *argv)


def test_what_the_engines_cannot_run_is_refused() -> None:
    with pytest.raises(FrugalError, match="FP8 tensor cores"):
        estimate(deploy(gpu="A100 80GB", engine="trtllm", quant="fp8"), 100, 100, Load(rate=1))
    with pytest.raises(FrugalError, match=r"compute capability 7\.5"):
        estimate(deploy(gpu="V100 32GB", quant="awq"), 100, 100, Load(rate=1))
    cfg = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
           "vocab_size": 129280, "num_attention_heads": 128, "kv_lora_rank": 512,
           "qk_rope_head_dim": 64, "intermediate_size": 18432, "n_routed_experts": 256}  # fmt: skip
    with pytest.raises(FrugalError, match="no qk_nope_head_dim, v_head_dim: give the model's"):
        params(ModelSpec("deepseek-ai/DeepSeek-V3", cfg, "test"))


def test_deepseek_v3_is_served_from_its_active_experts() -> None:
    """Latent attention, shared experts and 8 of 256 routed experts: the weights are all
    671B, a token's FLOPs are those of the 37.6B it meets."""
    p = params(load_spec("deepseek-ai/DeepSeek-V3"))
    assert p.total == 671_026_404_352
    assert (p.experts, p.top_k) == (256, 8)
    assert p.active_linear < p.linear / 15


def test_kv_bytes_per_token_is_the_models_and_per_gpu_is_beside_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    one = run_json(capsys, "serve", "estimate", LLAMA8, "--gpu", "H100", "--input-len", "100",
                   "--output-len", "100", "--rate", "1", "--json")  # fmt: skip
    eight = run_json(capsys, "serve", "estimate", LLAMA8, "--gpu", "H100", "--gpus", "8",
                     "--input-len", "100", "--output-len", "100", "--rate", "1",
                     "--json")  # fmt: skip
    assert one["kv_bytes_per_token"] == eight["kv_bytes_per_token"] == 131_072
    assert eight["kv_bytes_per_token_per_gpu"] == 131_072 // 8
