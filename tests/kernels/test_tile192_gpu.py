"""The tiles of 192 rows or columns on an sm_90 GPU: the pingpong tiles of 192 fp32 accumulators
per consumer thread, 128x192 (the default for big GEMMs) and 192x128 (three m64 atoms per
warpgroup); the cooperative 128x192 tile; and the cooperative 192x128 tile of three consumer
warpgroups.

Each output element accumulates the same k16 WGMMA steps in the same order whatever the tile's
shape, and the epilogue math per element is the same, so every epilogue kind must match its
128x128 twin bitwise (pingpong or cooperative), and the fp32 reference by DESIGN.md's tolerance,
over tails (M = 1000 and N = 1000, 1048 are not multiples of 192), multi-wave shapes and a
single K block.
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
    wide = dataclasses.replace(pp, tile_n=192)
    tall = GemmConfig(192, 128, 1, 2, 16, consumers="pingpong", epi_n=16)
    return {
        "pp192": (wide, pp),
        "pp192_e16": (dataclasses.replace(wide, epi_n=16), pp),
        "pp192_c1x2": (dataclasses.replace(wide, cluster_m=1, cluster_n=2), pp),
        "pp192_pf2_e16": (dataclasses.replace(wide, dact_prefetch=2, epi_n=16), pp),
        "pp192x128": (tall, pp),
        "pp192x128_pf2": (dataclasses.replace(tall, dact_prefetch=2), pp),
    }[name]


@pytest.mark.parametrize("name", ["pp192", "pp192_e16", "pp192_c1x2", "pp192x128"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1048), (2048, 512, 2304), (64, 64, 192)])
def test_tile192_gemm_and_accumulate(shape, name):
    cfg, twin = _twins(name)
    gemm_twins(cfg, twin, shape, what=name)
    accumulate_twins(cfg, twin, shape, what=name)


@pytest.mark.parametrize("name", ["pp192", "pp192_e16", "pp192x128"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1000), (2048, 512, 2304)])
@pytest.mark.parametrize("act,bias", [("swiglu", True), ("gelu_tanh_approx", False)])
def test_tile192_gemm_act(act, bias, shape, name):
    act_twins(*_twins(name), shape, act, bias, name)


@pytest.mark.parametrize("name", ["pp192", "pp192_pf2_e16", "pp192x128", "pp192x128_pf2"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1000), (2048, 512, 2304)])
@pytest.mark.parametrize("act", ["swiglu", "relu"])
def test_tile192_dact(act, shape, name):
    dact_twins(*_twins(name), shape, act, name)


# The cooperative 128x192 tiles the default gives GEMMs below two waves of 128x256 tiles where
# they run fewer waves (config.with_fewer_waves), in 1x1 and 2x1 clusters, against cooperative
# 128x128: the same k16 steps per output element in the same order. Shapes: the T=512 d=1024
# swiglu fc1 (512 x 5632 x 1024), its wgrads (K = 512), the T=2048 d=2048 dact, and tails.
COOP = {"coop192": (1, 1), "coop192_c2x1": (2, 1)}
COOP_SHAPES = [(512, 1024, 5632), (1000, 1048, 1000), (2048, 2048, 2816)]


def _coop_twins(name):
    from parallel_mlp.kernels.config import GemmConfig

    cm, cn = COOP[name]
    return GemmConfig(128, 192, cm, cn, 8), GemmConfig(128, 128, cm, cn, 8)


@pytest.mark.parametrize("name", list(COOP))
@pytest.mark.parametrize("shape", COOP_SHAPES + [(5632, 512, 1024)])
def test_cooperative_tile192_gemm_and_accumulate(shape, name):
    cfg, twin = _coop_twins(name)
    gemm_twins(cfg, twin, shape, what=name)
    accumulate_twins(cfg, twin, shape, what=name)


@pytest.mark.parametrize("name", list(COOP))
@pytest.mark.parametrize("shape", COOP_SHAPES)
@pytest.mark.parametrize("act,bias", [("swiglu", False), ("gelu_tanh_approx", True)])
def test_cooperative_tile192_gemm_act(act, bias, shape, name):
    act_twins(*_coop_twins(name), shape, act, bias, name)


@pytest.mark.parametrize("name", list(COOP))
@pytest.mark.parametrize("shape", COOP_SHAPES)
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_cooperative_tile192_dact(act, shape, name):
    dact_twins(*_coop_twins(name), shape, act, name)


# The cooperative 192x128 tile: three consumer warpgroups of 64 rows each (one m64 atom apiece,
# 160 registers a thread), against cooperative 128x128 (the same k16 steps per output element in
# the same order). Rows not a multiple of 192 (1000, 4104, 8200), K tails, N of one partial tile,
# every epilogue kind, the dact's preact rings, clusters both ways and the dynamic scheduler.
THREE = {
    "coop3": {},
    "coop3_c2x1": {"cluster_m": 2},
    "coop3_c1x2": {"cluster_n": 2},
    "coop3_n64": {"tile_n": 64},
    "coop3_dynamic": {"scheduler": "dynamic"},
    "coop3_pf2": {"dact_prefetch": 2},
    "coop3_pf3_e16": {"dact_prefetch": 3, "epi_n": 16},
}
THREE_SHAPES = [(1000, 4000, 1048), (2048, 512, 2304), (64, 64, 192), (4104, 1000, 200)]


def _three_twins(name):
    from parallel_mlp.kernels.config import GemmConfig

    cfg = dataclasses.replace(GemmConfig(192, 128, 1, 1, 8), **THREE[name])
    return cfg, GemmConfig(128, cfg.tile_n, cfg.cluster_m, cfg.cluster_n, 8)


@pytest.mark.parametrize("name", ["coop3", "coop3_c2x1", "coop3_c1x2", "coop3_n64", "coop3_dynamic"])
@pytest.mark.parametrize("shape", THREE_SHAPES)
def test_three_warpgroup_tile_gemm_and_accumulate(shape, name):
    cfg, twin = _three_twins(name)
    gemm_twins(cfg, twin, shape, what=name)
    accumulate_twins(cfg, twin, shape, what=name)


@pytest.mark.parametrize("name", ["coop3", "coop3_c1x2"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1000), (4104, 1024, 2816)])
@pytest.mark.parametrize("act,bias", [("swiglu", True), ("gelu_tanh_approx", False)])
def test_three_warpgroup_tile_gemm_act(act, bias, shape, name):
    act_twins(*_three_twins(name), shape, act, bias, name)


@pytest.mark.parametrize("name", ["coop3", "coop3_pf2", "coop3_pf3_e16", "coop3_dynamic"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1000), (8200, 1024, 2816)])
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx", "relu"])
def test_three_warpgroup_tile_dact(act, shape, name):
    dact_twins(*_three_twins(name), shape, act, name)
