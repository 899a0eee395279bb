"""16-column epilogue subtiles (GemmConfig(epi_n=16)) and the pingpong dact's two-slot preact
ring (dact_prefetch=2, both filled at the tile's start) on an sm_90 GPU.

Neither changes an output bit: the same WGMMAs make the same fp32 accumulators and the epilogue
applies the same per-element math, only in narrower pieces or with its loads earlier. So each
config is checked bitwise against its epi_n=32 / one-slot twin, and against the fp32 reference
by DESIGN.md's tolerance, for every epilogue kind, over tails (N = 1040 and 1048 are not
multiples of the subtile in every channel), multi-wave shapes and one K slice.
"""

import dataclasses

import pytest

from test_ops_gpu import requires_sm90  # same directory: pytest puts it on sys.path
from twins import accumulate_twins, act_twins, dact_twins, gemm_twins

pytestmark = [pytest.mark.gpu, requires_sm90]


def _twins(name):
    """(config under test, the config it must equal bitwise)."""
    from parallel_mlp.kernels.config import GemmConfig

    pp = GemmConfig(128, 128, 2, 1, 16, consumers="pingpong")
    coop = GemmConfig(128, 256, 2, 1, 8)
    big = GemmConfig(256, 128, 1, 2, 8)
    return {
        "pp_e16": (dataclasses.replace(pp, epi_n=16), pp),
        "pp_pf2": (dataclasses.replace(pp, dact_prefetch=2), pp),
        "pp_pf2_e16": (dataclasses.replace(pp, dact_prefetch=2, epi_n=16), pp),
        "coop_e16": (dataclasses.replace(coop, epi_n=16), coop),
        "t256_e16": (dataclasses.replace(big, epi_n=16), big),
    }[name]


@pytest.mark.parametrize("name", ["pp_e16", "coop_e16", "t256_e16"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1048), (2048, 512, 2304), (64, 128, 256)])
def test_epi16_gemm_and_accumulate(shape, name):
    cfg, twin = _twins(name)
    gemm_twins(cfg, twin, shape, what=name)
    accumulate_twins(cfg, twin, shape, what=name)


@pytest.mark.parametrize("name", ["pp_e16", "coop_e16", "t256_e16"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 2304)])
@pytest.mark.parametrize("act,bias", [("swiglu", True), ("gelu_tanh_approx", False)])
def test_epi16_gemm_act(act, bias, shape, name):
    act_twins(*_twins(name), shape, act, bias, name)


@pytest.mark.parametrize("name", ["pp_e16", "pp_pf2", "pp_pf2_e16", "coop_e16"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 2304), (1000, 64, 4096)])
@pytest.mark.parametrize("act", ["swiglu", "relu"])
def test_epi16_and_two_slot_dact(act, shape, name):
    dact_twins(*_twins(name), shape, act, name)
