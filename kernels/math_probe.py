"""A tiny sm_90a kernel that evaluates one activation's forward and derivative with DEVICE_MATH
on a vector: compiled (not run) by the CPU tests to show every formula lowers to device code, and
run by the GPU tests against the torch reference."""

from __future__ import annotations

import tempfile

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from parallel_mlp.activations import ACTIVATIONS

from .device_math import DEVICE_MATH


class _Probe:
    def __init__(self, name):
        self.act = ACTIVATIONS[name]

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor, out: cute.Tensor):
        i, _, _ = cute.arch.thread_idx()
        m = DEVICE_MATH
        a = Float32(x[i])
        if cutlass.const_expr(self.act.gated):
            b = Float32(y[i])
            out[i, 0] = self.act.fn(a, b, m)
            dg, du = self.act.grad(a, b, m)
            out[i, 1] = dg
            out[i, 2] = du
        else:
            out[i, 0] = self.act.fn(a, m)
            out[i, 1] = self.act.grad(a, m)
            out[i, 2] = Float32(0.0)

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, out: cute.Tensor):
        self.kernel(x, y, out).launch(grid=[1, 1, 1], block=[cute.size(x), 1, 1])


def compile_probe(name: str, n: int = 128):
    from cutlass.cute.runtime import make_fake_compact_tensor

    x = make_fake_compact_tensor(Float32, (n,))
    y = make_fake_compact_tensor(Float32, (n,))
    out = make_fake_compact_tensor(Float32, (n, 3), stride_order=(1, 0))
    from .compile import dsl_safe_argv

    with tempfile.TemporaryDirectory() as d, dsl_safe_argv():
        fn = cute.compile(_Probe(name), x, y, out, options=f"--gpu-arch sm_90a --keep-ptx --dump-dir={d}")
    ptx = fn.artifacts.PTX
    return ptx.decode() if isinstance(ptx, bytes) else ptx


def run_probe(name: str, x, y):
    """On a GPU: (f, df/dx or df/dg, 0 or df/du) for x (and y) as a [n, 3] fp32 tensor."""
    import torch
    from cutlass.cute.runtime import from_dlpack

    n = x.numel()
    out = torch.empty(n, 3, device=x.device, dtype=torch.float32)
    from .compile import dsl_safe_argv

    with dsl_safe_argv():
        fn = cute.compile(_Probe(name), from_dlpack(x), from_dlpack(y), from_dlpack(out), options="--gpu-arch sm_90a")
    fn(from_dlpack(x), from_dlpack(y), from_dlpack(out))
    return out
