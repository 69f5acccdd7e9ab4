"""Activation offloading: each checkpointed layer's input waits for backward in host memory.

With activation checkpointing, what a decoder layer keeps for backward is its input (the
hidden states, b x s x hidden in the compute dtype); everything else is recomputed. Over L
layers that is L x b x s x hidden x 2 bytes on the device: 8 KiB a token per layer for
Llama-3.1-8B, 8 GiB at 32K tokens. Offloading copies each such input to (pinned) host
memory as the layer's forward saves it and back to the device when backward reaches the
layer, so the device holds one layer's input at a time instead of all of them.

The mechanism is PyTorch's own: saved-tensor hooks (`torch.autograd.graph.saved_tensors_hooks`,
the mechanism of `torch.autograd.graph.save_on_cpu`) around each layer's call to the
non-reentrant checkpoint. The checkpoint saves the layer's positional inputs through the hooks
in force around it and installs its own hooks inside, so exactly the checkpointed inputs
are offloaded: not the weights, not the shared rotary tables (passed by keyword), not the
tensors inside the layer (recomputed). The copies run on the compute stream (non-blocking
from pinned memory), so their time adds to the step: 2 x bytes / the host link per step
(`estimate.throughput`).

The host copies are made under `marks.host_memory()`, so a memory tracker counts them
apart from device memory (the estimator reports them as `host_offload_gib`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from frugal.step import marks


def _pack(t: torch.Tensor) -> Any:
    if isinstance(t, torch.nn.Parameter) or (not t.requires_grad and t.grad_fn is None):
        return t  # weights and constant inputs stay where they are
    with marks.host_memory():
        host = torch.empty(t.size(), dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
        host.copy_(t, non_blocking=True)
    return t.device, host


def _unpack(packed: Any) -> torch.Tensor:
    if isinstance(packed, torch.Tensor):
        return packed
    device, host = packed
    # a new device tensor even when "device" is the CPU, as on a GPU
    return torch.empty(host.size(), dtype=host.dtype, device=device).copy_(host, non_blocking=True)


def offloading(checkpoint: Callable[..., Any]) -> Callable[..., Any]:
    """`checkpoint` with the inputs it saves for backward kept in host memory."""

    def call(*args: Any, **kwargs: Any) -> Any:
        with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
            return checkpoint(*args, **kwargs)

    call.offloads = True  # type: ignore[attr-defined]
    return call


def offload_checkpointed_inputs(model: torch.nn.Module) -> None:
    """Make every checkpointed layer of `model` offload the inputs it saves."""
    for m in model.modules():
        fn = getattr(m, "_gradient_checkpointing_func", None)
        if fn is not None and not getattr(fn, "offloads", False):
            setattr(m, "_gradient_checkpointing_func", offloading(fn))  # noqa: B010
