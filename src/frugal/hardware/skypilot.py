"""SkyPilot's vocabulary: its accelerator names for our GPUs and the host VMs GCP pairs them
with. Used to read SkyPilot catalogs (`--prices vms.csv`) and to write SkyPilot tasks."""

from __future__ import annotations

# sky show-gpus names for our GPU names; back, the first one wins (SkyPilot's "H100" is SXM)
SKY_GPU = {
    "H100 SXM": "H100",
    "H100 PCIe": "H100",
    "H200": "H200",
    "A100 80GB": "A100-80GB",
    "A100 40GB": "A100",
    "L40S": "L40S",
    "L4": "L4",
    "A10G": "A10G",
    "A10": "A10",
    "T4": "T4",
    "V100 16GB": "V100",
    "V100 32GB": "V100-32GB",
    "RTX 4090": "RTX4090",
    "RTX 3090": "RTX3090",
    "RTX A6000": "A6000",
}
_OURS: dict[str, str] = {}
for _ours, _sky in SKY_GPU.items():
    _OURS.setdefault(_sky, _ours)

# the providers SkyPilot names as clouds (a task may pin `cloud:` and a region only for them)
CLOUDS = ("aws", "gcp", "azure", "lambda", "runpod")

# GCP sells the GPU apart from its host VM; the host family each GPU needs (SkyPilot rows).
GCP_HOST = {
    "A100 40GB": "a2-highgpu-{n}g",
    "A100 80GB": "a2-ultragpu-{n}g",
    "H100 SXM": "a3-highgpu-{n}g",
}


def to_skypilot(gpu: str) -> str:
    """SkyPilot's accelerator name for our GPU name (unknown names pass through)."""
    return SKY_GPU.get(gpu, gpu)


def from_skypilot(name: str) -> str:
    """Our GPU name for SkyPilot's accelerator name (unknown names pass through)."""
    return _OURS.get(name, name)
