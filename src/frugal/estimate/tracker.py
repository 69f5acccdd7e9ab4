"""Live-storage and FLOP accounting under tensors without data.

`StepTracker` is a TorchDispatchMode stacked above a `PhantomMode` (`phantom.py`; or torch's
FakeTensorMode, the reference the phantoms are tested against). Every aten op the
forward, backward and optimizer run passes through it; each new storage is recorded with the
op that created it, and a weakref finalizer records the op after which it died. From those
intervals `timeline()` rebuilds the live bytes per category after every op — what
`torch.cuda.memory_allocated()` would read at that moment, before allocator rounding.

It watches real tensors as well as fake ones: the estimate runs the training step on fake
tensors under it, and the self-consistency tests run `frugal train`'s step on real CPU
tensors under the same tracker and compare the two. The step's own marks
(`frugal.step.marks`) say which phase and micro-step is running; `watch` adopts a model's
weights and an optimizer's state and labels gradients as they are accumulated.

Each op is also entered in an op table, the input of the step-time model: its class (what
bounds it on a GPU, `categories.OP_CLASSES`), its FLOPs and the bytes it reads and writes
(every tensor argument and result at its own size, views included), and how many
metadata-only ops (views, detaches) were dispatched before it: the host dispatches those too.

FLOPs use PyTorch's own formulas (`torch.utils.flop_counter`, the table FlopCounterMode
uses), with the additions of `flops.py` (the CPU flash-attention kernel, grouped GEMMs).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from frugal.estimate.categories import CAT_INDEX, CATEGORIES, OP_CLASS, PHASES, SEGMENTS
from frugal.estimate.flops import FORWARD_ONLY, register_experts_fallback
from frugal.estimate.optime import TracedOps
from frugal.estimate.phantom import storage
from frugal.step import marks

aten = torch.ops.aten
_DEVICE = torch.ops.prim.device.default
_META = torch.device("meta")

__all__ = ["CATEGORIES", "PHASES", "SEGMENTS", "StepTracker"]

ATTENTION_OPS = {
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_efficient_attention_backward,
}
_OP_IDS: dict[object, int] = {}
# ops that never allocate: skip the storage bookkeeping for them
_NO_ALLOC = {
    torch.ops.prim.device.default,
    aten.detach.default,
    aten.view.default,
    aten._unsafe_view.default,
    aten.t.default,
    aten.transpose.int,
    aten.permute.default,
    aten.expand.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.slice.Tensor,
    aten.select.int,
    aten.alias.default,
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.as_strided.default,
    aten.sym_size.int,
    aten.sym_stride.int,
    aten.sym_numel.default,
    aten.sym_storage_offset.default,
    aten.is_same_size.default,
}


_MATMUL = {
    aten.mm,
    aten.addmm,
    aten.bmm,
    aten.baddbmm,
    aten.addbmm,
    aten.addmv,
    aten.mv,
    aten.dot,
    aten._grouped_mm,
    aten.convolution,
    aten.convolution_backward,
}
_REDUCTION = {
    aten.sum,
    aten.mean,
    aten.amax,
    aten.amin,
    aten.max,
    aten.min,
    aten.norm,
    aten.linalg_vector_norm,
    aten.var_mean,
    aten.logsumexp,
    aten._log_softmax,
    aten._softmax,
    aten._log_softmax_backward_data,
    aten._softmax_backward_data,
    aten.nll_loss_forward,
    aten.nll_loss_backward,
    aten.topk,
    aten.sort,
    aten.argmax,
    aten.cumsum,
    aten.histc,
    aten.bincount,
}
_ALLOC = {
    aten.empty,
    aten.empty_like,
    aten.empty_strided,
    aten.new_empty,
    aten.new_empty_strided,
}  # the caching allocator's: no kernel
_COPY = {
    aten._to_copy,
    aten.copy_,
    aten.clone,
    aten.cat,
    aten.stack,
    aten.index_select,
    aten.embedding,
    aten.embedding_dense_backward,
    aten.index,
    aten.index_put_,
    aten.gather,
    aten.scatter,
    aten.scatter_add,
    aten.index_add,
    aten._unsafe_index,
    aten.repeat,
    aten.new_zeros,
    aten.zeros_like,
    aten.fill_,
    aten.zero_,
}


def _moved_bytes(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> int:
    """Bytes an op reads and writes: its tensor arguments (and lists of them: an aten op
    nests no deeper) and its results, each at its own size (a view's, not its storage's)."""
    n = 0
    for a in (*args, *kwargs.values(), *outs):
        if isinstance(a, torch.Tensor):
            n += a.numel() * a.element_size()
        elif isinstance(a, list | tuple):
            n += sum(t.numel() * t.element_size() for t in a if isinstance(t, torch.Tensor))
    return n


@dataclass(slots=True)
class _Storage:
    nbytes: int
    born: int  # index of the op that created it (0: existed before tracking)
    died: int  # first op index at which it is gone
    kind: str  # category, refined after backward and optimizer steps
    vocab_last: bool  # created with the vocabulary as its last dimension


class StepTracker(TorchDispatchMode):
    """Records storage lifetimes and FLOPs of every op run under it."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        register_experts_fallback()  # the model, built before its tracker, defined them
        self.vocab_size = vocab_size
        self.op = 0
        self.segment = "fwd"
        self.segment_of_op: list[str] = ["setup"]
        self.micro = 1  # which micro-step of gradient accumulation is running
        self.micro_of_op: list[int] = [0]
        self.op_ids: list[int] = [-1]  # which aten op each op was (to align runs)
        self.records: list[_Storage] = []
        self._live: dict[int, _Storage] = {}
        self.flops = dict.fromkeys(PHASES, 0)  # matmul-like FLOPs, grow with b x s
        self.attn_flops = dict.fromkeys(PHASES, 0)  # fused attention, grows with b x s^2
        self.forward_region = 0  # >0 inside a custom autograd Function's forward
        self.temp_depth = 0  # >0 inside a dequantize / weight-cast region
        self.host_depth = 0  # >0 while offloading activations to host memory
        self.param_storages: set[int] = set()
        self.count_flops = True
        # the op table (index 0: before tracking), see the module's docstring
        self.op_class: list[int] = [OP_CLASS["elementwise"]]
        self.op_flops: list[int] = [0]
        self.op_bytes: list[int] = [0]
        self.op_views: list[int] = [0]
        self._views = 0

    # -- recording ---------------------------------------------------------------
    def _record(self, st: torch.UntypedStorage, kind: str, vocab_last: bool) -> None:
        key = id(st)
        if key in self._live:
            return
        rec = _Storage(st.nbytes(), self.op, -1, kind, vocab_last)
        self._live[key] = rec
        self.records.append(rec)
        weakref.finalize(st, self._free, key)

    def _free(self, key: int) -> None:
        rec = self._live.pop(key, None)
        if rec is not None:
            rec.died = self.op + 1

    def adopt(self, tensor: torch.Tensor, kind: str) -> None:
        """Record a tensor that existed before tracking began (weights, buffers)."""
        st = storage(tensor)
        self._record(st, kind, False)
        if kind.endswith("weights"):
            self.param_storages.add(id(st))

    def relabel(self, tensors: Iterator[torch.Tensor] | list[torch.Tensor], kind: str) -> None:
        for t in tensors:
            rec = self._live.get(id(storage(t)))
            if rec is not None:
                rec.kind = kind

    @contextmanager
    def _within(self, depth: str) -> Iterator[None]:
        """Count one level deeper into the region whose depth attribute is `depth`."""
        setattr(self, depth, getattr(self, depth) + 1)
        try:
            yield
        finally:
            setattr(self, depth, getattr(self, depth) - 1)

    def temporary(self) -> AbstractContextManager[None]:
        """Storages made inside are temporaries (dequantization buffers)."""
        return self._within("temp_depth")

    def on_host(self) -> AbstractContextManager[None]:
        """Storages made inside are in host memory (offloaded activations)."""
        return self._within("host_depth")

    def in_forward(self) -> AbstractContextManager[None]:
        """Ops inside a custom autograd Function's forward (grad mode is off there)."""
        return self._within("forward_region")

    def set_segment(self, name: str) -> None:
        self.segment = name

    def begin_micro(self, index: int) -> None:
        """Micro-step `index` of accumulation; FLOPs are those of the first one."""
        self.micro = index
        self.count_flops = index == 1

    def watch(self, model: Any, optimizer: Any = None) -> list[Any]:
        """Adopt the model's weights, buffers and 4-bit quantization state and the
        optimizer's state; label each gradient when it is accumulated; mark the backward
        segments at the decoder layers. Returns the hooks (remove them when done)."""
        from frugal.step.optim import optimizer_tensors
        from frugal.step.qlora import quant_state_tensors

        for m in model.modules():
            for p in m.parameters(recurse=False):
                self.adopt(p, "trainable_weights" if p.requires_grad else "frozen_weights")
            for b in m.buffers(recurse=False):
                self.adopt(b, "frozen_weights")
        for t in quant_state_tensors(model):
            self.adopt(t, "frozen_weights")
        if optimizer is not None:
            for t in optimizer_tensors(optimizer):
                self.adopt(t, "optimizer_state")
        hooks = [
            p.register_post_accumulate_grad_hook(
                lambda p: self.relabel([p.grad], "gradients") if p.grad is not None else None
            )
            for p in model.parameters()
            if p.requires_grad
        ]
        return hooks + _segment_hooks(model, self)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # nothing under it is compiled: spare every op the dynamo guard

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE and type(args[0]) is FakeTensor:
            # two of every three ops a step dispatches ask a fake tensor its device: answer
            # as the fake mode would, without the trip down to it (15% of a simulation)
            fake = args[0]
            return _META if fake.fake_mode.in_kernel_invocation else fake.fake_device
        kwargs = kwargs or {}
        if func in _NO_ALLOC:  # views and metadata: nothing to record, keep it cheap
            self._views += func is not _DEVICE  # a real tensor's device is no dispatch
            return func(*args, **kwargs)
        self.op += 1
        self.segment_of_op.append(self.segment)
        self.micro_of_op.append(self.micro)
        self.op_ids.append(_OP_IDS.setdefault(func, len(_OP_IDS)))
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        outs = [out] if isinstance(out, torch.Tensor) else tree_flatten(out)[0]
        n = 0
        if self.count_flops or self.segment == "opt":  # the micro-steps after the first
            # repeat the first: the op table and the FLOPs are the first's (and the update)
            if packet in flop_registry:
                n = flop_registry[packet](*args, **kwargs, out_val=out)
            self._enter_op(packet, n, _moved_bytes(args, kwargs, outs))
        else:
            self._enter_op(packet, 0, 0)
        if self.count_flops and n:
            book = self.attn_flops if packet in ATTENTION_OPS else self.flops
            if self.segment == "fwd":
                book["forward"] += n
            elif torch.is_grad_enabled() or self.forward_region or packet in FORWARD_ONLY:
                # backward runs with grad mode off; checkpointing re-runs the forward
                # with it on, so an op seen in backward with grad enabled is recompute
                book["recompute"] += n
            else:
                book["backward"] += n
        kind = "temporaries" if self.temp_depth or self.segment == "opt" else "activations"
        if self.host_depth:
            kind = "offloaded_activations"
        if func in (aten._to_copy.default, aten.clone.default) and args:
            src = args[0]
            if isinstance(src, torch.Tensor) and id(storage(src)) in self.param_storages:
                kind = "temporaries"  # autocast's low-precision copy of a weight
        for t in outs:
            if isinstance(t, torch.Tensor):
                vocab_last = t.dim() >= 2 and t.shape[-1] == self.vocab_size
                self._record(storage(t), kind, vocab_last)
        return out

    def _enter_op(self, packet: Any, flops: int, nbytes: int) -> None:
        """The op just run, into the op table: its class, FLOPs and bytes moved."""
        if packet in _ALLOC and self.temp_depth and not self.host_depth:
            # the 4-bit stand-ins allocate what dequantize_4bit writes: the kernel writes
            # the 16-bit values and reads their 4-bit codes (a quarter as many bytes)
            kind, nbytes = "dequant", nbytes * 5 // 4
        elif packet in _ALLOC:
            kind, nbytes = "alloc", 0
        elif self.segment == "opt":
            kind = "optimizer"
        elif self.host_depth:
            kind = "offload"
        elif self.temp_depth:
            kind = "dequant"
        elif packet in ATTENTION_OPS:
            kind = "attention"
        elif packet in _MATMUL or (flops and packet not in _REDUCTION):
            kind = "matmul"  # transformers' grouped-GEMM fallback among them
        elif packet in _REDUCTION:
            kind = "reduction"
        elif packet in _COPY:
            kind = "copy"
        else:
            kind = "elementwise"
        self.op_class.append(OP_CLASS[kind])
        self.op_flops.append(flops)
        self.op_bytes.append(nbytes)
        self.op_views.append(self._views)
        self._views = 0

    # -- results -----------------------------------------------------------------
    def timeline(self) -> np.ndarray:
        """Live bytes per category after each op: shape (ops + 1, categories)."""
        n = self.op + 2
        delta = np.zeros((n, len(CATEGORIES)), dtype=np.float64)
        for r in self.records:
            kind = r.kind
            if kind == "activations" and r.vocab_last:
                kind = "logits_and_loss"
            c = CAT_INDEX[kind]
            delta[r.born, c] += r.nbytes
            died = r.died if r.died >= 0 else n - 1
            delta[died, c] -= r.nbytes
        return np.cumsum(delta, axis=0)[: self.op + 1]

    def op_table(self) -> TracedOps:
        """Per op (index 0: before tracking): its class index, FLOPs, bytes read and
        written, and the metadata-only ops dispatched before it."""
        cols = (self.op_class, self.op_flops, self.op_bytes, self.op_views)
        return TracedOps(*(np.array(c, dtype=np.float64) for c in cols))

    def segments(self) -> np.ndarray:
        return np.array(self.segment_of_op)

    def micro_steps(self) -> np.ndarray:
        return np.array(self.micro_of_op)


@contextmanager
def tracking(tracker: StepTracker) -> Iterator[StepTracker]:
    """Record every op under `tracker`, which also observes the step's marks."""
    with marks.observing(tracker), tracker:
        yield tracker


def _decoder_layers(model: Any) -> torch.nn.ModuleList | None:
    best: torch.nn.ModuleList | None = None
    for name, m in model.named_modules():
        is_layers = isinstance(m, torch.nn.ModuleList) and name.endswith("layers") and len(m) > 0
        if is_layers and (best is None or len(m) > len(best)):
            best = m
    return best


def _segment_hooks(model: Any, tracker: StepTracker) -> list[Any]:
    """Backward segments: head (loss, LM head) -> decoder layers -> tail (embeddings)."""
    layers = _decoder_layers(model)
    if layers is None:
        return []

    def first(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x
        if isinstance(x, tuple | list) and x and isinstance(x[0], torch.Tensor):
            return x[0]
        return None

    def on_first_layer_input(module: Any, args: Any, kwargs: Any) -> None:
        h = first(args) if args else first(kwargs.get("hidden_states"))
        if tracker.segment == "fwd" and h is not None and h.requires_grad:
            h.register_hook(lambda g: tracker.set_segment("bwd_tail"))

    def on_last_layer_output(module: Any, args: Any, kwargs: Any, out: Any) -> None:
        h = first(out)
        if tracker.segment == "fwd" and h is not None and h.requires_grad:
            h.register_hook(lambda g: tracker.set_segment("bwd_layers"))

    return [
        layers[0].register_forward_pre_hook(on_first_layer_input, with_kwargs=True),
        layers[-1].register_forward_hook(on_last_layer_output, with_kwargs=True),
    ]
