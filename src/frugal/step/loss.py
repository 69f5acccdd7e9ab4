"""The training step's losses: (sum, count) pairs, so that gradient accumulation is exact.

Every loss here returns the *sum* of its terms in fp32 and the number of terms as a 0-dim
tensor. The trainer adds sums and counts over all micro-batches of one optimizer step and
divides once, so a step's loss does not depend on how its batch was split into micro-batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from frugal.step import IGNORE as IGNORE  # part of this module's API


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal LM cross-entropy, summed over predicted tokens.

    logits [B, T, V], labels [B, T] (unshifted: labels[t] is the token at t, IGNORE where not
    trained). Position t predicts labels[t+1], so with p = softmax(logits[b, t]):

        sum = sum_{b, t < T-1, labels[b, t+1] != IGNORE} -log p[labels[b, t+1]]

    Returns (sum of token losses in fp32, number of predicted tokens as a 0-dim tensor).
    sum / count is the usual mean (Hugging Face's ``ForCausalLMLoss``); the caller divides by
    the token count of the whole optimizer step (all micro-batches), so gradient accumulation
    is exact rather than a mean of per-micro-batch means.

    The labels are shifted, not the logits (as transformers' own loss does): the logits stay
    one contiguous tensor and the only copy of them is the fp32 one the loss needs, where
    slicing the logits would first copy them in their own dtype (B x T x V more bytes).
    """
    vocab = logits.shape[-1]
    target = F.pad(labels[:, 1:], (0, 1), value=IGNORE).reshape(-1)
    total = F.cross_entropy(
        logits.reshape(-1, vocab).float(), target, ignore_index=IGNORE, reduction="sum"
    )
    count = (target != IGNORE).sum()
    return total, count


def classification_loss(
    logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A classifier's cross-entropy, summed over its rows.

    logits [B, C] (the head's output at each row's last token), labels [B] class ids, `weight`
    [C] per class or None. With w = weight (else 1), p = softmax(logits[b]):

        sum = sum_b w[labels[b]] * -log p[labels[b]],   count = sum_b w[labels[b]]

    sum / count is torch's weighted mean (`F.cross_entropy(..., weight=w)`), so summing both
    over micro-batches and dividing once gives the step's exact weighted mean."""
    w = None if weight is None else weight.to(logits.device, torch.float32)
    total = F.cross_entropy(logits.float(), labels, weight=w, reduction="sum")
    count = labels.new_tensor(labels.numel()) if w is None else w[labels].sum()
    return total, count


def contrastive_loss(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    segment_ids: torch.Tensor,
    margin: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SimCTG token-level contrastive loss, summed over packed segments.

    Source: Su et al., 2022, "A Contrastive Framework for Neural Text Generation", NeurIPS,
    eq. 2. For one sequence x of |x| tokens with hidden states h and margin rho,

        L_CL = 1 / (|x| (|x| - 1)) * sum_i sum_{j != i} max(0, rho - s(h_i, h_i) + s(h_i, h_j))

    with s the cosine similarity, so s(h_i, h_i) = 1 and each term is
    max(0, rho - 1 + cos(h_i, h_j)).

    hidden [B, T, H] (last hidden states); labels [B, T] as in `causal_lm_loss`: only tokens
    with labels != IGNORE take part (prompt and padding are excluded); segment_ids [B, T] int:
    packed samples in one row have different ids, and only pairs within one (row, segment)
    count, never across packed-sample boundaries. Each (row, segment) with k >= 2 valid tokens
    contributes its own L_CL, the average over its k (k - 1) ordered pairs.

    Returns (sum over segments of their L_CL in fp32, number of contributing segments as a
    0-dim tensor). With no contributing segment the sum is 0, still attached to the graph.

    Vectorised with static shapes (so the estimate runs this very code on fake tensors): one
    [B, T, T] similarity and pair mask (memory O(B T^2), nothing of T x T alone, which the
    estimate's size terms would not fit); each anchor's hinge sum is divided
    by its own segment's k (k - 1), so summing the anchors gives the per-segment averages;
    no Python loop, no data-dependent indexing.
    """
    valid = labels != IGNORE  # [B, T]
    # Zero the excluded tokens first: they then cannot leak into the loss (not even a NaN)
    # and get an exactly zero gradient.
    h = torch.where(valid.unsqueeze(-1), hidden.float(), 0.0)
    h = F.normalize(h, dim=-1)
    cos = h @ h.transpose(1, 2)  # [B, T, T]

    same = (segment_ids.unsqueeze(2) == segment_ids.unsqueeze(1)) & valid.unsqueeze(1)
    k = same.sum(-1)  # [B, T]: valid tokens in each token's segment (itself included)
    pairs = same & valid.unsqueeze(2)  # [B, T, T]
    pairs.diagonal(dim1=1, dim2=2).fill_(False)  # no token pairs with itself
    hinge = torch.where(pairs, torch.clamp(margin - 1.0 + cos, min=0.0), 0.0)
    per_anchor = hinge.sum(dim=-1)  # [B, T]: sum over j of anchor i's terms
    kf = k.float()
    anchors = valid & (k >= 2)
    # Attached to the graph through per_anchor even when nothing contributes (an empty sum).
    total = torch.where(anchors, per_anchor / (kf * (kf - 1)).clamp(min=1.0), 0.0).sum()
    # a segment counts once: at its first valid token (no valid token of it earlier)
    earlier = same.tril(-1).any(-1)
    return total, (anchors & ~earlier).sum()
