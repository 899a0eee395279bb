"""The math namespace the activation formulas run with on the device.

``parallel_mlp.activations`` writes every activation once, as a function of fp32 values and a
namespace ``m`` of primitives. The reference backend passes torch ops; the kernels' epilogues pass
:data:`DEVICE_MATH`, whose primitives lower to PTX on fp32 registers. So the epilogue of a fused
kernel evaluates the very formula the reference does, and only these six primitives differ.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32


class DeviceMath:
    """tanh / sigmoid / relu / step / erf / exp on fp32 scalars inside a ``@cute.jit`` trace."""

    @staticmethod
    def tanh(x):
        # fastmath=True lowers to tanh.approx.f32, one MUFU op with an error of about 2^-11 (PTX
        # ISA); fastmath=False to an ex2, an rcp, a degree-4 polynomial and two selects (the PTX,
        # compiled for sm_90a, 2026-12-03). gelu_tanh_approx, the only user, reads 1 + tanh(u),
        # which near x = -3 is ~0.002, so there the error is a few percent of a ~0.004 output:
        # within the 1e-4 absolute the device-math GPU test allows (tests/kernels/
        # test_device_math.py), and far below the bf16 rounding of the step's larger outputs, which
        # set the design's max-error tolerance. The form x * sigmoid(2u), equal in exact math,
        # would have no such cancellation at one more MUFU op per element; not timed yet.
        return cute.math.tanh(Float32(x), fastmath=True)

    @staticmethod
    def sigmoid(x):
        # 1 / (1 + e^-x): e^-x overflows to inf for x << 0 and rcp(inf) is exactly 0, so no clamp
        # is needed. The approximate reciprocal (one MUFU op, ~1 ulp) instead of the IEEE-rounded
        # division, which lowers to a Newton refinement plus a slow-path branch: the result is
        # rounded to bf16/fp16 anyway, and the gated dact evaluates it once per output element.
        return cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-Float32(x), fastmath=True))

    @staticmethod
    def relu(x):
        return cute.arch.fmax(Float32(x), Float32(0.0))

    @staticmethod
    def step(x):
        # 1 where x > 0 else 0, matching torch's relu derivative (0 at 0).
        return cutlass.select_(Float32(x) > Float32(0.0), Float32(1.0), Float32(0.0))

    @staticmethod
    def erf(x):
        # The accurate lowering (a short polynomial, no special-function unit): the exact GELU is
        # chosen for its agreement with checkpoints trained with F.gelu, so keep it to ~1 ulp.
        return cute.math.erf(Float32(x))

    @staticmethod
    def exp(x):
        # ex2.approx with a scaled argument: ~2 ulp, the same path the sigmoid above takes.
        return cute.math.exp(Float32(x), fastmath=True)


DEVICE_MATH = DeviceMath()
