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
    "B200": "B200",
    "B300": "B300",
    "GH200": "GH200",
    "RTX 5090": "RTX5090",
    "RTX PRO 6000": "RTXPRO6000",
    "RTX 6000 Ada": "RTX6000-Ada",
    "L40": "L40",
    "A40": "A40",
    "MI300X": "MI300X",
}
_OURS: dict[str, str] = {"H100-MEGA": "H100 SXM"}  # GCP's a3-megagpu H100s (more network)
for _ours, _sky in SKY_GPU.items():
    _OURS.setdefault(_sky, _ours)

# the providers SkyPilot names as clouds (a task may pin `cloud:` and a region only for them)
CLOUDS = ("aws", "gcp", "azure", "lambda", "runpod")

# GCP sells the GPU apart from its host VM: the host VM each of its accelerators (SkyPilot's
# names) needs for a count of them; T4, V100 and P100 attach to an N1 VM (8 vCPUs here)
GCP_HOST = {
    "A100": {
        1: "a2-highgpu-1g",
        2: "a2-highgpu-2g",
        4: "a2-highgpu-4g",
        8: "a2-highgpu-8g",
        16: "a2-megagpu-16g",
    },
    "A100-80GB": {n: f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8)},
    "H100": {n: f"a3-highgpu-{n}g" for n in (1, 2, 4, 8)},
    "H100-MEGA": {8: "a3-megagpu-8g"},
    "H200": {8: "a3-ultragpu-8g"},
    "B200": {8: "a4-highgpu-8g"},
    "L4": {1: "g2-standard-4", 2: "g2-standard-24", 4: "g2-standard-48", 8: "g2-standard-96"},
    "T4": {n: "n1-standard-8" for n in (1, 2, 4)},
    "V100": {n: "n1-standard-8" for n in (1, 2, 4, 8)},
    "P100": {n: "n1-standard-8" for n in (1, 2, 4)},
}


def gcp_host(accelerator: str, count: int) -> str | None:
    """The GCP host VM that carries `count` of SkyPilot's `accelerator` (None: not sold so)."""
    return GCP_HOST.get(accelerator, {}).get(count)


def to_skypilot(gpu: str) -> str:
    """SkyPilot's accelerator name for our GPU name (unknown names pass through)."""
    return SKY_GPU.get(gpu, gpu)


def from_skypilot(name: str, instance: str = "") -> str:
    """Our GPU name for SkyPilot's accelerator name (unknown names pass through); SkyPilot
    calls PCIe, NVL and SXM H100s all "H100", the instance name tells them apart."""
    if name == "H100":
        for mark, ours in (("nvl", "H100 NVL"), ("pcie", "H100 PCIe")):
            if mark in instance.lower():
                return ours
    return _OURS.get(name, name)
