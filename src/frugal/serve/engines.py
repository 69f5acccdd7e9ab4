"""Serving engines (vLLM, SGLang, TensorRT-LLM): memory rules, scheduler defaults and the
fitted speed constants, one row each in data/engines.csv (with its sources)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources

from frugal.errors import FrugalError
from frugal.hardware.csvdata import data_rows


@dataclass(frozen=True)
class Engine:
    name: str
    label: str
    memory_rule: str  # vllm | sglang | trtllm (docs in data/engines.csv)
    memory_fraction: float  # gpu_memory_utilization / mem_fraction_static / free fraction
    non_torch_gib: float
    tp_extra_gib: float
    cuda_graph_gib: float
    max_num_seqs: int
    batched_tokens: int  # max_num_batched_tokens on GPUs with >= 70 GiB
    batched_tokens_small: int  # ... and below
    bw_eff: float
    flops_eff: float
    step_ms: float
    request_ms: float
    allreduce_us: float
    source: str

    def batched_for(self, gpu_gib: float) -> int:
        return self.batched_tokens if gpu_gib >= 70 else self.batched_tokens_small


SPEED = ("bw_eff", "flops_eff", "step_ms", "request_ms", "allreduce_us")


@cache
def engines() -> dict[str, Engine]:
    text = (resources.files("frugal.serve") / "data" / "engines.csv").read_text()
    out: dict[str, Engine] = {}
    for line, r in data_rows(text):
        kw: dict[str, object] = {}
        for f in fields(Engine):
            raw = r[f.name]
            try:
                kw[f.name] = (
                    int(raw) if f.type == "int" else float(raw) if f.type == "float" else raw
                )
            except ValueError as err:
                raise FrugalError(f"engines.csv line {line}, column {f.name}: {raw!r}") from err
        engine = Engine(**kw)  # type: ignore[arg-type]
        out[engine.name] = engine
    return out


def find_engine(name: str, **speed: float) -> Engine:
    """The engine `name`, with speed constants replaced where given (calibration, fitting)."""
    e = engines().get(name.lower())
    if e is None:
        raise FrugalError(f"--engine {name!r}: use one of {', '.join(engines())}")
    return replace(e, **speed) if speed else e  # type: ignore[arg-type]
