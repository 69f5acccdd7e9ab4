"""QLoRA's experts in 4 bits: a MoE model's frozen weights under LoRA and QLoRA, estimated
and built for real on the CPU.

Qwen3-30B-A3B at full width, reduced to one decoder layer (the 128 experts of that layer
are 0.6B of its 0.66B values), is built with random weights the way `frugal train` builds it
(`step.model.build_model`: bitsandbytes quantizes the linear layers and `Experts4bit` the
expert stacks); its frozen bytes (weights, buffers, quantization state) are counted beside
the estimate of the same reduced model. Then the estimate of the whole model. About 40 s
and 9 GB of memory on 2 cores.

Usage: python benchmarks/moe_qlora.py [MODEL]
"""

from __future__ import annotations

import sys
import warnings

MODEL = "Qwen/Qwen3-30B-A3B"
GIB = 2**30


def frozen_bytes(model: object) -> int:
    """Bytes of what the step does not train: frozen weights, buffers, 4-bit states."""
    from frugal.step.qlora import quant_state_tensors

    tensors = [*model.parameters(), *model.buffers(), *quant_state_tensors(model)]  # type: ignore[attr-defined]
    seen = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in tensors
        if not t.requires_grad
    }
    return sum(seen.values())


def main() -> int:
    warnings.simplefilter("ignore")
    from frugal.estimate.core import estimate
    from frugal.models.specs import ModelSpec, load_spec
    from frugal.step.job import TrainJob
    from frugal.step.model import build_model

    spec = load_spec(sys.argv[1] if len(sys.argv) > 1 else MODEL)
    one = ModelSpec(f"{spec.id} (1 layer)", {**spec.config, "num_hidden_layers": 1}, "reduced")
    rows = []
    for method in ("lora", "qlora"):
        job = TrainJob(method=method)
        built = frozen_bytes(build_model(one.config, job, "random"))
        small = estimate(one, job).memory.breakdown["frozen_weights"]
        whole = estimate(spec, job).memory.breakdown["frozen_weights"]
        rows.append((method, built, small, whole))
    print(f"| {spec.id} | CPU run, 1 layer (GiB) | estimate, 1 layer | estimate, whole model |")
    print("|---|---:|---:|---:|")
    for method, built, small, whole in rows:
        print(f"| {method} | {built / GIB:.3f} | {small / GIB:.3f} | {whole / GIB:.2f} |")
    (_, b0, s0, w0), (_, b1, s1, w1) = rows
    print(f"| QLoRA / LoRA | {b1 / b0:.1%} | {s1 / s0:.1%} | {w1 / w0:.1%} |")
    # the embeddings and the LM head stay in bf16 under both: the layer's own share
    v, h = spec.vocab_size, spec.hidden_size
    embed = v * h * 2 * (1 if spec.config.get("tie_word_embeddings") else 2)
    print(
        f"| QLoRA / LoRA, the layer alone (less {embed / GIB:.2f} GiB of embeddings and LM "
        f"head) | {(b1 - embed) / (b0 - embed):.1%} | {(s1 - embed) / (s0 - embed):.1%} | |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
