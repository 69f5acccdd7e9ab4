"""The optimizers whose state and temporaries the simulation counts.

AdamW is PyTorch's fused AdamW, the default of transformers' Trainer on torch >= 2.8
(`adamw_torch_fused`): two moments in the parameter's dtype, no full-size temporaries.
Adafactor is transformers' own implementation, run as it is (factored second moment, no
first moment, fp32 math). SGD is plain SGD without momentum (no state).

bitsandbytes' 8-bit AdamW cannot run on fake tensors, so `AdamW8bitState` reproduces its
state exactly (bitsandbytes/optim/optimizer.py, `Optimizer2State.init_state`): tensors with
at least 4096 elements keep both moments as uint8 with one fp32 absmax per 256-value block;
smaller ones keep fp32 moments. Its update is one fused kernel with no temporaries. The
paged variant allocates the same state in CUDA unified memory, outside PyTorch's allocator.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

MIN_8BIT_SIZE = 4096
BLOCKWISE = 256


class AdamW8bitState(torch.optim.Optimizer):
    """bitsandbytes AdamW8bit's memory: 8-bit blockwise moments, fused update."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-4) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    n = p.numel()
                    if n >= MIN_8BIT_SIZE:
                        blocks = -(-n // BLOCKWISE)
                        state["state1"] = torch.zeros(n, dtype=torch.uint8, device=p.device)
                        state["state2"] = torch.zeros(n, dtype=torch.uint8, device=p.device)
                        state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                        state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                    else:
                        state["state1"] = torch.zeros(n, dtype=torch.float32, device=p.device)
                        state["state2"] = torch.zeros(n, dtype=torch.float32, device=p.device)
                # the fused kernel updates p in place from grad and state


def make_optimizer(name: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, fused=True)
    if name in ("adamw-8bit", "paged-adamw-8bit"):
        return AdamW8bitState(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.0)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-3, scale_parameter=False, relative_step=False)
    raise ValueError(f"unknown optimizer {name!r}")


def optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = []
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                out.append(v)
    return out
