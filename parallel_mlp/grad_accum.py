"""Where a weight-gradient GEMM writes, with Megatron's fused gradient-accumulation semantics.

With ``fuse_grad_accum=True``:

- a weight with an fp32 ``main_grad`` (Megatron DDP) gets the wgrad GEMM accumulated into
  ``main_grad`` in place; where the weight has a ``grad_added_to_main_grad`` attribute it is set to
  True and a dummy gradient is returned (zero-filled if ``weight.zero_out_wgrad``), so that DDP's
  hooks still fire; otherwise None is returned;
- a weight without ``main_grad`` but with a ``.grad`` gets the GEMM accumulated into ``.grad``;
- otherwise, and always when fusion is off, the GEMM writes a fresh gradient.

A backward that wants no weight gradient (``backward(inputs=[x])``, ``torch.autograd.grad(loss,
[x])``; :func:`gradients_wanted`) leaves every buffer alone. One that asks for a weight's
gradient through ``torch.autograd.grad`` gets the fused accumulation as Megatron's does (a
dummy or None where the buffer took it): that is how ``torch.cuda.make_graphed_callables``
captures a step's backward.
"""

from __future__ import annotations

import torch

from .backends import resolve


# Whether the running backward will execute an autograd node (torch uses it in FSDP); a torch
# without it always runs the accumulation.
_WILL_EXECUTE = getattr(torch._C, "_will_engine_execute_node", None)


def gradients_wanted(ctx, *inputs: int) -> bool:
    """Whether the running backward wants the gradients of the autograd function's ``inputs``
    (positions among the tensors its ``apply`` was given: autograd keeps one edge per tensor
    argument, none for None): False where it neither runs their gradient nodes (a leaf's
    AccumulateGrad) nor captures them, as ``backward(inputs=[x])`` and
    ``torch.autograd.grad(loss, [x])`` do not."""
    if _WILL_EXECUTE is None:
        return True
    edges = ctx.next_functions
    for i in inputs:
        node = edges[i][0]
        if node is None:
            continue
        try:
            if not _WILL_EXECUTE(node):
                return False
        except RuntimeError:
            # torch refuses a leaf's node that autograd.grad captures: its gradient is asked
            # for, and accumulates as in any backward (torch.cuda.make_graphed_callables
            # captures a step's backward so, and Megatron's CUDA graphs rely on main_grad then).
            pass
    return True


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
