"""The overlapped cooperative schedule (GemmConfig(consumers="overlap")) on an sm_90 GPU.

It runs the cooperative 128-row tile's WGMMAs in the same K order into a second accumulator set
and the same per-element epilogue, only with the next tile's WGMMAs issued between a tile's
epilogue subtiles (and the dact's dpreact written in place over a preact ring that runs on
across tiles). So each op is checked bitwise against its cooperative twin and against the fp32
reference by DESIGN.md's tolerance, over shapes that give a CTA one tile (no overlap), an odd
and an even number of tiles (both accumulator sets as the last), tails in M, N and K, and K
shorter than the subtiles (chunks with no K blocks)."""

import dataclasses

import pytest

from test_ops_gpu import requires_sm90  # same directory: pytest puts it on sys.path
from twins import accumulate_twins, act_twins, dact_twins, gemm_twins

pytestmark = [pytest.mark.gpu, requires_sm90]


def _twins(name):
    """(config under test, the cooperative config it must equal bitwise)."""
    from parallel_mlp.kernels.config import GemmConfig

    coop = GemmConfig(128, 128, 1, 1, 8)
    ov = dataclasses.replace(coop, consumers="overlap")
    return {
        "ov": (ov, coop),
        "ov_e16_pf2": (dataclasses.replace(ov, epi_n=16, dact_prefetch=2), coop),
        "ov_dynamic": (dataclasses.replace(ov, scheduler="dynamic"), coop),
        "ov_2x1": (dataclasses.replace(ov, cluster_m=2, raster_group=16), dataclasses.replace(coop, cluster_m=2, raster_group=16)),
        "ov_n64": (dataclasses.replace(ov, tile_n=64), dataclasses.replace(coop, tile_n=64)),
    }[name]


# (M, K, N): one tile; 40 tiles (under one per SM); 3 and 4 waves of 132 CTAs with tails in all
# of M, N and K; K = 64 and 40 (one K block: 3 or 7 of the 4 or 8 chunks have none).
SHAPES = [(104, 256, 96), (1000, 1000, 520), (2104, 1048, 3000), (2048, 512, 4224), (4000, 64, 1040), (1000, 40, 2048)]


@pytest.mark.parametrize("name", ["ov", "ov_dynamic", "ov_2x1", "ov_n64"])
@pytest.mark.parametrize("shape", SHAPES)
def test_overlap_gemm_and_accumulate(shape, name):
    cfg, twin = _twins(name)
    gemm_twins(cfg, twin, shape, what=name)
    accumulate_twins(cfg, twin, shape, times=2, what=name)


@pytest.mark.parametrize("name", ["ov", "ov_2x1"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("act,bias", [("swiglu", True), ("gelu_tanh_approx", False)])
def test_overlap_gemm_act(act, bias, shape, name):
    act_twins(*_twins(name), shape, act, bias, name)


@pytest.mark.parametrize("name", ["ov", "ov_e16_pf2", "ov_dynamic", "ov_2x1"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_overlap_dact(act, shape, name):
    dact_twins(*_twins(name), shape, act, name)
