"""Two CTAs per SM (GemmConfig.ctas_per_sm=2) on an sm_90 GPU.

Two CTAs share each SM and the persistent grid doubles; every tile still runs the same WGMMA
instruction over the same K order and the same per-element epilogue, so the outputs must equal
the one-CTA kernel's of the same tile bit for bit, and DESIGN.md's fp32 reference by its
tolerance. The dacts of the short-K steps (gated and not, both preact rings that fit), the plain
store and the fused act; shapes with tails in M, N and K, and one with more tiles than the grid
holds CTAs.
"""

import dataclasses

import pytest

from test_ops_gpu import requires_sm90  # same directory: pytest puts it on sys.path
from twins import act_twins, dact_twins, gemm_twins

pytestmark = [pytest.mark.gpu, requires_sm90]

SHAPES = [(1000, 1024, 1040), (8192, 1024, 2816), (136, 200, 1000)]


def _pair(**fields):
    from parallel_mlp.kernels.config import GemmConfig

    two = GemmConfig(128, 64, 1, 1, 8, epi_n=16, ctas_per_sm=2, **fields)
    return two, dataclasses.replace(two, ctas_per_sm=1)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
@pytest.mark.parametrize("prefetch", [1, 2])
def test_dact_is_bitwise_the_one_cta_kernel(shape, act, prefetch):
    two, one = _pair(dact_prefetch=prefetch)
    dact_twins(two, one, shape, act, two.key)


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_store_and_act_are_bitwise_the_one_cta_kernel(shape):
    two, one = _pair()
    gemm_twins(two, one, shape, what=two.key)
    act_twins(two, one, shape, "swiglu", False, two.key)
