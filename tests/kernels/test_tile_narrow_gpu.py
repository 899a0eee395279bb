"""The 160-column pingpong tile (config.TILE_N_CHOICES), and the 64-column cooperative tile
(the default where N <= 64), on an sm_90 GPU.

It exists for N that a 192-wide tile leaves a partial last wave on (N = 7168). Its N-major B
operand (dy @ W2's W2, the accumulate's postact) no longer fills a 128B swizzle row, so it takes a
64B swizzle and more TMA boxes per stage; with a 2x1 cluster that B tile is also split between
the two CTAs' multicasts. Each output element still accumulates the same k16 WGMMA steps in the
same order, so every epilogue kind must match the 128x128 pingpong kernel bitwise, and the fp32
reference by DESIGN.md's tolerance, over tails (M = 1000; N = 1000 and 1048 are not multiples of
160), multi-wave shapes and a single K block.
"""

import dataclasses

import pytest

from test_ops_gpu import requires_sm90  # same directory: pytest puts it on sys.path
from twins import accumulate_twins, act_twins, dact_twins, gemm_twins

pytestmark = [pytest.mark.gpu, requires_sm90]


def _twins(name):
    """(config under test, the 128x128 pingpong config it must equal bitwise)."""
    from parallel_mlp.kernels.config import GemmConfig

    pp = GemmConfig(128, 128, 2, 1, 16, consumers="pingpong")
    return {
        "pp160": (dataclasses.replace(pp, tile_n=160), pp),
        "pp160_pf2_e16": (dataclasses.replace(pp, tile_n=160, dact_prefetch=2, epi_n=16), pp),
    }[name]


SHAPES = [(1000, 4000, 1048), (2048, 512, 2304), (64, 64, 160)]


@pytest.mark.parametrize("name", ["pp160"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("b_major", ["row", "col"])  # row: N-major B (dy @ W2), col: K-major (x @ W1.T)
def test_narrow_tile_gemm(b_major, shape, name):
    gemm_twins(*_twins(name), shape, b_major=b_major, what=name)


@pytest.mark.parametrize("name", ["pp160"])
@pytest.mark.parametrize("shape", SHAPES)
def test_narrow_tile_accumulate(shape, name):
    accumulate_twins(*_twins(name), shape, times=2, what=name)


@pytest.mark.parametrize("name", ["pp160"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1000), (2048, 512, 2304)])
@pytest.mark.parametrize("act,bias", [("swiglu", True), ("gelu_tanh_approx", False)])
def test_narrow_tile_gemm_act(act, bias, shape, name):
    act_twins(*_twins(name), shape, act, bias, name)


@pytest.mark.parametrize("name", ["pp160_pf2_e16"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1000), (2048, 512, 2304)])
@pytest.mark.parametrize("act", ["swiglu", "relu"])
def test_narrow_tile_dact(act, shape, name):
    dact_twins(*_twins(name), shape, act, name)


@pytest.mark.parametrize("shape", [(1024, 8192, 1024), (1000, 4160, 1048)])
def test_the_64_wide_cooperative_tile_accumulates_as_the_128_wide_one(shape):
    """128x64 against 128x128: each element accumulates the same k16 steps in the same order,
    so the plain and the fp32 main-grad paths must give the same bits, tails included."""
    from parallel_mlp.kernels.config import GemmConfig

    accumulate_twins(GemmConfig(128, 64), GemmConfig(128, 128), shape, times=2, what="coop64")
    gemm_twins(GemmConfig(128, 64), GemmConfig(128, 128), shape, b_major="row", what="coop64")


@pytest.mark.parametrize("shape", [(512, 2816, 1024), (512, 1024, 5632), (1000, 1048, 200)])
@pytest.mark.parametrize("act,bias", [("swiglu", True), ("gelu_tanh_approx", False)])
def test_the_64_wide_cooperative_tile_is_the_128_wide_one_for_every_operand_layout_and_act(shape, act, bias):
    """The default for GEMMs with fewer 128x128 tiles than SMs (fc1, fc2, dx at T=512): K-major
    and N-major B, and the act epilogue (a gated pair's 64 columns give 32 postact columns per
    tile), bitwise equal to 128x128."""
    from parallel_mlp.kernels.config import GemmConfig

    narrow, wide = GemmConfig(128, 64), GemmConfig(128, 128)
    for b_major in ("row", "col"):
        gemm_twins(narrow, wide, shape, b_major=b_major, what="coop64")
    act_twins(narrow, wide, shape, act, bias, what="coop64")
