"""From a few simulated steps to the memory and FLOPs of any depth, batch and length.

Two facts make a handful of small simulations exact for the whole model:

* Shapes. Every tensor a step allocates has a size that is a polynomial in the tokens
  t = b·s, with terms 1, t and t·s (the attention mask of each row is s x s, and eager
  attention stores b x heads x s x s scores). So the live bytes after each op are that
  same polynomial, and solving for its three coefficients from three runs predicts every
  op of a run with any other shape. Runs are aligned op by op first (a longer run can add
  a view or a copy).
* Depth. Decoder layers are identical, so within each segment of the step (forward;
  backward through the loss and LM head; through the layers; through the embeddings;
  optimizer) the peak grows linearly with the number of layers: the forward peak adds one
  layer's saved activations per layer, the backward-through-layers peak sits either at the
  top or the bottom layer and adds max(saved activations, gradients) per layer. Running
  k and k + 1 layers gives that line, and the model's depth is read off it.

The same holds op by op for time: each op's FLOPs and the bytes it moves are polynomials of
the same terms (a product's FLOPs grow with b·s, attention's with b·s²), so the op table of
a step of any shape comes from the same three runs (`LayerFit.op_table`), and the line
through the two depths gives the model's (`optime.StepOps`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from frugal.estimate.categories import (
    CATEGORIES,
    HOST,
    PARTS,
    PHASES,
    SEGMENTS,
    peak_row,
    step_parts,
)
from frugal.estimate.optime import Depths, OpTable, StepOps


def features(b: int, s: int) -> np.ndarray:
    """Polynomial terms 1, b·s and b·s² of a (batch, seq) shape.

    Runs use batch 1, so a size that grows with s alone is fitted as if it grew with b·s:
    exact at batch 1, conservative above it. The step gives every row its own position ids,
    so the rotary tables grow with b·s; what is left of s alone is the positions' `arange`
    (8 bytes a token), which makes the estimate at most 8·s·(b-1) bytes high.
    """
    return np.array([1.0, float(b * s), float(b * s * s)])


def grid(s0: int) -> list[tuple[int, int]]:
    """The (batch, seq) runs whose features are independent."""
    return [(1, s0), (1, 2 * s0), (1, 3 * s0)]


def align(ref: np.ndarray, other: np.ndarray, window: int = 64, run: int = 6) -> np.ndarray:
    """For each op of `ref`, the index of the same op in `other`.

    Sequences differ by a few inserted ops; after a mismatch, the smallest skip on either
    side that brings `run` ops back into agreement resynchronizes them. Ops of `ref` with no
    partner map to the last matched op of `other`.
    """
    n, m = len(ref), len(other)
    out = np.empty(n, dtype=np.int64)
    i = j = 0
    while i < n:
        if j < m and ref[i] == other[j]:
            out[i] = j
            i += 1
            j += 1
            continue
        found = None
        for d in range(1, window + 1):
            for di in range(d + 1):
                dj = d - di
                a, b = ref[i + di : i + di + run], other[j + dj : j + dj + run]
                if len(a) and len(a) == len(b) and np.array_equal(a, b):
                    found = (di, dj)
                    break
            if found:
                break
        if found is None:  # give up: map the rest onto the tail
            out[i:] = min(max(j - 1, 0), m - 1)
            break
        di, dj = found
        out[i : i + di] = max(j - 1, 0)
        i += di
        j += dj
    return out


@dataclass(frozen=True)
class OpFit:
    """The unique ops of a step at one depth, each op's FLOPs and bytes a polynomial of the
    shape's features (1, b·s, b·s²): its part of the step (a PARTS index), class (an
    OP_CLASSES index), how many times it runs, and its coefficients (ops, 3) each. A
    profile's file holds it as one array (`to_array`, columns in that order)."""

    part: np.ndarray
    kind: np.ndarray
    count: np.ndarray
    flops: np.ndarray  # (ops, 3)
    nbytes: np.ndarray  # (ops, 3)

    @classmethod
    def from_array(cls, a: np.ndarray) -> OpFit:
        return cls(a[:, 0], a[:, 1], a[:, 2], a[:, 3:6], a[:, 6:9])

    def to_array(self) -> np.ndarray:
        return np.column_stack([self.part, self.kind, self.count, self.flops, self.nbytes])

    def same_ops(self, other: OpFit) -> bool:
        """The same ops, merged alike (only their sizes may differ)."""
        return len(self.part) == len(other.part) and all(
            np.array_equal(a, b)
            for a, b in (
                (self.part, other.part),
                (self.kind, other.kind),
                (self.count, other.count),
            )
        )

    def at(self, phi: np.ndarray, host_ops: np.ndarray) -> OpTable:
        """The op table at the shape of features `phi`."""
        flops = np.maximum(self.flops @ phi, 0.0)
        nbytes = np.maximum(self.nbytes @ phi, 0.0)
        return OpTable(self.part, self.kind, flops, nbytes, self.count, host_ops[0], host_ops[1])


@dataclass
class LayerFit:
    """Per-op live bytes and per-phase FLOPs as polynomials of (b, s), for one depth."""

    n_layers: int
    coef: np.ndarray  # (ops, categories, terms)
    segments: np.ndarray  # (ops,) segment index
    flop_coef: np.ndarray  # (phases, terms): matmul-like FLOPs of one micro-step
    attn_coef: np.ndarray  # (phases,): fused-attention FLOPs per b·s²
    total_params: int
    trainable_params: int
    active_params: int
    ops: OpFit  # the ops every micro-step and update repeat, identical ones merged
    host_ops: np.ndarray  # (2, parts): ops and views the host dispatches in each part

    @classmethod
    def from_traces(
        cls,
        n_layers: int,
        shapes: list[tuple[int, int]],
        traces: list[Any],
        micro_steps: int = 2,
    ) -> LayerFit:
        """Fit the traces of one depth. With `micro_steps=1`, a run of two accumulation
        micro-steps also gives the single-micro-step step: its first micro-step and its
        optimizer segment, which starts from the same state (weights, full gradients,
        optimizer state) either way."""
        ref = traces[0]
        samples = [ref.live]
        for t in traces[1:]:
            samples.append(t.live[align(ref.op_ids, t.op_ids)])
        phi = np.stack([features(b, s) for b, s in shapes])  # (points, terms)
        y = np.stack(samples)  # (points, ops, categories)
        coef = np.linalg.solve(phi, y.reshape(len(shapes), -1))  # (terms, ops*categories)
        coef = coef.reshape(phi.shape[1], *ref.live.shape).transpose(1, 2, 0)
        fl = np.array([[t.flops[p] for p in PHASES] for t in traces], dtype=np.float64)
        flop_coef = np.linalg.solve(phi, fl).T
        b0, s0 = shapes[0]
        attn = np.array([ref.attn_flops[p] for p in PHASES], dtype=np.float64) / (b0 * s0 * s0)
        seg_index = {s: i for i, s in enumerate(SEGMENTS)}
        segs = np.array([seg_index.get(s, -1) for s in ref.segments])
        segs[(ref.micro > micro_steps) & (ref.segments != "opt")] = -1
        ops, host_ops = _fit_ops(phi, traces)
        return cls(
            n_layers,
            coef,
            segs,
            flop_coef,
            attn,
            ref.total_params,
            ref.trainable_params,
            ref.active_params,
            ops,
            host_ops,
        )

    def peaks(self, phi: np.ndarray) -> np.ndarray:
        """Category bytes at the (device) peak of each segment: (segments, categories); host
        bytes at their own peak within the segment."""
        live = self.coef @ phi  # (ops, categories)
        out = np.zeros((len(SEGMENTS), len(CATEGORIES)))
        for k in range(len(SEGMENTS)):
            idx = np.flatnonzero(self.segments == k)
            if len(idx):
                out[k] = peak_row(live, idx)
        return out

    def flops(self, phi: np.ndarray, b: int, s: int) -> np.ndarray:
        return self.flop_coef @ phi + self.attn_coef * (b * s * s)

    def op_table(self, phi: np.ndarray) -> OpTable:
        """The op table of one micro-step and update at the shape of features `phi`."""
        return self.ops.at(phi, self.host_ops)


def _fit_ops(phi: np.ndarray, traces: list[Any]) -> tuple[OpFit, np.ndarray]:
    """The op table's polynomial per op (`LayerFit.ops`) from runs of the shapes of `phi`,
    aligned op by op on the first; and the host's ops and views per part."""
    ref = traces[0]
    part, keep = step_parts(ref.segments, ref.micro)
    idx = np.flatnonzero(keep)
    y = [ref.ops.cost(idx)] + [t.ops.cost(align(ref.op_ids, t.op_ids)[idx]) for t in traces[1:]]
    coef = np.linalg.solve(phi, np.stack(y).reshape(len(traces), -1))  # (terms, ops * 2)
    coef = coef.reshape(phi.shape[1], len(idx), 2).transpose(1, 2, 0).reshape(len(idx), -1)
    # FLOPs and bytes per term are whole (or half: a triangle) numbers: rounding merges
    # identical ops whatever the solve's last bits
    rows = np.column_stack([part[idx], ref.ops.kind[idx], np.round(coef, 2)])
    uniq, counts = np.unique(rows, axis=0, return_counts=True)
    ops = OpFit.from_array(np.column_stack([uniq[:, :2], counts, uniq[:, 2:]]))
    host = np.stack(
        [
            np.bincount(part[idx], minlength=len(PARTS)).astype(np.float64),
            np.bincount(part[idx], weights=ref.ops.views[idx], minlength=len(PARTS)),
        ]
    )
    return ops, host


def at_rank(a: Profile, ra: int, b: Profile, rb: int, r: int) -> Profile | None:
    """The profile of LoRA rank `r` from the profiles of ranks `ra` and `rb` of the same job,
    or None where their ops differ.

    The rank changes no op of the step, only sizes: the adapters A (r x in) and B (out x r),
    their gradients and optimizer state, and the r-wide activations x·Aᵀ are all linear in r,
    and so are their FLOPs. Every coefficient of a fit is therefore affine in r, and two
    ranks give any other exactly (a rank sweep simulates two)."""
    if a.n_layers != b.n_layers or a.lora_targets != b.lora_targets or a.attention != b.attention:
        return None
    t = (r - ra) / (rb - ra)

    def mix(x: Any, y: Any) -> Any:
        return x + t * (y - x)

    fits = []
    for fa, fb in zip(a.fits, b.fits, strict=True):
        same = (
            fa.n_layers == fb.n_layers
            and fa.coef.shape == fb.coef.shape
            and np.array_equal(fa.segments, fb.segments)
            and fa.ops.same_ops(fb.ops)
            and np.array_equal(fa.host_ops, fb.host_ops)
        )
        if not same:
            return None
        fits.append(
            LayerFit(
                fa.n_layers,
                mix(fa.coef, fb.coef),
                fa.segments.copy(),
                mix(fa.flop_coef, fb.flop_coef),
                mix(fa.attn_coef, fb.attn_coef),
                round(mix(fa.total_params, fb.total_params)),
                round(mix(fa.trainable_params, fb.trainable_params)),
                round(mix(fa.active_params, fb.active_params)),
                replace(
                    fa.ops,
                    flops=mix(fa.ops.flops, fb.ops.flops),
                    nbytes=mix(fa.ops.nbytes, fb.ops.nbytes),
                ),
                fa.host_ops.copy(),
            )
        )
    return Profile(a.n_layers, (fits[0], fits[1]), list(a.lora_targets), a.attention)


@dataclass
class Profile:
    """Everything needed to answer any (batch, seq) for one model and job, without torch."""

    n_layers: int  # the model's depth
    fits: tuple[LayerFit, LayerFit]  # depths k and k + 1
    lora_targets: list[str]
    attention: str  # the attention kernel the step runs
    # evaluated shapes: a search asks for the same few (batch, seq) thousands of times
    _memo: dict[tuple[int, int], np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _ops: dict[tuple[int, int], StepOps] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def depths(self) -> Depths:
        return Depths(self.fits[0].n_layers, self.fits[1].n_layers)

    def _extrapolate(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.depths.at(self.n_layers, a, b)

    def segment_peaks(self, batch: int, seq: int) -> np.ndarray:
        """(segments, categories) bytes at each segment's peak for the full depth."""
        if (batch, seq) not in self._memo:
            phi = features(batch, seq)
            lo, hi = (f.peaks(phi) for f in self.fits)
            self._memo[batch, seq] = np.maximum(self._extrapolate(lo, hi), 0.0)
        return self._memo[batch, seq].copy()

    def host_bytes(self, batch: int, seq: int) -> float:
        """Bytes a micro-step offloads to host memory (--offload-activations), at their peak."""
        return float(self.segment_peaks(batch, seq)[:, HOST].max())

    def flops(self, batch: int, seq: int) -> dict[str, float]:
        """FLOPs of one micro-step (forward, backward, recompute) for the full depth."""
        phi = features(batch, seq)
        lo, hi = (f.flops(phi, batch, seq) for f in self.fits)
        return dict(zip(PHASES, (float(x) for x in self._extrapolate(lo, hi)), strict=True))

    def step_ops(self, batch: int, seq: int) -> StepOps:
        """The op tables of one micro-step and update of (batch, seq) at the two depths."""
        if (batch, seq) not in self._ops:
            phi = features(batch, seq)
            lo, hi = self.fits
            self._ops[batch, seq] = StepOps(lo.op_table(phi), hi.op_table(phi), self.depths)
        return self._ops[batch, seq]

    def _params(self, which: str) -> int:
        lo, hi = (getattr(f, which) for f in self.fits)
        return round(self.depths.at(self.n_layers, lo, hi))

    @property
    def total_params(self) -> int:
        return self._params("total_params")

    @property
    def trainable_params(self) -> int:
        return self._params("trainable_params")

    @property
    def active_params(self) -> int:
        """Parameters a token meets (all of them but for a MoE model's idle experts)."""
        return self._params("active_params")

    def start_bytes(self, category: str) -> float:
        """Bytes of `category` resident when a step starts (weights, optimizer state)."""
        return float(self.segment_peaks(1, 1)[0, CATEGORIES.index(category)])

    def per_layer_bytes(self, category: str) -> float:
        """Bytes of one decoder layer's `category` (e.g. its weights), from the two fits."""
        c = CATEGORIES.index(category)
        lo, hi = (f.coef[0, c, 0] for f in self.fits)
        return float(hi - lo)
