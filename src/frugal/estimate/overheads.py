"""What fake tensors cannot see, modelled explicitly with documented, calibratable constants.

* CUDA context: the driver's and kernels' own memory, outside PyTorch's allocator; counted
  in `device_total_gib` (nvidia-smi) only. With lazy module loading (CUDA >= 11.7) it is
  typically 0.3-0.6 GiB on recent GPUs; we use 0.5 GiB.
* cuBLAS workspace: allocated through PyTorch's caching allocator on the first matmul, so
  it is in `peak_allocated_gib`. The default `CUBLAS_WORKSPACE_CONFIG` on Hopper is
  `:4096:8` = 32 MiB, plus cuBLASLt's own; we use 40 MiB.
* Kernel workspace fake tensors do not see (flash-attention backward scratch, fused
  optimizer chunks): `kernel_slack` of the peak, with a floor.
* Allocator reserve (`peak_reserved_gib - peak_allocated_gib`): PyTorch's caching
  allocator rounds blocks up (512 B, 2 MiB and 20 MiB segments) and keeps freed blocks
  cached; during training the reserve grows with how much memory churns within a step
  (activations, logits, temporaries), not with persistent weights. We model it as a
  fraction of the transient bytes at the peak plus a fixed slab.

The defaults are fitted to the measured set in `docs/accuracy.md`; a user can override
them with the `memory` section of a calibration file (see frugal/calibration.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from frugal import calibration

MIB = 2**20


@dataclass(frozen=True)
class Overheads:
    cuda_context_gib: float = 0.5
    cublas_workspace_mib: float = 40.0
    kernel_slack: float = 0.02  # of peak allocated
    reserve_transient_frac: float = 0.15  # of activations + logits + temporaries at the peak
    reserve_fixed_mib: float = 128.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def load_overheads(method: str | None = None) -> Overheads:
    """The calibration file's constants (its groups for `method` when given)."""
    return calibration.load("memory", Overheads, None, method)
