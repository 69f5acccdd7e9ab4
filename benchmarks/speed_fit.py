"""Step time from the traced ops (`frugal.estimate.optime`), fitted and judged on every
measured row: frugal's own GPU rows (benchmarks/data/gpu_truth-*.csv, every loan) and the
third-party rows (benchmarks/data/measured_speed.csv).

Each configuration is simulated once at its own micro-batch and length, at the two depths
the profiles use; its op table gives the GPU's and the host's seconds per part of the step
for any constants, so a fit is cheap. The constants are fitted (coordinate descent on the
mean |log error|) together with one host factor per host: each loan's machine, and each
third-party source's. Judged by leave-one-configuration-out cross-validation: every
measurement of a configuration (all its loans) is predicted by constants fitted without
it, from the same start.

A configuration whose loans disagree by more than 10% is host-bound: the machines' CPUs
set its pace, so it is judged against the range its prediction spans over the loans' host
factors, not against a point. Prints the table (`--write docs/accuracy.md` replaces the
block there) and, with `--fit`, the constants to put in `OpSpeedConstants`.

    python benchmarks/speed_fit.py [--fit] [--write docs/accuracy.md]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from frugal.estimate.categories import CAT_INDEX
from frugal.estimate.optime import Depths, OpSpeedConstants, OpTable, along, op_seconds
from frugal.estimate.simulate import shallow_depths, simulate
from frugal.estimate.throughput import comm_seconds, load_speed_constants
from frugal.hardware.csvdata import data_rows
from frugal.hardware.gpus import GPU, find_gpu
from frugal.models.specs import load_spec
from frugal.step.job import TrainJob, make_job

HERE = Path(__file__).parent
DATA = HERE / "data"
HOST_BOUND = 0.10  # loans further apart than this: the host sets the pace
SPREAD = (0.1, 0.9)  # the quantiles of the cross-validated errors a plan's range spans
# rows shown but not fitted: steps frugal does not run, with the reason
NOT_FITTED = {
    "C3-1.8b-f-": "Qwen's full fine-tuning script (DeepSpeed): a flat 2.1-2.3 s a step from "
    "256 to 2,048 tokens, 30x the GPU's work at any efficiency; frugal's optimizer runs on "
    "the GPU",
}


def not_fitted(case_id: str) -> str | None:
    return next((why for prefix, why in NOT_FITTED.items() if case_id.startswith(prefix)), None)


@dataclass
class Case:
    """One configuration: its step's op tables and every measurement of it."""

    id: str
    source: str  # "frugal" or the third party's source
    gpu: GPU
    job: TrainJob
    layers: int
    depths: tuple[int, int]
    tables: tuple[OpTable, OpTable]
    weights: tuple[float, float]  # trainable and all weight bytes of the whole model
    measured: dict[str, float]  # host -> tokens/s

    @property
    def tokens(self) -> int:
        return self.job.batch * self.job.seq * self.job.grad_accum * self.job.gpus

    def host_bound(self) -> bool:
        v = list(self.measured.values())
        return len(v) > 1 and max(v) / min(v) - 1 > HOST_BOUND


def _own_rows() -> dict[str, dict[str, Any]]:
    """frugal's GPU rows by configuration id, each with its measurement per loan."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(DATA.glob("gpu_truth-*.csv")):
        loan = path.stem.removeprefix("gpu_truth-")
        with path.open() as f:
            for r in csv.DictReader(ln for ln in f if not ln.startswith("#")):
                if r.get("runner", "frugal") != "frugal" or not r["measured_tokens_per_s"]:
                    continue
                row = out.setdefault(r["id"], {**r, "measured": {}})
                row["measured"][loan] = float(r["measured_tokens_per_s"])
    return out


def _own_job(r: dict[str, Any]) -> TrainJob:
    lora = {}
    if r["method"] != "full":
        targets = "q_proj,k_proj,v_proj,o_proj" if r["id"].endswith("-attn") else "all-linear"
        lora = {"lora_r": int(r["lora_r"]), "lora_targets": targets}
    return make_job(
        method=r["method"], precision=r["precision"], batch=int(r["micro_batch"]),
        seq=int(r["seq"]), grad_accum=int(r["grad_accum"]),
        grad_checkpointing=r["checkpointing"] == "True", optimizer=r["optimizer"],
        loss_chunks=int(r["loss_chunks"]), offload_activations=r["offload"] == "True",
        optimizer_in_backward=r["in_backward"] == "True",
        packing=not r["id"].endswith("-padded"), **lora,
    )  # fmt: skip


def _third_party_job(r: dict[str, str]) -> TrainJob:
    lora = {}
    if r["method"] != "full":
        lora = {"lora_targets": r["targets"], "lora_r": int(r["rank"])}
    return make_job(
        method=r["method"], precision=r["precision"], batch=int(r["batch"]),
        seq=int(r["seq"]), grad_accum=int(r["grad_accum"]),
        grad_checkpointing=r["grad_checkpointing"] == "true", attention=r["attention"],
        gpus=int(r["gpus"]), sharding=r["sharding"], **lora,
    )  # fmt: skip


def make_case(id_: str, source: str, model: str, gpu: GPU, job: TrainJob,
              measured: dict[str, float]) -> Case:  # fmt: skip
    """Simulate the step of `job` (one micro-step and the update) at two depths."""
    if model.startswith("benchmarks/"):
        model = str(HERE.parent / model)
    spec = load_spec(model)
    depths = shallow_depths(spec.config, job.offload_activations)
    one = job.model_copy(update={"grad_accum": 1, "gpus": 1, "sharding": "ddp"})
    traces = [simulate(spec.config, one, n, [(job.batch, job.seq)])[0] for n in depths]
    tables = tuple(OpTable.from_trace(t.ops, t.segments, t.micro) for t in traces)
    # the weights' bytes on the line through the two depths, for the communication
    w = (spec.num_layers - depths[0]) / (depths[1] - depths[0])
    at = [t.live[0] for t in traces]
    full = [a + w * (b - a) for a, b in zip(at[0], at[1], strict=True)]
    trainable = float(full[CAT_INDEX["trainable_weights"]])
    weights = trainable + float(full[CAT_INDEX["frozen_weights"]])
    return Case(id_, source, gpu, job, spec.num_layers, depths, tables,  # type: ignore[arg-type]
                (trainable, weights), measured)  # fmt: skip


def cases() -> list[Case]:
    h200 = find_gpu("H200")
    out = []
    for id_, r in _own_rows().items():
        out.append(make_case(id_, "frugal", r["model"], h200, _own_job(r), r["measured"]))
    for _, r in data_rows((DATA / "measured_speed.csv").read_text()):
        out.append(
            make_case(
                r["id"],
                r["source"],
                r["model"],
                find_gpu(r["gpu"]),
                _third_party_job(r),
                {r["source"]: float(r["tokens_per_s"])},
            )
        )
    return out


class Stack:
    """Every case's op tables in one array, so that one set of constants times all at once:
    slot = (case, depth, part)."""

    def __init__(self, cs: list[Case]) -> None:
        rows, peak, bw, link = [], [], [], []
        self.host = np.zeros((len(cs), 2, 2, 3))  # case, depth, (ops, views), part
        for i, c in enumerate(cs):
            p = c.gpu.peak_tflops(c.job.compute_dtype)
            assert p, (c.id, c.gpu.name)
            for d, t in enumerate(c.tables):
                slot = (i * 2 + d) * 3 + t.part
                rows.append(np.column_stack([slot, t.kind, t.flops, t.nbytes, t.count]))
                n = len(t.part)
                peak.append(np.full(n, p * 1e12))
                bw.append(np.full(n, c.gpu.bandwidth_gbps * 1e9))
                link.append(np.full(n, c.gpu.host_link_gbps * 1e9))
                self.host[i, d] = t.host_ops, t.host_views
        a = np.concatenate(rows)
        self.slot, self.kind = a[:, 0].astype(np.int64), a[:, 1].astype(np.int64)
        self.flops, self.nbytes, self.count = a[:, 2], a[:, 3], a[:, 4]
        self.peak, self.bw, self.link = (
            np.concatenate(peak),
            np.concatenate(bw),
            np.concatenate(link),
        )
        self.cases = cs
        self.w = np.array([Depths(*c.depths).weight(c.layers) for c in cs])
        self.accum = np.array([c.job.grad_accum for c in cs], dtype=np.float64)
        speed = load_speed_constants()
        self.comm = np.array([comm_seconds(*c.weights, c.job, c.gpu, c.job.gpus, 0.0, speed)
                              for c in cs])  # fmt: skip
        self.overlap = speed.overlap
        self.tokens = np.array([c.tokens for c in cs], dtype=np.float64)

    def seconds(self, c: OpSpeedConstants, host: np.ndarray) -> tuple[np.ndarray, ...]:
        """Step seconds, GPU seconds and host seconds of every case, each on the host of
        factor `host` (one per case)."""
        t = op_seconds(self.kind, self.flops, self.nbytes, self.peak, self.bw, self.link, c)
        n = len(self.cases)
        g = np.bincount(self.slot, weights=t * self.count, minlength=n * 6).reshape(n, 2, 3)
        h = self.host[:, :, 0] * c.host_op_s + self.host[:, :, 1] * c.host_view_s
        h = h * host[:, None, None]
        w = self.w[:, None]
        g, h = along(g[:, 0], g[:, 1], w), along(h[:, 0], h[:, 1], w)
        m = np.maximum(g, h)
        micro = m[:, 0] + m[:, 1]
        exposed = np.maximum(0.0, self.comm - self.overlap * self.accum * (g[:, 0] + g[:, 1]))
        step = self.accum * micro + m[:, 2] + exposed + c.step_fixed_s
        return (
            step,
            self.accum * (g[:, 0] + g[:, 1]) + g[:, 2],
            self.accum * (h[:, 0] + h[:, 1]) + h[:, 2],
        )


@dataclass
class Fit:
    constants: OpSpeedConstants
    hosts: dict[str, float]  # host -> factor on the typical host's dispatch cost


def _samples(cs: list[Case], keep: list[int]) -> list[tuple[int, str, float]]:
    return [(i, h, v) for i in keep if not not_fitted(cs[i].id) for h, v in cs[i].measured.items()]


def fit(stack: Stack, keep: list[int], start: Fit, rounds: int = 4) -> Fit:
    """Coordinate descent on the mean |log error| of the measurements of cases `keep`."""
    samples = _samples(stack.cases, keep)
    idx = np.array([i for i, _, _ in samples])
    meas = np.array([v for _, _, v in samples])
    hosts = sorted({h for _, h, _ in samples})
    which = np.array([hosts.index(h) for _, h, _ in samples])

    def loss(c: OpSpeedConstants, factors: np.ndarray) -> float:
        per_case = np.ones(len(stack.cases))
        step = np.empty(len(samples))
        # a case measured on several hosts is timed once per host
        for k in np.unique(which):
            per_case[:] = factors[k]
            sel = which == k
            step[sel] = stack.seconds(c, per_case)[0][idx[sel]]
        return float(np.mean(np.abs(np.log(stack.tokens[idx] / step / meas))))

    best = start.constants
    factors = np.array([start.hosts.get(h, 1.0) for h in hosts])
    cur = loss(best, factors)
    names = [f.name for f in fields(OpSpeedConstants) if not f.name.startswith("host_") or
             f.name in ("host_op_s", "host_view_s")]  # fmt: skip
    for _ in range(rounds):
        for name in names + [f"host:{h}" for h in hosts]:
            for scale in (0.5, 0.7, 0.85, 0.93, 1.07, 1.15, 1.4, 2.0):
                if name.startswith("host:"):
                    k = hosts.index(name[5:])
                    trial_f = factors.copy()
                    trial_f[k] *= scale
                    if not 0.2 <= trial_f[k] <= 5.0:  # hosts within 5x of each other
                        continue
                    v = loss(best, trial_f)
                    if v < cur - 1e-5:
                        factors, cur = trial_f, v
                    continue
                value = getattr(best, name) * scale
                if name.endswith("_eff") and value > 1:
                    continue
                trial = replace(best, **{name: value})
                v = loss(trial, factors)
                if v < cur - 1e-5:
                    best, cur = trial, v
    # the typical host: the geometric mean of frugal's own loans
    own = [factors[hosts.index(h)] for h in hosts if h.startswith("20")]
    typical = math.exp(statistics.mean(math.log(f) for f in own)) if own else 1.0
    best = replace(best, host_op_s=best.host_op_s * typical,
                   host_view_s=best.host_view_s * typical)  # fmt: skip
    out = Fit(best, {h: f / typical for h, f in zip(hosts, factors, strict=True)})
    # the hosts' range: the factors that reproduce each host-bound measurement exactly
    seen = [_host_factor(stack, out.constants, i, v) for i, _, v in samples
            if stack.cases[i].host_bound()]  # fmt: skip
    seen = [f for f in seen if f is not None]
    if seen:
        out.constants = replace(out.constants, host_fast=min(seen), host_slow=max(seen))
    return out


def _host_factor(stack: Stack, c: OpSpeedConstants, i: int, measured: float) -> float | None:
    """The host factor at which case `i` runs at `measured` tokens/s (None: no factor
    does, the GPU alone is slower than that)."""

    def tps(f: float) -> float:
        return float(stack.tokens[i] / stack.seconds(c, np.full(len(stack.cases), f))[0][i])

    lo, hi = 0.05, 20.0
    if tps(lo) < measured or tps(hi) > measured:
        return None
    for _ in range(30):  # tokens/s falls as the host slows: bisect on the log
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if tps(mid) > measured else (lo, mid)
    return math.sqrt(lo * hi)


def predict(stack: Stack, f: Fit, i: int, host: str | None) -> tuple[float, float]:
    """Tokens/s of case `i` on `host` (None: the typical host), and the host's share."""
    factor = np.full(len(stack.cases), f.hosts.get(host, 1.0) if host else 1.0)
    step, g, h = stack.seconds(f.constants, factor)
    return float(stack.tokens[i] / step[i]), float(h[i] / (g[i] + h[i]) if h[i] > g[i] else 0)


def host_range(stack: Stack, f: Fit, i: int, spread: tuple[float, float]) -> tuple[float, float]:
    """Tokens/s of case `i` on the slowest and the fastest hosts seen, widened by the
    model's own `spread` (measured over predicted of the GPU-bound rows): the range a plan
    carries (`throughput.step_time`)."""
    outs = []
    for factor, s in zip((f.constants.host_slow, f.constants.host_fast), spread, strict=True):
        step = stack.seconds(f.constants, np.full(len(stack.cases), factor))[0]
        outs.append(float(stack.tokens[i] / step[i]) * s)
    return outs[0], outs[1]


def spread(stack: Stack, full: Fit, held: list[Fit] | None) -> tuple[float, float]:
    """The 10th and 90th percentiles of measured over predicted tokens/s of the fitted
    GPU-bound rows, cross-validated (in-sample without `held`)."""
    ratios = []
    for i, c in enumerate(stack.cases):
        if (c.source == "frugal" and c.host_bound()) or not_fitted(c.id):
            continue
        f = held[i] if held else full
        ratios += [v / predict(stack, f, i, h)[0] for h, v in c.measured.items()]
    lo, hi = np.quantile(ratios, SPREAD)
    return float(lo), float(hi)


# Round values a reader would guess before any measurement: where every fit starts, so that
# a held-out row never leaks in through the shipped constants (which saw every row).
PRIOR = Fit(OpSpeedConstants(
    matmul_eff=0.78, matmul_half_flop=2.0e9, attention_eff=0.45, elementwise_bw_eff=0.75,
    reduction_bw_eff=0.5, copy_bw_eff=0.7, dequant_bw_eff=0.35, offload_link_eff=0.8,
    optimizer_bw_eff=0.6, kernel_floor_s=4.0e-6, host_op_s=10.0e-6, host_view_s=2.0e-6,
    host_fast=0.75, host_slow=1.35, step_fixed_s=0.02,
), {})  # fmt: skip


def cross_validate(stack: Stack) -> list[Fit]:
    """One fit per held-out configuration, from the prior (never from a fit that saw it)."""
    n = len(stack.cases)
    return [fit(stack, [j for j in range(n) if j != i], PRIOR, rounds=3) for i in range(n)]


def report(stack: Stack, full: Fit, held: list[Fit] | None) -> tuple[str, dict[str, float]]:
    lines = [
        "| configuration | source | GPU | measured tok/s (per host) | in-sample | "
        "cross-validated | bound |",
        "|---|---|---|---|---|---|---|",
    ]
    errs: dict[str, list[float]] = {"own_in": [], "own_cv": [], "third_in": [], "third_cv": []}
    inside = []
    band = spread(stack, full, held)
    for i, c in enumerate(stack.cases):
        own = c.source == "frugal"
        meas = "; ".join(f"{v:,.0f}" for v in c.measured.values())
        ins, cvs = [], []
        for h, v in c.measured.items():
            p, _ = predict(stack, full, i, h)
            ins.append(p / v - 1)
            if held:
                q, _ = predict(stack, held[i], i, h)
                cvs.append(q / v - 1)
        _, share = predict(stack, full, i, None)
        bound = f"host {share:.0%}" if share else "gpu"
        if own and c.host_bound():
            lo, hi = host_range(stack, held[i] if held else full, i, band)
            ok = all(lo <= v <= hi for v in c.measured.values())
            inside.append(ok)
            cv_text = f"range {lo:,.0f}-{hi:,.0f} ({'holds' if ok else 'misses'})"
            bound = (
                "host-bound (loans "
                + f"{max(c.measured.values()) / min(c.measured.values()) - 1:.0%} apart)"
            )
        elif not_fitted(c.id):
            cv_text = f"{', '.join(f'{e:+.1%}' for e in cvs)} (not fitted: {not_fitted(c.id)})"
        else:
            key = "own" if own else "third"
            errs[f"{key}_in"] += ins
            errs[f"{key}_cv"] += cvs
            cv_text = ", ".join(f"{e:+.1%}" for e in cvs) if cvs else ""
        lines.append(
            f"| {c.id} | {c.source} | {c.job.gpus}x {c.gpu.name} | {meas} | "
            f"{', '.join(f'{e:+.1%}' for e in ins)} | {cv_text} | {bound} |"
        )

    def med(v: list[float]) -> float:
        return statistics.median(abs(e) for e in v) if v else float("nan")

    def worst(v: list[float]) -> float:
        return max((abs(e) for e in v), default=float("nan"))

    summary = {
        "own_gpu_bound_in_median": med(errs["own_in"]),
        "own_gpu_bound_cv_median": med(errs["own_cv"]),
        "own_gpu_bound_cv_worst": worst(errs["own_cv"]),
        "third_cv_median": med(errs["third_cv"]),
        "third_in_median": med(errs["third_in"]),
        "host_bound_in_range": sum(inside) / len(inside) if inside else float("nan"),
    }
    summary["spread_lo"], summary["spread_hi"] = band
    text = "\n".join(lines)
    text += (
        "\n\nfrugal's own GPU-bound rows: in-sample median "
        f"{summary['own_gpu_bound_in_median']:.1%}; "
        f"cross-validated median {summary['own_gpu_bound_cv_median']:.1%}, worst "
        f"{summary['own_gpu_bound_cv_worst']:.1%} ({len(errs['own_cv'])} measurements). "
        f"Host-bound configurations inside their predicted host range: {sum(inside)} of "
        f"{len(inside)}. Third-party rows: in-sample median {summary['third_in_median']:.1%}, "
        f"cross-validated median {summary['third_cv_median']:.1%} ({len(errs['third_cv'])} rows)."
    )
    text += (
        f" Measured over predicted of the GPU-bound rows, cross-validated, 10th-90th "
        f"percentile: {band[0]:.3f}-{band[1]:.3f} (`spread_lo`, `spread_hi`: with the hosts' "
        "range, the range a plan carries and a host-bound row is judged against)."
    )
    return text, summary


def constants_text(f: Fit) -> str:
    out = [f"    {x.name}: float = {getattr(f.constants, x.name):.4g}" for x in fields(f.constants)]
    out += [f"  host {h}: x{v:.3f}" for h, v in sorted(f.hosts.items())]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="print the fitted constants")
    ap.add_argument("--no-cv", action="store_true", help="skip the cross-validation")
    ap.add_argument("--write", type=Path, help="markdown file whose speed-ops block to replace")
    a = ap.parse_args()
    t0 = time.perf_counter()
    cs = cases()
    stack = Stack(cs)
    print(
        f"{len(cs)} configurations simulated in {time.perf_counter() - t0:.0f} s", file=sys.stderr
    )
    full = fit(stack, list(range(len(cs))), PRIOR)
    held = None if a.no_cv else cross_validate(stack)
    text, _ = report(stack, full, held)
    print(text)
    if a.fit:
        print("\nfitted on every row:\n" + constants_text(full))
    print(f"\n({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    if a.write:
        from _docs import write_block  # beside this script

        write_block(a.write, "speed-ops", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
