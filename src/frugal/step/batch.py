"""The micro-batch layout: which tensors a step's model and loss receive.

Packed rows (`job.packing`) carry position ids that restart at 0 for each sample and no
attention mask, so transformers builds a block-diagonal causal mask from them
(masking_utils.find_packed_sequence_indices) and packed samples never attend to each other.
Padded rows carry an attention mask as well; when a micro-batch has padding, transformers
builds the same-sized (b, 1, s, s) boolean mask for SDPA. With a mask, SDPA also gets the
key/value heads repeated to the query heads (transformers' `repeat_kv`: its GQA path needs
no mask) and turns the mask into one in the compute dtype per layer. Either way the loss reads
`labels` (IGNORE where not trained) and `segment_ids` (1, 2, ... per sample, 0 for padding).
A classifier's rows are padded, one text each, and its `labels` are one class id per row.

`frugal train` collates real rows through `layout`; the estimate feeds the step its task's
`example` (`tasks/`), the same keys, dtypes and shapes on fake tensors. Under fake
tensors transformers cannot read the values, so it always builds the mask: exact for packed
rows and for padded micro-batches with padding, a conservative s² bytes per row for a padded
micro-batch whose rows all have the same length.
"""

from __future__ import annotations

import torch

NOT_MODEL_INPUTS = ("labels", "segment_ids", "teacher_ids", "teacher_logits")  # the loss's


def layout(
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    segment_ids: torch.Tensor,
    positions: torch.Tensor,
    packed: bool,
) -> dict[str, torch.Tensor]:
    """One micro-batch's tensors, all (rows, width) int64 (a classifier's labels: (rows,))."""
    batch = {
        "input_ids": input_ids,
        "labels": labels,
        "segment_ids": segment_ids,
        "position_ids": positions,  # per row, so rotary tables grow with b x s, not s alone
    }
    if not packed:
        batch["attention_mask"] = (segment_ids > 0).long()
    return batch


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k not in NOT_MODEL_INPUTS}
