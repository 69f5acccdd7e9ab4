"""The optimizer of a training step: one constructor for `frugal train` and the estimate.

* adamw: PyTorch's fused AdamW (`fused=True`, transformers' default `adamw_torch_fused` on
  torch >= 2.8): two moments in the parameter's dtype and no full-size temporaries, where
  the default multi-tensor (foreach) implementation makes a copy of the moments' size.
* sgd: SGD with momentum 0.9 (one buffer per trainable weight).
* adafactor: transformers' Adafactor with a fixed learning rate (factored second moment,
  no first moment).
* adamw-8bit, paged-adamw-8bit: bitsandbytes' AdamW8bit / PagedAdamW8bit. They cannot run on
  fake tensors, so the estimate uses `AdamW8bitState`, which allocates exactly their state
  (`Optimizer2State.init_state` in bitsandbytes/optim/optimizer.py): tensors of at least
  4096 values keep both moments as uint8 with one fp32 absmax per 256-value block and share
  two 256-value fp32 quantization maps; smaller ones keep fp32 moments. The update is one
  fused kernel with no temporaries. The paged variant allocates the same state in CUDA
  unified memory, outside PyTorch's allocator. `tests/test_step_standins.py` compares the
  stand-in's state with the real optimizer's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

MIN_8BIT_SIZE = 4096
BLOCKWISE = 256
SGD_MOMENTUM = 0.9


class AdamW8bitState(torch.optim.Optimizer):
    """bitsandbytes AdamW8bit's memory: 8-bit blockwise moments, fused update."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-4) -> None:
        super().__init__(params, {"lr": lr})
        self.qmaps: tuple[torch.Tensor, torch.Tensor] | None = None

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or self.state[p]:
                    continue  # the fused kernel updates p in place from grad and state
                state, n = self.state[p], p.numel()
                if n < MIN_8BIT_SIZE:
                    state["state1"] = torch.zeros(n, dtype=torch.float32, device=p.device)
                    state["state2"] = torch.zeros(n, dtype=torch.float32, device=p.device)
                    continue
                if self.qmaps is None:  # "dynamic" and "udynamic", shared by all weights
                    self.qmaps = (
                        torch.zeros(256, device=p.device),
                        torch.zeros(256, device=p.device),
                    )
                blocks = -(-n // BLOCKWISE)
                state["state1"] = torch.zeros(n, dtype=torch.uint8, device=p.device)
                state["qmap1"] = self.qmaps[0]
                state["state2"] = torch.zeros(n, dtype=torch.uint8, device=p.device)
                state["qmap2"] = self.qmaps[1]
                state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)


def make_optimizer(
    name: str,
    params: list[torch.nn.Parameter],
    lr: float = 1e-4,
    weight_decay: float = 0.0,
    stand_in: bool = False,
) -> torch.optim.Optimizer:
    """The optimizer `name` over `params`; `stand_in`: the estimate's (fake tensors)."""
    if name in ("adamw-8bit", "paged-adamw-8bit"):
        if stand_in:
            return AdamW8bitState(params, lr=lr)
        import bitsandbytes as bnb

        cls = bnb.optim.PagedAdamW8bit if name.startswith("paged") else bnb.optim.AdamW8bit
        return cls(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False)
    raise ValueError(f"unknown optimizer {name!r}")


def optimizer_tensors(opt: Any) -> list[torch.Tensor]:
    """Every tensor of the optimizer's state (shared ones once per storage, by the tracker)."""
    opt = getattr(opt, "optimizer", opt)  # accelerate's wrapper
    out = []
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                out.append(v)
    return out
