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

Optimizer in backward (`job.optimizer_in_backward`): one optimizer per trainable weight
(`PerParameter`), each stepped from a post-accumulate-grad hook as soon as its weight's
gradient is complete, which then frees that gradient (PyTorch's recipe, "How to save memory
by fusing the optimizer step into the backward pass"). No step holds more than one weight's
gradient, so full fine-tuning saves the gradients' bytes (4 per parameter in mixed
precision). It needs every gradient to be final when it arrives: one process, no
accumulation, no loss scaling, no clipping by the global norm.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
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


class PerParameter(torch.optim.Optimizer):
    """One optimizer per weight, stepped in backward while `in_backward()` is entered.

    Its `param_groups` are the inner optimizers' own groups and its `state` is theirs (one
    dict, keyed by weight), so an LR scheduler, `state_dict` and the distributed checkpoint
    see one ordinary optimizer (PyTorch's state-dict format, one group per weight).
    `step()` updates any weight whose gradient is still there (the estimate's first step,
    which creates the state); after a backward in `in_backward()` there is none left."""

    def __init__(self, inner: list[torch.optim.Optimizer]) -> None:
        self.inner = inner
        params = [p for o in inner for g in o.param_groups for p in g["params"]]
        super().__init__(params, {})
        self._link()
        self._norms: list[torch.Tensor] = []

    def _link(self) -> None:
        """Point the groups and state at the inner optimizers' (again after a load)."""
        shared: defaultdict[Any, dict[str, Any]] = defaultdict(dict)
        for o in self.inner:
            shared.update(o.state)
            o.state = shared
        self.state = shared
        self.param_groups = [g for o in self.inner for g in o.param_groups]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for o in self.inner:
            if any(p.grad is not None for g in o.param_groups for p in g["params"]):
                o.step()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """PyTorch's format, loaded by each inner optimizer as its own: the 8-bit ones keep
        their uint8 states, which the base class would cast to the weight's dtype."""
        state, groups = state_dict["state"], state_dict["param_groups"]
        for o, g in zip(self.inner, groups, strict=True):
            (i,) = g["params"]
            own = {
                "state": {0: state[i]} if i in state else {},
                "param_groups": [{**g, "params": [0]}],
            }
            o.load_state_dict(own)
        self._link()

    @contextlib.contextmanager
    def in_backward(self) -> Iterator[None]:
        """Within: each weight is updated, and its gradient freed, once it is accumulated;
        its gradient's norm is kept for `grad_norm()`."""
        owner = {p: o for o in self.inner for g in o.param_groups for p in g["params"]}

        def update(p: torch.Tensor) -> None:
            if p.grad is None:
                return
            self._norms.append(torch.linalg.vector_norm(p.grad, dtype=torch.float32))
            owner[p].step()
            p.grad = None

        hooks = [p.register_post_accumulate_grad_hook(update) for p in owner]
        try:
            yield
        finally:
            for h in hooks:
                h.remove()

    def grad_norm(self, device: torch.device) -> torch.Tensor:
        """The global norm of the gradients the last backward applied (then forgotten)."""
        norms, self._norms = self._norms, []
        if not norms:
            return torch.zeros((), device=device)
        return torch.linalg.vector_norm(torch.stack(norms))


def make_optimizer(
    name: str,
    params: list[torch.nn.Parameter],
    lr: float = 1e-4,
    weight_decay: float = 0.0,
    stand_in: bool = False,
    in_backward: bool = False,
) -> torch.optim.Optimizer:
    """The optimizer `name` over `params`; `stand_in`: the estimate's (fake tensors);
    `in_backward`: one per weight, stepped in backward (`PerParameter`)."""
    if in_backward:
        return PerParameter([make_optimizer(name, [p], lr, weight_decay, stand_in) for p in params])
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
