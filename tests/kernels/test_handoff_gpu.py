"""The handoff consumer schedule (GemmConfig(consumers="handoff")) on an sm_90 GPU.

Two warpgroups run each 128-row tile's mainloop and leave its fp32 accumulators in shared
memory; two more run the tile's epilogue from there while the first two run the next tile's
mainloop. The accumulators cross shared memory unchanged and the epilogue is the cooperative
one, so every epilogue kind must match cooperative 128 x tile_n bitwise, and the fp32 reference
by DESIGN.md's tolerance: tails in every dimension, one tile for some CTAs and none for others
(64 x 192), many tiles per CTA (the accumulator barriers through many phases), clusters both
ways, the 128x64 tile, and the dact's preact rings at 16- and 32-column subtiles.
"""

import dataclasses

import pytest

from test_ops_gpu import requires_sm90  # same directory: pytest puts it on sys.path
from twins import accumulate_twins, act_twins, dact_twins, gemm_twins

pytestmark = [pytest.mark.gpu, requires_sm90]

HANDOFF = {
    "handoff": {},
    "handoff_c2x1": {"cluster_m": 2},
    "handoff_c1x2": {"cluster_n": 2},
    "handoff_n64": {"tile_n": 64},
    "handoff_pf2": {"dact_prefetch": 2},
    "handoff_pf3": {"dact_prefetch": 3},
    "handoff_e32": {"epi_n": 32},
}
SHAPES = [(1000, 4000, 1048), (2048, 512, 2304), (64, 64, 192), (8200, 1024, 2816)]


def _twins(name):
    """(the handoff config, the cooperative config it must equal bitwise)."""
    from parallel_mlp.kernels.config import GemmConfig

    cfg = dataclasses.replace(GemmConfig(128, 128, 1, 1, 8, consumers="handoff", epi_n=16), **HANDOFF[name])
    return cfg, GemmConfig(128, cfg.tile_n, cfg.cluster_m, cfg.cluster_n, 8)


@pytest.mark.parametrize("name", ["handoff", "handoff_c2x1", "handoff_c1x2", "handoff_n64", "handoff_e32"])
@pytest.mark.parametrize("shape", SHAPES)
def test_handoff_gemm_and_accumulate(shape, name):
    cfg, twin = _twins(name)
    gemm_twins(cfg, twin, shape, what=name)
    accumulate_twins(cfg, twin, shape, times=2, what=name)


@pytest.mark.parametrize("name", ["handoff", "handoff_c1x2"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1000), (8200, 1024, 2816)])
@pytest.mark.parametrize("act,bias", [("swiglu", True), ("gelu_tanh_approx", False), ("relu", True)])
def test_handoff_gemm_act(act, bias, shape, name):
    act_twins(*_twins(name), shape, act, bias, name)


@pytest.mark.parametrize("name", ["handoff", "handoff_pf2", "handoff_pf3", "handoff_e32", "handoff_c2x1"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1000), (8200, 1024, 2816), (64, 64, 192)])
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx", "relu"])
def test_handoff_dact(act, shape, name):
    dact_twins(*_twins(name), shape, act, name)
