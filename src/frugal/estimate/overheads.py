"""What fake tensors cannot see, modelled explicitly with documented, calibratable constants.

* CUDA context: the driver's and kernels' own memory, outside PyTorch's allocator; counted
  in `device_total_gib` (nvidia-smi) only. Measured beside every row of frugal's own step
  on an H200 (torch 2.11, CUDA 13.0, driver 580): device memory in use minus PyTorch's
  reserved was 0.749 GiB (0.85-0.87 with bitsandbytes' optimizers loaded); we use 0.75.
* cuBLAS workspace: allocated through PyTorch's caching allocator on the first matmul, so
  it is in `peak_allocated_gib`. The default `CUBLAS_WORKSPACE_CONFIG` on Hopper is
  `:4096:8` = 32 MiB, plus cuBLASLt's own; we use 40 MiB.
* Kernel workspace fake tensors do not see (flash-attention backward scratch, fused
  optimizer chunks): `kernel_slack` of the peak, with a floor.
* Allocator reserve (`peak_reserved_gib - peak_allocated_gib`): PyTorch's caching
  allocator rounds blocks up (512 B, 2 MiB and 20 MiB segments) and keeps freed blocks
  cached. On the H200 it grew with the logits and the loss's tensors (the largest blocks a
  step frees and makes again at other sizes), hardly with activations: 15 rows of
  frugal's step fit 0.29 of the logits-and-loss bytes at the peak plus 240 MiB (residuals
  under 0.9 GiB), where the earlier 0.15 of activations, logits and temporaries was 5.3
  GiB short at micro-batch 16 and 0.7 GiB over without checkpointing.

The defaults are fitted to frugal's own step on a GPU (`docs/accuracy.md`); a user can
override them with the `memory` section of a calibration file (see frugal/calibration.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from frugal import calibration

MIB = 2**20


@dataclass(frozen=True)
class Overheads:
    cuda_context_gib: float = 0.75
    cublas_workspace_mib: float = 40.0
    kernel_slack: float = 0.02  # of peak allocated
    reserve_transient_frac: float = 0.29  # of the logits and loss tensors at the peak
    reserve_fixed_mib: float = 240.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def load_overheads(method: str | None = None) -> Overheads:
    """The calibration file's constants (its groups for `method` when given)."""
    return calibration.load("memory", Overheads, None, method)
