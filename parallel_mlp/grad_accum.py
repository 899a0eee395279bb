"""Where a weight-gradient GEMM writes, with Megatron's fused gradient-accumulation semantics.

With ``fuse_grad_accum=True``:

- a weight with an fp32 ``main_grad`` (Megatron DDP) gets the wgrad GEMM accumulated into
  ``main_grad`` in place; where the weight has a ``grad_added_to_main_grad`` attribute it is set to
  True and a dummy gradient is returned (zero-filled if ``weight.zero_out_wgrad``), so that DDP's
  hooks still fire; otherwise None is returned;
- a weight without ``main_grad`` but with a ``.grad`` gets the GEMM accumulated into ``.grad``;
- otherwise, and always when fusion is off, the GEMM writes a fresh gradient.
"""

from __future__ import annotations

import torch

from .backends import resolve


def accumulation_buffer(weight: torch.Tensor, fuse: bool) -> torch.Tensor | None:
    """The buffer ``weight``'s gradient GEMM accumulates into in place (its ``main_grad``, else an
    existing ``.grad``), or None for a fresh gradient."""
    if fuse:
        main_grad = getattr(weight, "main_grad", None)
        if main_grad is not None:
            return main_grad
        if weight.grad is not None:
            return weight.grad
    return None


def after_accumulating(weight: torch.Tensor, buffer: torch.Tensor):
    """What autograd receives for ``weight`` once its gradient went into ``buffer``."""
    if buffer is getattr(weight, "main_grad", None) and hasattr(weight, "grad_added_to_main_grad"):
        weight.grad_added_to_main_grad = True
        make = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
        return make(weight.shape, dtype=weight.dtype, device=weight.device)
    return None


def weight_grad(ops, backend: str, a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor,
                fuse: bool):
    """Run ``a @ b`` as ``weight``'s gradient; returns what autograd should receive for it.

    ``ops`` is the backend resolved for ``a`` and ``b``; where the GEMM writes into an existing
    buffer, the backend is resolved again with that buffer among the operands, since a kernel
    that can read ``a`` and ``b`` may still not accumulate into that buffer's dtype.
    """
    buffer = accumulation_buffer(weight, fuse)
    if buffer is None:
        return ops.gemm(a, b, out_dtype=weight.dtype)
    resolve(backend, a, b, buffer).gemm(a, b, out=buffer, accumulate=True)
    return after_accumulating(weight, buffer)
