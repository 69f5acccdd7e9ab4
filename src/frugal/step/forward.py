"""The model's forward as every task's loss runs it: the inputs it takes, the decoder's last
hidden states (for a loss that makes its own logits), and the LM head under DDP's and PEFT's
wrappers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from frugal.errors import FrugalError
from frugal.step.batch import model_inputs


def forward(model: Any, batch: dict[str, torch.Tensor]) -> Any:
    return model(**model_inputs(batch), use_cache=False)


def lm_head(model: Any) -> Any:
    """The LM head module under DDP's and PEFT's wrappers."""
    inner = getattr(model, "module", model)  # DDP
    head = inner.get_output_embeddings()
    if head is None:
        raise FrugalError("--loss-chunks needs a model with an LM head")
    cap = getattr(getattr(inner, "config", None), "final_logit_softcapping", None)
    if cap:
        raise FrugalError(
            f"--loss-chunks: this model soft-caps its logits ({cap:g}), which the chunked loss "
            "does not: use --loss-chunks 0"
        )
    return head


@contextlib.contextmanager
def last_hidden(model: Any, wanted: bool = True) -> Iterator[list[torch.Tensor]]:
    """Collects the decoder's output (the last hidden states, after the final norm) of the
    forward run inside. A hook rather than `output_hidden_states`, whose tuple would hold
    every layer's input on the device until the loss is computed."""
    box: list[torch.Tensor] = []
    if not wanted:
        yield box
        return
    decoder = getattr(model, "module", model).get_decoder()  # under DDP's and PEFT's wrappers
    if decoder.get_output_embeddings() is not None:  # the LM itself (Llama 4's): its body
        decoder = decoder.model
    hook = decoder.register_forward_hook(lambda m, args, out: box.append(out[0]))
    try:
        yield box
    finally:
        hook.remove()
