"""GemmConfig(cache_hints=...): L2 eviction policies on the TMA copies, on an sm_90 GPU.

A cache policy changes what L2 keeps, never a value: every epilogue kind must match the same
config with the DSL's zero policy ("none") bitwise, and the fp32 reference by DESIGN.md's tolerance, over tails and
multi-wave shapes, for the two default big configs (pingpong 128x192, cooperative 128x256).
"""

import dataclasses

import pytest

from test_ops_gpu import requires_sm90  # same directory: pytest puts it on sys.path
from twins import accumulate_twins, act_twins, dact_twins, gemm_twins

pytestmark = [pytest.mark.gpu, requires_sm90]


def _twins(tile, hints):
    """(config with `hints`, the same config with cache_hints="none")."""
    from parallel_mlp.kernels.config import GemmConfig

    base = {
        "pp192": GemmConfig(128, 192, 2, 1, 16, consumers="pingpong"),
        "pp192_pf2_e16": GemmConfig(128, 192, 2, 1, 16, consumers="pingpong", dact_prefetch=2, epi_n=16),
        "coop256": GemmConfig(128, 256, 2, 1, 16),
    }[tile]
    return dataclasses.replace(base, cache_hints=hints), dataclasses.replace(base, cache_hints="none")


SHAPES = [(1000, 4000, 1048), (2048, 512, 2304)]


@pytest.mark.parametrize("hints", ["normal", "stream", "keep"])
@pytest.mark.parametrize("tile", ["pp192", "coop256"])
@pytest.mark.parametrize("shape", SHAPES)
def test_cache_hints_gemm_and_accumulate(shape, tile, hints):
    cfg, twin = _twins(tile, hints)
    gemm_twins(cfg, twin, shape, what=f"{tile} {hints}")
    accumulate_twins(cfg, twin, shape, what=f"{tile} {hints}")


@pytest.mark.parametrize("hints", ["normal", "stream"])
@pytest.mark.parametrize("tile", ["pp192", "coop256"])
@pytest.mark.parametrize("shape", SHAPES)
def test_cache_hints_gemm_act(shape, tile, hints):
    act_twins(*_twins(tile, hints), shape, "swiglu", True, f"{tile} {hints}")


@pytest.mark.parametrize("hints", ["normal", "stream", "keep"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_cache_hints_dact(act, shape, hints):
    dact_twins(*_twins("pp192_pf2_e16", hints), shape, act, f"dact {hints}")
