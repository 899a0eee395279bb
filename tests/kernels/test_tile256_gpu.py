"""The cooperative 256x128 tile (GemmConfig(tile_m=256, tile_n=128)) on an sm_90 GPU.

Each warpgroup runs two m64n128 atoms along M (128 rows), so its epilogue walks the
accumulators in the copy's order, as a pingpong warpgroup's does. Checked against the fp32
reference by DESIGN.md's tolerance and bitwise against cooperative 128x128 (the same m64n128k16
WGMMA, the same K order: every output element gets the same fp32 sum), with the 1x2 cluster
(A multicast) and without, over tails in every dim, multi-wave shapes, one K slice, and a
problem smaller than one tile.
"""

import pytest
import torch

from test_ops_gpu import operand, requires_sm90  # same directory: pytest puts it on sys.path
from twins import accumulate_twins, act_twins, gemm_twins

pytestmark = [pytest.mark.gpu, requires_sm90]

CLUSTERS = [(1, 1), (1, 2), (2, 1)]
SHAPES = [(1000, 4000, 48), (2048, 512, 2304), (1000, 64, 4096), (64, 128, 256), (4104, 1000, 1048)]


def _configs(cluster):
    from parallel_mlp.kernels.config import GemmConfig

    return GemmConfig(256, 128, *cluster), GemmConfig(128, 128)


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("a_major,b_major", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")])
@pytest.mark.parametrize("shape", SHAPES)
def test_tile256_gemm(shape, a_major, b_major, cluster):
    gemm_twins(*_configs(cluster), shape, a_major, b_major, f"256x128 {cluster}")


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("shape", [(1000, 4000, 1048), (2048, 512, 3072)])
def test_tile256_accumulate_and_fp32_out(shape, cluster):
    from parallel_mlp.kernels import ops

    big, ref_cfg = _configs(cluster)
    accumulate_twins(big, ref_cfg, shape, times=2, what=f"256x128 {cluster}")
    m, k, n = shape
    a = operand(m, k, "col", torch.bfloat16, k ** -0.5)
    b = operand(k, n, "row", torch.bfloat16)
    got32 = ops.gemm(a, b, out_dtype=torch.float32, config=big)
    assert torch.equal(got32, ops.gemm(a, b, out_dtype=torch.float32, config=ref_cfg))


@pytest.mark.parametrize("cluster", [(1, 2)])
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 2304)])
@pytest.mark.parametrize("act,bias", [("swiglu", True), ("gelu_tanh_approx", False), ("relu", True)])
def test_tile256_gemm_act(act, bias, shape, cluster):
    act_twins(*_configs(cluster), shape, act, bias, f"256x128 {cluster}")
