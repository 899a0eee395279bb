"""The fused tensor-parallel MLP as one autograd function, on one rank's shards.

Forward::

    preact, postact = gemm_act(x, W1_r.T, act, b1_r)      # preact kept only without recompute
    y = all_reduce(postact @ W2_r.T) (+ b2)

Backward::

    [recompute: preact = x @ W1_r.T (+ b1_r)]            # bit-identical to forward's preact
    dpreact, postact = gemm_dact(dy, W2_r, preact, act)   # postact recomputed, never stored
    dW2_r = dy.T @ postact
    dx    = dpreact @ W1_r  -> all_reduce started async
    dW1_r = dpreact.T @ x                                 # runs while dx is on the wire
    wait(dx)
"""

from __future__ import annotations

import torch

from .activations import Activation
from .backends import resolve
from .grad_accum import weight_grad
from .tp import TPGroup, all_reduce


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the GEMMs run in: autocast's when autocast is on for x's device, else x's."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return x.dtype


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype)


def _bias_grad(grad_out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return grad_out.sum(0, dtype=torch.float32).to(bias.dtype)


class ParallelMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, act: Activation, tp: TPGroup, recompute: bool,
                fuse_grad_accum: bool, backend: str):
        dtype = _compute_dtype(x)
        # Autocast is resolved here once; the ops below must see exactly the dtypes chosen.
        with torch.autocast(x.device.type, enabled=False):
            x2d = x.reshape(-1, x.shape[-1]).to(dtype)
            w1c, b1c, w2c, b2c = (_cast(t, dtype) for t in (w1, b1, w2, b2))
            ops = resolve(backend, x2d, w1c, w2c, b1c)
            preact, postact = ops.gemm_act(x2d, w1c.t(), act.name, bias=b1c,
                                           store_preact=not recompute)
            y = ops.gemm(postact, w2c.t())
            all_reduce(y, tp)
            if b2c is not None:
                y.add_(b2c)

        ctx.save_for_backward(x2d, w1c, b1c, w2c, preact)
        # The parameters themselves, for their main_grad / .grad buffers.
        ctx.weights = (w1, w2)
        ctx.biases = (b1, b2)
        ctx.x_meta = (x.shape, x.dtype)
        ctx.act, ctx.tp, ctx.recompute = act, tp, recompute
        ctx.fuse, ctx.backend = fuse_grad_accum, backend
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x2d, w1c, b1c, w2c, preact = ctx.saved_tensors
        w1, w2 = ctx.weights
        b1, b2 = ctx.biases
        x_shape, x_dtype = ctx.x_meta
        need_x, need_w1, need_b1, need_w2, need_b2 = ctx.needs_input_grad[:5]
        act, backend = ctx.act, ctx.backend

        dy2d = dy.reshape(-1, dy.shape[-1]).to(x2d.dtype)
        ops = resolve(backend, x2d, w1c, w2c, dy2d)
        if ctx.recompute:
            if b1c is None:
                # Only preact is needed. A plain GEMM of the same shape runs the same kernel
                # config and mainloop as forward's gemm_act and rounds the same fp32 accumulator
                # once, so it gives the same bits, without writing a postact nobody reads.
                preact = ops.gemm(x2d, w1c.t())
            else:
                # With a bias, gemm_act rounds (acc + b1) once; a GEMM then a bias add would
                # round twice. Replay the forward's own op instead.
                preact, _ = ops.gemm_act(x2d, w1c.t(), act.name, bias=b1c, store_preact=True)
        dpreact, postact = ops.gemm_dact(dy2d, w2c, preact, act.name)
        del preact

        grad_w2 = weight_grad(backend, dy2d.t(), postact, w2, ctx.fuse) if need_w2 else None
        grad_b2 = _bias_grad(dy2d, b2) if need_b2 else None
        del postact

        grad_x, handle = None, None
        if need_x:
            grad_x = ops.gemm(dpreact, w1c)
            handle = all_reduce(grad_x, ctx.tp, async_op=True)
        grad_w1 = weight_grad(backend, dpreact.t(), x2d, w1, ctx.fuse) if need_w1 else None
        grad_b1 = _bias_grad(dpreact, b1) if need_b1 else None
        if handle is not None:
            handle.wait()
        if grad_x is not None:
            grad_x = grad_x.view(x_shape).to(x_dtype)
        return grad_x, grad_w1, grad_b1, grad_w2, grad_b2, None, None, None, None, None
