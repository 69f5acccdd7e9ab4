"""A deployment: what `frugal serve` prices, the model, the engine and the GPUs it runs on."""

from __future__ import annotations

from dataclasses import dataclass

from frugal.hardware.gpus import GPU
from frugal.models.specs import ModelSpec
from frugal.serve.engines import Engine
from frugal.serve.weights import Format


@dataclass(frozen=True)
class Deployment:
    """A model served by an engine on `tp` GPUs of one kind, in a weight format, with the
    engine's settings (None: the engine's defaults)."""

    spec: ModelSpec
    gpu: GPU
    tp: int
    engine: Engine
    fmt: Format
    kv_dtype: str = "auto"
    memory_fraction: float | None = None
    max_num_seqs: int | None = None
    batched_tokens: int | None = None

    @property
    def batched(self) -> int:
        return self.batched_tokens or self.engine.batched_for(self.gpu.usable_gib)

    @property
    def seqs(self) -> int:
        return self.max_num_seqs or self.engine.max_num_seqs
