"""Chunked linear cross-entropy: the LM head and the loss without the whole logits tensor.

`chunked_linear_cross_entropy(hidden, weight, labels)` returns exactly what
`loss.causal_lm_loss(hidden @ weight.T (+ bias), labels)` returns, (sum of the token losses
in fp32, count), and the same gradients, but it never holds more than one chunk of logits.

The technique (facts from its public descriptions; no code taken from them):

* Liger-Kernel's FusedLinearCrossEntropy (Hsu et al., 2024, arXiv 2410.10989): the plain
  head materializes a [B x T, V] logits tensor, and its gradient as well; with Llama-3's
  V = 128256 against H = 4096 that tensor is about 31x the hidden states it comes from.
  Liger splits the tokens into chunks, projects one chunk at a time and computes that
  chunk's gradients during the forward, keeping a [V, H] grad_weight until backward.
* Apple's Cut Cross-Entropy (Wijmans et al., 2024, arXiv 2411.09009): compute only the
  target token's logit and the log-sum-exp over the vocabulary on the fly, never the logit
  matrix in global memory; for Gemma 2 (2B) the loss's memory falls from 24 GB to 1 MB.
  CCE also skips gradient entries below numerical precision; this module does not (exact).

Here, in plain torch ops (so the estimator runs this very code on fake tensors): the forward
walks the tokens in chunks of `chunk_tokens`, computes each chunk's logits in the matmul's
dtype (autocast's under autocast, as the plain head does), upcasts them to fp32, and keeps
only the target logit and the log-sum-exp (one fp32 per token, saved for backward). The
backward recomputes each chunk's logits, turns them in place into softmax - onehot(target)
scaled by the incoming gradient, and accumulates grad_hidden (hidden's dtype) and
grad_weight (fp32, cast to weight's dtype at the end; skipped when the weight is frozen, as
the LM head of LoRA and QLoRA is; likewise the bias). The recompute costs one more head
matmul, 2 N H V FLOPs, beside the plain head's 2 N H V forward and 4 N H V backward (2 with
a frozen head); it runs under `marks.function_forward`, so a tracker books it as recompute.

Memory, with N = B x T tokens, c = min(chunk_tokens, N) and s the matmul dtype's bytes
(2 under bf16 or fp16 autocast):

    plain head + loss:  about N x V x (2 + 4 + 4) bytes (logits in s, their fp32 copy,
                        the fp32 softmax / gradient) -- 14 GB of fp32 logits alone for
                        Llama-3.1-8B at 28K tokens
    chunked:            c x V x (4 + s) bytes at the peak (one fp32 logits chunk, transiently
                        beside its low-precision matmul output in forward or its
                        low-precision gradient copy in backward; s = 0 when the matmul runs
                        in fp32) + about 24 bytes per token (targets, mask, log-sum-exp)

`chunked_ce_bytes` is that formula. Not in it: grad_hidden (N x H in hidden's dtype, as
the plain head's) and c x H temporaries (V / H times smaller than the chunk); a weight
stored in another dtype than the matmul's is cast once, V x H x s (as autocast casts it for
the plain head); a trainable head adds V x H x 4 bytes (the fp32 grad_weight accumulator)
and, when the matmul dtype is not fp32, a V x H x s product per chunk.

Trade-off (masking, not gathering): the target tokens (labels[:, 1:] != IGNORE) are not
gathered first, because their number depends on the data: gathering needs a
data-dependent shape, which fake tensors (and CUDA graphs) cannot give without a host
sync. Every one of the B x T positions is projected and ignored ones are masked out, so
prompt tokens cost their matmul FLOPs (the plain head pays them too) but never memory
beyond the chunk, and the estimate sees the same ops as the run.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from frugal.step import marks
from frugal.step.loss import IGNORE

PER_TOKEN_BYTES = 24
"""Per-token bookkeeping: int64 targets and gather indices, the mask, the fp32 log-sum-exp."""


def chunked_ce_bytes(tokens: int, vocab: int, chunk_tokens: int, matmul_bytes: int = 2) -> int:
    """Modelled peak extra bytes of the chunked loss over `tokens` positions (B x T).

    c x V x (4 + s) + 24 x tokens, c = min(chunk_tokens, tokens), s = `matmul_bytes` (the
    dtype of the head's matmul: 2 under bf16 or fp16 autocast, 4 for fp32, whose output is
    already the fp32 chunk, so s counts 0). Excludes the grad_weight of a trainable head.
    """
    c = min(chunk_tokens, tokens)
    s = matmul_bytes if matmul_bytes < 4 else 0
    return c * vocab * (4 + s) + PER_TOKEN_BYTES * tokens


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_tokens: int = 4096,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal LM cross-entropy of the head `hidden @ weight.T (+ bias)`, chunked.

    hidden [B, T, H], weight [V, H], labels [B, T] (unshifted, IGNORE where not trained),
    bias [V] or None. Returns (sum of token losses in fp32, number of predicted tokens as a
    0-dim int64 tensor), equal to `causal_lm_loss(hidden @ weight.T (+ bias), labels)`;
    at most `chunk_tokens` x V logits exist at a time.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    total, count = _ChunkedLinearCE.apply(hidden, weight, bias, labels, chunk_tokens)
    return total, count


def _matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the plain head's matmul would run in: autocast's when it is on."""
    dev = hidden.device.type
    if torch.amp.is_autocast_available(dev) and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _targets(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position (flattened B x T): a gatherable target index and whether it is trained."""
    target = F.pad(labels[:, 1:], (0, 1), value=IGNORE).reshape(-1)
    valid = target != IGNORE
    return target.clamp(min=0), valid


def _chunk_logits(
    h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """fp32 logits [c, V] of one chunk, the matmul in `dtype` as the plain head's."""
    with torch.autocast(h.device.type, enabled=False):
        logits = (h.to(dtype) @ w.t()).float()
        if bias is not None:
            logits += bias.float()
    return logits


class _ChunkedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        chunk_tokens: int,
    ) -> Any:
        dtype = _matmul_dtype(hidden, weight)
        ctx.dtype, ctx.chunk = dtype, chunk_tokens
        with marks.function_forward():
            h = hidden.reshape(-1, hidden.shape[-1])
            n = h.shape[0]
            w = weight.to(dtype)
            index, valid = _targets(labels)
            lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for s in range(0, n, chunk_tokens):
                e = min(s + chunk_tokens, n)
                logits = _chunk_logits(h[s:e], w, bias, dtype)
                target = logits.gather(1, index[s:e, None]).squeeze(1)
                # log-sum-exp in place (torch.logsumexp would copy the chunk): the max is
                # taken out first; an infinite max is left in, as torch.logsumexp does
                top = logits.amax(dim=1, keepdim=True)
                top = torch.where(top.isinf(), 0.0, top)
                chunk_lse = logits.sub_(top).exp_().sum(dim=1).log_().add_(top.squeeze(1))
                del logits
                lse[s:e] = chunk_lse
                total += torch.where(valid[s:e], chunk_lse - target, 0.0).sum()
            count = valid.sum()
        ctx.save_for_backward(hidden, weight, bias, labels, lse)
        ctx.mark_non_differentiable(count)
        return total, count

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor, grad_count: Any) -> Any:
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dtype, chunk = ctx.dtype, ctx.chunk
        h = hidden.reshape(-1, hidden.shape[-1])
        n = h.shape[0]
        w = weight.to(dtype)
        index, valid = _targets(labels)
        # d(sum)/d(logit) = softmax - onehot(target) on trained positions, 0 elsewhere
        scale = torch.where(valid, grad_total.float(), 0.0)
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        )
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        minus_one = torch.full((1, 1), -1.0, device=h.device).expand(min(chunk, n), 1)
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            with marks.function_forward():  # the forward's logits again: recompute
                logits = _chunk_logits(h[s:e], w, bias, dtype)
            g = logits.sub_(lse[s:e, None]).exp_()  # softmax, in place
            g.scatter_add_(1, index[s:e, None], minus_one[: e - s])
            g.mul_(scale[s:e, None])
            if grad_b is not None:
                grad_b += g.sum(dim=0)
            if grad_h is None and grad_w is None:
                continue
            g_low = g.to(dtype)
            del g, logits
            with torch.autocast(h.device.type, enabled=False):
                if grad_h is not None and grad_h.dtype == dtype:
                    torch.mm(g_low, w, out=grad_h[s:e])  # no [c, H] temporary
                elif grad_h is not None:
                    grad_h[s:e] = g_low @ w
                if grad_w is not None:
                    if dtype == torch.float32:
                        grad_w.addmm_(g_low.t(), h[s:e].to(dtype))
                    else:  # the matmul in `dtype`, accumulated in fp32
                        grad_w += g_low.t() @ h[s:e].to(dtype)
            del g_low
        return (
            grad_h.view(hidden.shape) if grad_h is not None else None,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None,
            None,
        )
