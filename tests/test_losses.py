"""Losses: causal LM cross-entropy as (sum, count) and the SimCTG contrastive loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from frugal.step.loss import IGNORE, causal_lm_loss, contrastive_loss


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _labels(b: int, t: int, v: int, seed: int, p_ignore: float = 0.3) -> torch.Tensor:
    g = _gen(seed)
    labels = torch.randint(0, v, (b, t), generator=g)
    labels[torch.rand(b, t, generator=g) < p_ignore] = IGNORE
    return labels


def naive_contrastive(
    hidden: torch.Tensor, labels: torch.Tensor, segment_ids: torch.Tensor, margin: float
) -> tuple[float, int]:
    """SimCTG eq. 2 per (row, segment), written as plain loops in float64."""
    total, count = 0.0, 0
    h = hidden.double()
    for b in range(h.shape[0]):
        for seg in sorted(set(segment_ids[b].tolist())):
            idx = [
                t for t in range(h.shape[1]) if labels[b, t] != IGNORE and segment_ids[b, t] == seg
            ]
            k = len(idx)
            if k < 2:
                continue
            acc = 0.0
            for i in idx:
                for j in idx:
                    if i != j:
                        cos = F.cosine_similarity(h[b, i], h[b, j], dim=0).item()
                        acc += max(0.0, margin - 1.0 + cos)
            total += acc / (k * (k - 1))
            count += 1
    return total, count


# --- causal LM ---------------------------------------------------------------------------


def test_causal_lm_matches_shifted_cross_entropy() -> None:
    b, t, v = 3, 8, 13
    logits = torch.randn(b, t, v, generator=_gen(0))
    labels = _labels(b, t, v, seed=1)
    total, count = causal_lm_loss(logits, labels)

    flat_logits = logits[:, :-1].reshape(-1, v)
    flat_labels = labels[:, 1:].reshape(-1)
    ref_sum = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE, reduction="sum")
    ref_mean = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE)
    assert count.ndim == 0
    assert int(count) == int((labels[:, 1:] != IGNORE).sum())
    assert total.dtype == torch.float32
    torch.testing.assert_close(total, ref_sum)
    torch.testing.assert_close(total / count, ref_mean)  # the Hugging Face mean


def test_causal_lm_matches_explicit_next_token_loop() -> None:
    """Guards the shift direction: position t is scored against labels[t + 1]."""
    b, t, v = 2, 6, 7
    logits = torch.randn(b, t, v, generator=_gen(2))
    labels = _labels(b, t, v, seed=3)
    total, count = causal_lm_loss(logits, labels)
    logp = logits.double().log_softmax(-1)
    terms = [
        -logp[i, j, labels[i, j + 1]].item()
        for i in range(b)
        for j in range(t - 1)
        if labels[i, j + 1] != IGNORE
    ]
    assert int(count) == len(terms)
    assert total.item() == pytest.approx(sum(terms), rel=1e-5)


def test_causal_lm_gradient_accumulation_is_exact() -> None:
    b, t, v = 4, 9, 11
    logits = torch.randn(b, t, v, generator=_gen(4))
    labels = _labels(b, t, v, seed=5, p_ignore=0.5)
    labels[0, 2:] = IGNORE  # uneven token counts between the two halves
    whole_sum, whole_count = causal_lm_loss(logits, labels)
    s1, c1 = causal_lm_loss(logits[:2], labels[:2])
    s2, c2 = causal_lm_loss(logits[2:], labels[2:])
    assert int(c1 + c2) == int(whole_count)
    torch.testing.assert_close(s1 + s2, whole_sum)
    torch.testing.assert_close((s1 + s2) / (c1 + c2), whole_sum / whole_count)
    # ... whereas the mean of the two micro-batch means is not the step mean.
    assert abs(((s1 / c1 + s2 / c2) / 2 - whole_sum / whole_count).item()) > 1e-3


def test_causal_lm_bf16_logits_summed_in_fp32() -> None:
    logits = torch.randn(2, 5, 9, generator=_gen(6)).bfloat16()
    labels = _labels(2, 5, 9, seed=7, p_ignore=0.0)
    total, _ = causal_lm_loss(logits, labels)
    ref, _ = causal_lm_loss(logits.float(), labels)
    assert total.dtype == torch.float32
    torch.testing.assert_close(total, ref)


def test_causal_lm_gradient_only_where_a_next_token_is_trained() -> None:
    logits = torch.randn(2, 6, 5, generator=_gen(8), requires_grad=True)
    labels = _labels(2, 6, 5, seed=9)
    labels[0, 3] = IGNORE
    labels[1, 1] = 2
    total, _ = causal_lm_loss(logits, labels)
    total.backward()
    assert logits.grad is not None
    per_pos = logits.grad.abs().sum(-1)  # [B, T]
    trained_next = torch.zeros(2, 6, dtype=torch.bool)
    trained_next[:, :-1] = labels[:, 1:] != IGNORE
    assert (per_pos[trained_next] > 0).all()
    assert (per_pos[~trained_next] == 0).all()  # includes the last position and (0, 2)


def test_causal_lm_nothing_trained() -> None:
    logits = torch.randn(2, 4, 6, requires_grad=True)
    labels = torch.full((2, 4), IGNORE)
    total, count = causal_lm_loss(logits, labels)
    assert total.item() == 0.0 and int(count) == 0
    total.backward()
    assert logits.grad is not None and (logits.grad == 0).all()


# --- contrastive -------------------------------------------------------------------------


def _one_row(vectors: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden = torch.tensor([vectors])
    t = hidden.shape[1]
    return hidden, torch.zeros(1, t, dtype=torch.long), torch.zeros(1, t, dtype=torch.long)


def test_contrastive_hand_computed_three_tokens() -> None:
    # cos(h0, h1) = cos(h1, h2) = 1/√2, cos(h0, h2) = 0; norms differ on purpose.
    hidden, labels, seg = _one_row([[2.0, 0.0], [3.0, 3.0], [0.0, 0.5]])
    total, count = contrastive_loss(hidden, labels, seg, margin=0.5)
    # four ordered pairs give 1/√2 - 0.5, two give max(0, -0.5) = 0; averaged over 3·2 pairs
    expected = 4 * (1 / math.sqrt(2) - 0.5) / 6
    assert total.item() == pytest.approx(expected, rel=1e-6)
    assert int(count) == 1 and count.ndim == 0
    assert total.item() == pytest.approx(naive_contrastive(hidden, labels, seg, 0.5)[0])


@pytest.mark.parametrize("margin", [0.0, 0.5, 1.0, 1.7])
def test_contrastive_matches_naive_reference(margin: float) -> None:
    b, t, h = 3, 10, 6
    hidden = torch.randn(b, t, h, generator=_gen(10))
    labels = _labels(b, t, 50, seed=11, p_ignore=0.25)
    seg = torch.tensor(
        [
            [0, 0, 0, 0, 1, 1, 1, 1, 1, 1],
            [5, 5, 9, 9, 9, 2, 2, 2, 2, 2],  # arbitrary, non-sorted ids
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ]
    )
    labels[2, 7:] = IGNORE  # padding at the end of the last row
    total, count = contrastive_loss(hidden, labels, seg, margin=margin)
    ref_total, ref_count = naive_contrastive(hidden, labels, seg, margin)
    assert int(count) == ref_count
    assert total.item() == pytest.approx(ref_total, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("rho", [0.1, 0.5, 1.0])
def test_contrastive_identical_states_give_rho(rho: float) -> None:
    hidden = torch.tensor([1.0, -2.0, 0.5]).expand(2, 5, 3).clone()
    labels = torch.zeros(2, 5, dtype=torch.long)
    seg = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]])
    total, count = contrastive_loss(hidden, labels, seg, margin=rho)
    assert int(count) == 3
    assert total.item() == pytest.approx(3 * rho, rel=1e-5)  # each segment's average is rho


@pytest.mark.parametrize(("rho", "expected"), [(0.5, 0.0), (1.0, 0.0), (1.5, 0.5)])
def test_contrastive_orthogonal_states(rho: float, expected: float) -> None:
    hidden, labels, seg = _one_row([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    total, count = contrastive_loss(hidden, labels, seg, margin=rho)
    assert int(count) == 1
    assert total.item() == pytest.approx(expected, abs=1e-6)


def test_contrastive_ignores_prompt_and_padding_states() -> None:
    hidden = torch.randn(2, 8, 4, generator=_gen(12))
    labels = torch.randint(0, 9, (2, 8), generator=_gen(13))
    labels[0, :3] = IGNORE  # prompt
    labels[1, 5:] = IGNORE  # padding
    seg = torch.zeros(2, 8, dtype=torch.long)
    base, base_count = contrastive_loss(hidden, labels, seg, margin=1.0)
    changed = hidden.clone()
    changed[labels == IGNORE] = torch.randn(int((labels == IGNORE).sum()), 4) * 100
    again, again_count = contrastive_loss(changed, labels, seg, margin=1.0)
    torch.testing.assert_close(again, base)
    changed[1, 7] = float("nan")
    nan_pad, _ = contrastive_loss(changed, labels, seg, margin=1.0)
    torch.testing.assert_close(nan_pad, base)
    assert int(again_count) == int(base_count) == 2


def test_contrastive_packed_segments_equal_separate_rows() -> None:
    g = _gen(14)
    a, b2 = torch.randn(4, 5, generator=g), torch.randn(3, 5, generator=g)
    pad = torch.randn(2, 5, generator=g)
    margin = 0.9
    # packed: [a a a a | b b b | pad pad] in one row
    packed = torch.cat([a, b2, pad]).unsqueeze(0)
    packed_labels = torch.tensor([[1, 2, 3, 4, 5, 6, 7, IGNORE, IGNORE]])
    packed_seg = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2]])
    total, count = contrastive_loss(packed, packed_labels, packed_seg, margin=margin)
    # separate: the same samples as two rows, the shorter padded
    rows = torch.stack([a, torch.cat([b2, pad[:1]])])
    row_labels = torch.tensor([[1, 2, 3, 4], [5, 6, 7, IGNORE]])
    row_seg = torch.zeros(2, 4, dtype=torch.long)  # same id in both rows: still two segments
    sep_total, sep_count = contrastive_loss(rows, row_labels, row_seg, margin=margin)
    assert int(count) == int(sep_count) == 2
    torch.testing.assert_close(total, sep_total)
    # and each row alone: the packed sum is the sum of the two segments' own losses
    ta, _ = contrastive_loss(a.unsqueeze(0), row_labels[:1], row_seg[:1], margin=margin)
    tb, _ = contrastive_loss(b2.unsqueeze(0), row_labels[1:, :3], row_seg[1:, :3], margin=margin)
    torch.testing.assert_close(total, ta + tb)


def test_contrastive_no_pairs_across_segments() -> None:
    hidden = torch.randn(1, 6, 4, generator=_gen(15))
    labels = torch.zeros(1, 6, dtype=torch.long)
    seg = torch.tensor([[0, 0, 0, 1, 1, 1]])
    total, _ = contrastive_loss(hidden, labels, seg, margin=1.0)
    seg2_alone, _ = contrastive_loss(hidden[:, 3:], labels[:, 3:], seg[:, 3:], margin=1.0)
    # Make segment 2 identical to segment 1's first token: cross pairs would now be large.
    changed = hidden.clone()
    changed[0, 3:] = hidden[0, 0]
    total2, _ = contrastive_loss(changed, labels, seg, margin=1.0)
    seg2_now, _ = contrastive_loss(changed[:, 3:], labels[:, 3:], seg[:, 3:], margin=1.0)
    torch.testing.assert_close(total - seg2_alone, total2 - seg2_now)


def test_contrastive_singleton_segments_do_not_count() -> None:
    hidden = torch.randn(1, 5, 3, generator=_gen(16))
    labels = torch.tensor([[1, 2, IGNORE, 3, 4]])
    seg = torch.tensor([[0, 1, 1, 2, 2]])  # segment 1 has one valid token
    total, count = contrastive_loss(hidden, labels, seg, margin=1.5)
    ref_total, ref_count = naive_contrastive(hidden, labels, seg, 1.5)
    assert int(count) == ref_count == 1
    assert total.item() == pytest.approx(ref_total, rel=1e-5)


def test_contrastive_gradient_on_valid_tokens_only() -> None:
    hidden = torch.randn(2, 7, 5, generator=_gen(17))
    hidden[1, 6] = float("nan")  # garbage in a padding state must not poison the gradient
    hidden.requires_grad_(True)
    labels = torch.randint(0, 9, (2, 7), generator=_gen(18))
    labels[0, :2] = IGNORE
    labels[1, 6] = IGNORE
    seg = torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0]])
    total, _ = contrastive_loss(hidden, labels, seg, margin=2.0)  # every pair term > 0
    total.backward()
    assert hidden.grad is not None
    assert torch.isfinite(hidden.grad).all()
    per_tok = hidden.grad.abs().sum(-1)
    assert (per_tok[labels != IGNORE] > 0).all()
    assert (per_tok[labels == IGNORE] == 0).all()


def test_contrastive_bf16_input_computed_in_fp32() -> None:
    hidden = torch.randn(1, 6, 8, generator=_gen(19)).bfloat16()
    labels = torch.zeros(1, 6, dtype=torch.long)
    seg = torch.zeros(1, 6, dtype=torch.long)
    total, _ = contrastive_loss(hidden, labels, seg, margin=1.0)
    ref, _ = naive_contrastive(hidden.float(), labels, seg, 1.0)
    assert total.dtype == torch.float32
    assert total.item() == pytest.approx(ref, rel=1e-5)


@pytest.mark.parametrize("case", ["all_ignored", "singletons"])
def test_contrastive_empty(case: str) -> None:
    hidden = torch.randn(2, 4, 3, requires_grad=True)
    if case == "all_ignored":
        labels = torch.full((2, 4), IGNORE)
        seg = torch.zeros(2, 4, dtype=torch.long)
    else:
        labels = torch.zeros(2, 4, dtype=torch.long)
        seg = torch.arange(4).expand(2, 4)
    total, count = contrastive_loss(hidden, labels, seg)
    assert total.item() == 0.0 and int(count) == 0
    assert total.requires_grad
    total.backward()
    assert hidden.grad is not None and (hidden.grad == 0).all()
