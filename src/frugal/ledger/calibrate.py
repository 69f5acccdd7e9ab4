"""`frugal calibrate`: the estimator's constants fitted to the runs on the books.

Each run that measured tokens/s or peak memory (ended runs and dry runs) is predicted again
by the estimator itself (`step_time`, `memory_at`, the calls `frugal train` made for its
prediction: the run config's job at the micro-batch and accumulation that ran, on the
catalog GPU it ran on) with candidate constants, and the constants that bring the
predictions closest to the measurements are kept:

- **speed**: two factors of the op model (`estimate/optime.py`), pooled over all runs,
  then per GPU and method with enough runs (a `groups` section, `"A100 80GB/lora"`): one on
  the share of the tensor peak that products and attention reach (`matmul_eff`,
  `attention_eff`: the GPU side, its kernels, clocks and power caps), one dividing the
  host's time per op dispatched and per step (`host_op_s`, `host_view_s`, `step_fixed_s`:
  the host CPU, eager mode, data loading, logging). Large steps are ruled by the first,
  launch-bound ones by the second; where the runs' compute shares differ (by 10 points or
  more) both are fitted, else the runs cannot tell them apart and one factor scales both (a
  uniformly faster or slower stack, keeping the fitted balance). Found by bounded searches
  on the squared log ratio of predicted to measured tokens/s (relative errors). Why these
  and not a flat tokens/s factor per GPU: the op model keeps its shape, so what is learnt
  transfers to the micro-batches, lengths, models and GPU counts a plan tries (bandwidth-
  bound ops and NCCL time do not scale with a host's speed, nor dispatch with a GPU's).
  The fitted runs' remaining errors then set the range every figure carries
  (`spread_lo`, `spread_hi`: their 10th and 90th percentiles of measured over predicted),
  and the host range collapses to the runs' own host (`host_fast`, `host_slow` 1): a plan
  for the user's own machines is as uncertain as their own runs say.
- **memory**: `kernel_slack` from measured peak allocated, then `reserve_transient_frac`
  and `reserve_fixed_mib` from measured peak reserved: the estimate is linear in each, so
  its derivatives (taken from `memory_at` itself) give a closed-form least squares on
  relative errors, bounded to physical ranges. Pooled, then per method with enough runs
  (`"*/qlora"`): the memory estimate has no GPU in it (the caching allocator rounds the
  same way on every GPU; what churns depends on the method).

A share of the runs is held back (the first by a hash of the run id: the same runs every
time) and the median absolute percentage error on them is reported before and after; a
section whose held-back error would rise is not changed. The file keeps everything it held
that was not refitted.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from statistics import median
from typing import Any

import numpy as np

from frugal import calibration
from frugal.errors import FrugalError
from frugal.estimate.overheads import Overheads
from frugal.estimate.throughput import SpeedConstants
from frugal.ledger.samples import METRICS, Profiles, Sample, hold_back, samples
from frugal.ledger.schema import RunRecord
from frugal.ledger.store import Ledger

MAX_HOLDOUT = calibration.MAX_HOLDOUT
MIN_RUNS = 5  # runs with a measured figure before anything is fitted
MIN_POOLED = 3  # fitting runs behind one pooled constant (a tier's efficiency, memory)
MIN_GROUP = 5  # fitting runs of one GPU and method (speed) or one method (memory)
SAME = 0.02  # a group's constant within 2% of the pooled one is not written
EFF = (0.05, 1.0)  # a share of the GPU's peak
GPU_SIDE = ("matmul_eff", "attention_eff")  # the products' and attention's share of the peak
HOST = ("host_op_s", "host_view_s", "step_fixed_s")  # the host's time per op and per step
GPU_KNOB, HOST_KNOB = "gpu", "host"
SPREAD = (0.1, 0.9)  # the quantiles of the fitted runs' errors that make the range
LEAST_SPREAD = 0.02  # a range never narrower than +-2%: the runs' own noise
BOUNDS = {
    "kernel_slack": (-0.2, 1.0),  # of the simulated peak
    "reserve_transient_frac": (0.0, 2.0),  # of the logits and loss bytes at the peak
    "reserve_fixed_mib": (0.0, 65536.0),
}
STEP = {"kernel_slack": 0.1, "reserve_transient_frac": 0.1, "reserve_fixed_mib": 1024.0}
DIGITS = {"reserve_fixed_mib": 1}  # rounding of written values (others: 4 decimals)
# -- candidate calibrations --------------------------------------------------------------


def _minimize(f: Callable[[float], float], lo: float, hi: float) -> float:
    """The x in [lo, hi] that minimizes f: a log-spaced grid, then golden sections."""
    xs = np.geomspace(lo, hi, 25)
    ys = [f(float(x)) for x in xs]
    i = int(np.argmin(ys))
    a, b = math.log(xs[max(i - 1, 0)]), math.log(xs[min(i + 1, len(xs) - 1)])
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(40):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(math.exp(d))
    best = math.exp((a + b) / 2)
    return best if f(best) <= ys[i] else float(xs[i])


def _sig(v: float) -> float:
    return float(f"{v:.4g}")


def fit_speed(
    items: list[Sample], data: dict[str, Any], where: str | None
) -> dict[str, float] | None:
    """The speed constants at `where` that best predict `items`' tokens/s (least squares on
    log(predicted / measured)): a factor on the GPU's compute efficiencies (`GPU_SIDE`) and
    one on the host's overheads (`HOST`, divided by it). Both are fitted when the runs'
    compute shares differ by 10 points or more (std); otherwise the runs cannot tell them
    apart and one factor scales both. Then the range: the fitted runs' spread of errors,
    on their own host. None when neither factor moves the runs (bound by memory traffic or
    communication)."""
    base = {
        n: calibration.value_at(data, where, "speed", SpeedConstants, n) for n in (*GPU_SIDE, *HOST)
    }

    def values(k: dict[str, float]) -> dict[str, float]:
        out = {n: base[n] * k[GPU_KNOB] for n in GPU_SIDE}
        return out | {h: base[h] / k[HOST_KNOB] for h in HOST}

    def log_ratios(k: dict[str, float], extra: dict[str, float] | None = None) -> np.ndarray:
        d = calibration.with_values(data, where, "speed", values(k) | (extra or {}))
        return np.array([math.log((s.speed(d) or math.nan) / (s.tps or math.nan)) for s in items])

    knobs = [GPU_KNOB, HOST_KNOB]
    one = dict.fromkeys(knobs, 1.0)
    at_one = log_ratios(one)
    # how far each factor moves the runs, probed downwards: a share of the peak stays a share
    gpu_side = (log_ratios(one | {GPU_KNOB: 1 / 1.2}) - at_one) / math.log(1 / 1.2)
    host_side = (log_ratios(one | {HOST_KNOB: 1 / 1.2}) - at_one) / math.log(1 / 1.2)
    moved = gpu_side + host_side
    if not np.all(np.isfinite(moved)) or median(moved) < 0.25:
        return None
    top = max(base[n] for n in GPU_SIDE)
    bounds = {GPU_KNOB: (EFF[0] / top, EFF[1] / top), HOST_KNOB: (0.1, 10.0)}

    def loss(k: dict[str, float]) -> float:
        return float(np.sum(log_ratios(k) ** 2))

    k = dict(one)
    if np.std(gpu_side / moved) >= 0.1:  # separable: each knob on its own, a few rounds
        for _ in range(3):
            for knob in knobs:

                def along(x: float, knob: str = knob) -> float:
                    return loss(k | {knob: x})

                k[knob] = _minimize(along, *bounds[knob])
    else:
        lo, hi = max(b[0] for b in bounds.values()), min(b[1] for b in bounds.values())
        common = _minimize(lambda x: loss(dict.fromkeys(knobs, x)), lo, hi)
        k = dict.fromkeys(knobs, common)
    # measured / predicted on the runs' own host, at the fitted constants
    host = {"host_fast": 1.0, "host_slow": 1.0}
    ratio = np.exp(-log_ratios(k, host))
    q_lo, q_hi = np.quantile(ratio, SPREAD)
    spread = {
        "spread_lo": min(float(q_lo), 1 - LEAST_SPREAD),
        "spread_hi": max(float(q_hi), 1 + LEAST_SPREAD),
    }
    return {n: _sig(v) for n, v in (values(k) | host | spread).items()}


def _ls(cols: list[np.ndarray], r: np.ndarray) -> list[float]:
    x = np.column_stack(cols)
    sol, *_ = np.linalg.lstsq(x, r, rcond=None)
    return [float(v) for v in sol]


def fit_memory(
    items: list[Sample], data: dict[str, Any], where: str | None, min_runs: int
) -> dict[str, float]:
    """The memory constants at `where` that best predict `items`' peaks (relative least
    squares): `kernel_slack` from peak allocated, then the allocator reserve's two terms
    from peak reserved. Only constants with at least `min_runs` measurements are fitted."""
    out: dict[str, float] = {}

    def now(name: str, d: dict[str, Any]) -> float:
        return calibration.value_at(d, where, "memory", Overheads, name)

    def slope(s: Sample, d: dict[str, Any], name: str, which: int) -> float:
        """d(peak)/d(constant), from memory_at itself (it is linear in each)."""
        h = STEP[name]
        hi = calibration.with_values(d, where, "memory", {name: now(name, d) + h})
        return (s.memory(hi)[which] - s.memory(d)[which]) / h

    def clamp(name: str, v: float) -> float:
        lo, hi = BOUNDS[name]
        return round(min(max(v, lo), hi), DIGITS.get(name, 4))

    alloc = [s for s in items if s.allocated]
    if len(alloc) >= min_runs:
        a = np.array([s.allocated for s in alloc], dtype=float)
        r = (a - np.array([s.memory(data)[0] for s in alloc])) / a
        col = np.array([slope(s, data, "kernel_slack", 0) for s in alloc]) / a
        if np.any(col):
            (dk,) = _ls([col], r)
            out["kernel_slack"] = clamp("kernel_slack", now("kernel_slack", data) + dk)
    d1 = calibration.with_values(data, where, "memory", out)
    res = [s for s in items if s.reserved]
    if len(res) >= min_runs:
        a = np.array([s.reserved for s in res], dtype=float)
        r = (a - np.array([s.memory(d1)[1] for s in res])) / a
        names = ("reserve_transient_frac", "reserve_fixed_mib")
        cols = [np.array([slope(s, d1, n, 1) for s in res]) / a for n in names]
        both = np.std(cols[0]) > 0 and abs(np.corrcoef(cols[0], cols[1])[0, 1]) < 0.95
        start = {n: now(n, d1) for n in names}
        if both:
            delta = dict(zip(names, _ls(cols, r), strict=True))
            new = {n: clamp(n, start[n] + delta[n]) for n in names}
            for i, n in enumerate(names):  # one at its bound: fit the other alone
                if new[n] != round(start[n] + delta[n], DIGITS.get(n, 4)):
                    other = names[1 - i]
                    rest = r - cols[i] * (new[n] - start[n])
                    (dv,) = _ls([cols[1 - i]], rest)
                    new[other] = clamp(other, start[other] + dv)
                    break
        else:  # the runs cannot tell the two apart: a fixed slab, which does not extrapolate
            (dv,) = _ls([cols[1]], r)
            new = {"reserve_fixed_mib": clamp("reserve_fixed_mib", start[names[1]] + dv)}
        out.update(new)
    return out


# -- the calibration ------------------------------------------------------------------------


@dataclass
class Error:
    """Median absolute percentage error of one figure on a set of runs."""

    runs: int
    before_pct: float | None
    after_pct: float | None

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "before_pct": self.before_pct, "after_pct": self.after_pct}


@dataclass
class Change:
    where: str  # "speed", "memory", or "groups.GPU/method.speed"
    key: str
    old: float
    new: float
    runs: int  # fitting runs behind it

    def to_json(self) -> dict[str, Any]:
        return {
            "where": self.where,
            "key": self.key,
            "old": self.old,
            "new": self.new,
            "runs": self.runs,
        }


@dataclass
class Calibration:
    data: dict[str, Any]  # the file to write
    changes: list[Change]
    held_back: dict[str, Error]
    fitted: dict[str, Error]
    runs: int
    fit_runs: int
    held_back_runs: int
    skipped: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    path: str = ""
    wrote: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "fit_runs": self.fit_runs,
            "held_back_runs": self.held_back_runs,
            "held_back_error": {k: v.to_json() for k, v in self.held_back.items()},
            "fit_error": {k: v.to_json() for k, v in self.fitted.items()},
            "changes": [c.to_json() for c in self.changes],
            "skipped": self.skipped,
            "notes": self.notes,
            "path": self.path,
            "wrote": self.wrote,
            "calibration": self.data,
        }


def _mape(items: list[Sample], data: dict[str, Any], metric: str) -> float | None:
    errs = []
    for s in items:
        if metric == "tokens_per_s" and s.tps:
            p = s.speed(data)
            if p:
                errs.append(abs(p - s.tps) / s.tps)
        elif metric == "peak_reserved_gib" and s.reserved:
            errs.append(abs(s.memory(data)[1] - s.reserved) / s.reserved)
    return round(100 * median(errs), 2) if errs else None


def _count(items: list[Sample], metric: str) -> int:
    return sum(1 for s in items if (s.tps if metric == "tokens_per_s" else s.reserved))


def _errors(items: list[Sample], old: dict[str, Any], new: dict[str, Any]) -> dict[str, Error]:
    return {m: Error(_count(items, m), _mape(items, old, m), _mape(items, new, m)) for m in METRICS}


def _fit_speed_all(
    fit: list[Sample], data: dict[str, Any], notes: list[str], changes: list[Change]
) -> dict[str, Any]:
    timed = [s for s in fit if s.tps and s.gpu]
    if len(timed) < MIN_POOLED:
        notes.append(
            f"speed: {len(timed)} fitting runs with measured tokens/s on a catalog GPU, "
            f"{MIN_POOLED} needed: speed constants left as they are"
        )
        return data

    def apply(where: str | None, label: str, group: list[Sample]) -> None:
        nonlocal data
        new = fit_speed(group, data, where)
        if new is None:
            notes.append(
                f"{label}: its runs are bound by memory traffic or communication, which "
                "calibration does not fit: left as is"
            )
            return
        old = {n: calibration.value_at(data, where, "speed", SpeedConstants, n) for n in new}
        new = {n: v for n, v in new.items() if abs(v - old[n]) > SAME * abs(old[n])}
        if new:
            data = calibration.with_values(data, where, "speed", new)
            changes.extend(Change(label, n, old[n], v, len(group)) for n, v in new.items())

    apply(None, "speed", timed)
    by_group: dict[str, list[Sample]] = {}
    for s in timed:
        assert s.gpu is not None
        by_group.setdefault(calibration.group_key(s.gpu.name, s.method), []).append(s)
    for key, group in sorted(by_group.items()):
        if MIN_GROUP <= len(group) < len(timed):  # else too few, or the pooled runs again
            apply(key, f"groups.{key}.speed", group)
    return data


def _fit_memory_all(
    fit: list[Sample], data: dict[str, Any], notes: list[str], changes: list[Change]
) -> dict[str, Any]:
    measured = [s for s in fit if s.reserved or s.allocated]
    if len(measured) < MIN_POOLED:
        notes.append(
            f"memory: {len(measured)} fitting runs with measured peak memory, "
            f"{MIN_POOLED} needed: memory constants left as they are"
        )
        return data

    def apply(where: str | None, label: str, group: list[Sample], min_runs: int) -> None:
        nonlocal data
        old = {n: calibration.value_at(data, where, "memory", Overheads, n) for n in BOUNDS}
        new = fit_memory(group, data, where, min_runs)
        new = {n: v for n, v in new.items() if abs(v - old[n]) > SAME * max(abs(old[n]), 1.0)}
        if new:
            data = calibration.with_values(data, where, "memory", new)
            changes.extend(Change(label, n, old[n], v, len(group)) for n, v in new.items())

    apply(None, "memory", measured, MIN_POOLED)
    methods = Counter(s.method for s in measured)
    for method, n in sorted(methods.items()):
        if MIN_GROUP <= n < len(measured):
            key = calibration.group_key(None, method)
            group = [s for s in measured if s.method == method]
            apply(key, f"groups.{key}.memory", group, MIN_GROUP)
    return data


def _revert(data: dict[str, Any], old: dict[str, Any], section: str) -> dict[str, Any]:
    """`data` with `section` (top level and every group) as it was in `old`."""
    out = copy.deepcopy(data)
    out.pop(section, None)
    if section in old:
        out[section] = copy.deepcopy(old[section])
    groups = out.get(calibration.GROUPS) or {}
    for key in list(groups):
        groups[key].pop(section, None)
        before = (old.get(calibration.GROUPS) or {}).get(key, {})
        if section in before:
            groups[key][section] = copy.deepcopy(before[section])
        if not groups[key]:
            del groups[key]
    if calibration.GROUPS in out and not out[calibration.GROUPS]:
        del out[calibration.GROUPS]
    return out


def calibrate(
    runs: Iterable[RunRecord],
    current: dict[str, Any],
    holdout: float = 0.25,
    profiles: Profiles | None = None,
) -> Calibration:
    """Fit the constants to `runs`, starting from the calibration `current` (the file's
    parsed content); nothing is written."""
    if not 0 <= holdout <= MAX_HOLDOUT:
        raise FrugalError(
            f"--holdout {holdout:g}: give a share from 0 to {MAX_HOLDOUT:g} "
            "(0 fits on every run and checks nothing)"
        )
    items, skipped = samples(runs, profiles)
    if len(items) < MIN_RUNS:
        why = f" ({sum(skipped.values())} more could not be used)" if skipped else ""
        raise FrugalError(
            f"calibration needs at least {MIN_RUNS} runs with measured tokens/s or peak "
            f"memory on the books; there are {len(items)}{why}: record {MIN_RUNS - len(items)} "
            "more with frugal train (or frugal train --dry-run 20 on the GPU)"
        )
    hold_back(items, holdout)
    fit = [s for s in items if not s.held_back]
    held = [s for s in items if s.held_back]
    notes: list[str] = []
    changes: list[Change] = []
    data = copy.deepcopy(current)
    data = _fit_speed_all(fit, data, notes, changes)
    data = _fit_memory_all(fit, data, notes, changes)
    data, changes = _keep_what_holds(held, current, data, changes, notes)
    held_err = _errors(held, current, data)
    fit_err = _errors(fit, current, data)
    if holdout == 0:
        notes.append("--holdout 0: no run was held back, the fit is unchecked")
    data[calibration.ABOUT] = {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": len(items),
        "held_back_runs": len(held),
        "held_back_error_pct": {
            m: {"before": e.before_pct, "after": e.after_pct} for m, e in held_err.items()
        },
    }
    return Calibration(
        data=data,
        changes=changes,
        held_back=held_err,
        fitted=fit_err,
        runs=len(items),
        fit_runs=len(fit),
        held_back_runs=len(held),
        skipped=dict(skipped),
        notes=notes,
        path=str(calibration.path()),
    )


def _keep_what_holds(
    held: list[Sample],
    current: dict[str, Any],
    data: dict[str, Any],
    changes: list[Change],
    notes: list[str],
) -> tuple[dict[str, Any], list[Change]]:
    """The fitted constants, less each section (speed, memory) whose held-back error the
    fit would raise: that section is left as it was, and a note says so."""
    held_err = _errors(held, current, data)
    for metric, section in zip(METRICS, ("speed", "memory"), strict=True):
        e = held_err[metric]
        if e.before_pct is not None and e.after_pct is not None and e.after_pct > e.before_pct:
            notes.append(
                f"{section}: the held-back error would rise ({e.before_pct:g}% to "
                f"{e.after_pct:g}%): {section} constants left as they are"
            )
            data = _revert(data, current, section)
            changes = [c for c in changes if not c.where.endswith(section)]
    return data, changes


def calibrate_ledger(led: Ledger, holdout: float = 0.25, write: bool = True) -> Calibration:
    """Fit the constants to the ledger's runs and (with `write`) update the calibration
    file, keeping what it held that was not refitted."""
    cal = calibrate(led.runs(), calibration.read_data(), holdout)
    if write and cal.changes:
        calibration.write_data(cal.data)
        cal.wrote = True
    elif write:
        cal.notes.append("no constant changed: the calibration file was not written")
    return cal
