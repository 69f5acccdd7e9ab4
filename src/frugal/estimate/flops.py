"""FLOP formulas PyTorch's counter (`torch.utils.flop_counter`, the table FlopCounterMode
uses) does not have, registered into its table when this module is imported, for the
step's tracker (`tracker.py`): the CPU flash-attention kernel that fake tensors on CPU
dispatch to, and grouped GEMMs (MoE experts: torch's, counted per routed token, and
transformers' fallback for fp32 experts, registered once transformers has defined it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import flop_registry, register_flop_formula

aten = torch.ops.aten


def _sdpa_cpu_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


def _sdpa_cpu_backward_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out, query, key, value)


def grouped_mm_flops(a_shape: Any, b_shape: Any, out_shape: Any) -> int:
    """FLOPs of a grouped GEMM (MoE experts): one dimension is cut into groups by `offs`,
    and every row of it meets exactly one group's matrix, so the work is that of one plain
    matmul over the uncut dimensions, not one per group.

    - (S, k) x (E, k, n) -> (S, n): the routed tokens, each through its expert (forward,
      and the input's gradient): 2·S·k·n.
    - (k, S) x (S, n) -> (E, k, n): the experts' weight gradient, each token adding to its
      own expert's only: 2·k·S·n (not E times that: the output has E groups, the work not).
    - (E, m, k) x (k, N) -> (m, N): the other dimension cut: 2·m·k·N.
    - (E, m, k) x (E, k, n): a plain batched matmul: 2·E·m·k·n."""
    a, b = tuple(a_shape), tuple(b_shape)
    if len(a) == 3 and len(b) == 3:
        return 2 * a[0] * a[1] * a[2] * b[2]
    if len(a) == 3:
        return 2 * a[1] * a[2] * b[-1]
    return 2 * a[0] * a[1] * b[-1]


def _grouped_mm_formula(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return grouped_mm_flops(a_shape, b_shape, out_shape)


def _register_formulas() -> None:
    extra = {
        aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward_flops,
        aten._grouped_mm: _grouped_mm_formula,
    }
    for op, fn in extra.items():
        if op not in flop_registry:
            register_flop_formula(op)(fn)  # type: ignore[arg-type]


def _fallback_flops(input_shape, weight_shape, offs_shape, *args, out_shape=None, **kw) -> int:
    return grouped_mm_flops(input_shape, weight_shape, None)


def _fallback_backward_flops(
    input_shape, weight_shape, offs_shape, grad_shape, *args, out_shape=None, **kw
) -> int:
    # the input's gradient and the weight's, each as much work as the forward
    return 2 * grouped_mm_flops(input_shape, weight_shape, None)


# ops that only ever compute a forward: seen in backward, they are checkpointing's recompute
# even where grad mode is off (a custom op's autograd runs its forward without it)
FORWARD_ONLY: set[Any] = set()


def register_experts_fallback() -> None:
    """FLOPs of transformers' grouped-GEMM fallback (`transformers::grouped_mm_fallback`,
    the experts of a dtype torch's grouped GEMM does not take: full fine-tuning's fp32),
    once transformers has defined the ops."""
    ops = getattr(torch.ops, "transformers", None)
    for name, fn in (
        ("grouped_mm_fallback", _fallback_flops),
        ("grouped_mm_fallback_backward", _fallback_backward_flops),
    ):
        try:
            op = getattr(ops, name)
        except (AttributeError, RuntimeError):
            continue
        if op not in flop_registry:
            register_flop_formula(op)(fn)
        if name == "grouped_mm_fallback":
            FORWARD_ONLY.add(op)


_register_formulas()
