"""Names shared by the simulation and the torch-free evaluation of cached profiles."""

from typing import Any

import numpy as np

CATEGORIES = (
    "frozen_weights",
    "trainable_weights",
    "gradients",
    "optimizer_state",
    "activations",
    "logits_and_loss",
    "temporaries",
    "offloaded_activations",  # in host memory (--offload-activations), not on the device
)
CAT_INDEX = {c: i for i, c in enumerate(CATEGORIES)}
HOST = CAT_INDEX["offloaded_activations"]
DEVICE = [i for i, c in enumerate(CATEGORIES) if i != HOST]
# segments of one step: forward; backward through loss and LM head, through the decoder
# layers, through the embeddings; optimizer (clipping, step, zero_grad)
SEGMENTS = ("fwd", "bwd_head", "bwd_layers", "bwd_tail", "opt")
PHASES = ("forward", "backward", "recompute")
# what bounds an op's time on a GPU (the tracker classes each op it records): tensor-core
# products; fused attention; bandwidth-bound elementwise and norm ops, reductions (softmax,
# the loss, sums) and copies or casts; 4-bit dequantization; activations offloaded over the
# host link; the optimizer's update; and allocations, which launch no kernel at all
OP_CLASSES = (
    "matmul",
    "attention",
    "elementwise",
    "reduction",
    "copy",
    "dequant",
    "offload",
    "optimizer",
    "alloc",
)
OP_CLASS = {c: i for i, c in enumerate(OP_CLASSES)}
# the parts of a step between the training loop's syncs (the loss read, the optimizer):
# a micro-step's forward and backward, and the update; each is timed on its own
PARTS = ("fwd", "bwd", "opt")


def step_parts(segments: Any, micro: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each traced op's part (an index into PARTS), and whether it is one that every
    micro-step and every update repeat: the first micro-step's forward and backward, and the
    optimizer's segment (op 0, the state before tracking, is none)."""
    seg, micro = np.asarray(segments), np.asarray(micro)
    part = np.where(seg == "fwd", 0, np.where(seg == "opt", 2, 1))
    keep = (seg != "setup") & ((micro == 1) | (seg == "opt"))
    keep[0] = False
    return part, keep


def peak_row(live: Any, idx: Any) -> Any:
    """The category bytes at the device peak among ops `idx` of a (ops, categories) timeline,
    with the host column at its own largest value over those ops (host memory peaks at the
    end of the forward, the device usually in backward)."""
    total = live[idx][:, DEVICE].sum(axis=1)
    row = live[idx[int(total.argmax())]].copy()
    row[HOST] = live[idx, HOST].max()
    return row
