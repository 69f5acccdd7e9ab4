"""What a finished run hands on: its adapter (or whole model) in Hugging Face's format in
`final/`, from the best evaluation when there was one, and with `training.merge` the
adapter merged into the model in `merged/`; each written beside its place and swapped in
whole (`checkpoint.swap_in`)."""

from __future__ import annotations

import shutil
from typing import Any

from frugal.run import checkpoint as ckpt
from frugal.run.steps import TrainingRun


def export(run: TrainingRun, best_step: int | None) -> dict[str, str]:
    """The adapter (or the full model) in HF format, from the best evaluation if there was
    one; with training.merge, the adapter merged into the model as well. Every process
    calls it (under FSDP each sends its shards); the main process writes."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress line is enough
    model = run.unwrapped
    best = run.out / "best" / "trainable.safetensors"
    if best_step is not None and best.exists():
        ckpt.load_trainable(model, best)
    whole: dict[str, Any] = {}  # the weights to save, gathered from the shards
    if run.sharded and run.cfg.job.method == "full":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        sd = get_model_state_dict(model, options=opts)
        # a tied weight (the head sharing the embeddings) is saved once, as transformers does
        tied = {n for n, _ in model.named_parameters(remove_duplicate=False)}
        tied -= {n for n, _ in model.named_parameters()}
        whole = {"state_dict": {k: v for k, v in sd.items() if k not in tied}}
    elif run.sharded:  # an adapter: its weights are all PEFT saves
        whole = {"state_dict": ckpt.trainable_state(model, keep=run.main)}
    if not run.main:
        return {}
    final, tmp = run.out / "final", run.out / ".tmp-final"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True, **whole)
    run.tokenizer.save_pretrained(str(tmp))
    ckpt.swap_in(tmp, final)
    outputs = {"adapter" if run.cfg.job.method != "full" else "model": str(final)}
    if run.cfg.training.merge and run.cfg.job.method != "full":
        merged, tmp = model.merge_and_unload(), run.out / ".tmp-merged"
        shutil.rmtree(tmp, ignore_errors=True)
        merged.save_pretrained(str(tmp), safe_serialization=True)
        run.tokenizer.save_pretrained(str(tmp))
        ckpt.swap_in(tmp, run.out / "merged")
        outputs["merged"] = str(run.out / "merged")
    return outputs
