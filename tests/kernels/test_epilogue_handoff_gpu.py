"""Three output buffers per epilogue channel (GemmConfig(epi_stages=3)) and the producer
warpgroup's store warp (GemmConfig(epi_store_warp=True), cooperative and pingpong) on an sm_90
GPU.

The third buffer lets a subtile end without its second barrier: warps may run a subtile ahead of
the store warp, and the buffer a subtile writes was freed two subtiles before. The store warp
apart lets every consumer warp hand its subtile over and go on, up to epi_stages - 1 subtiles
ahead of the stores. Only the order of shared-memory traffic changes, never the math, so each
kernel must equal its two-buffer, in-consumer-store twin bit for bit, and the fp32 reference by
DESIGN.md's tolerance. The configs cover every way a subtile finds its buffers: cooperative
tiles that never drain between tiles (buffers by a running count, the count carried over many
tiles per SM), pingpong warpgroups that drain at each turn, every preact ring (two slots with
dpreact buffers of its own, the in-place rings of 3 and 4 slots, one and two slots per pingpong
warpgroup), 64- and 256-row tiles, 16-column subtiles and stream-K's owner pieces; the shapes
have tails in M, N and K, more tiles than SMs, and one K block (the epilogue alone).
"""

import dataclasses

import pytest

from test_ops_gpu import requires_sm90  # same directory: pytest puts it on sys.path
from twins import accumulate_twins, act_twins, dact_twins, gemm_twins

pytestmark = [pytest.mark.gpu, requires_sm90]


def _config(name):
    from parallel_mlp.kernels.config import GemmConfig

    def pp(tm, tn, cm=1, cn=1, **kw):
        return GemmConfig(tm, tn, cm, cn, 8, consumers="pingpong", **kw)

    return {
        "coop128x256_c2": GemmConfig(128, 256, 2, 1, 8),
        "coop128x128": GemmConfig(128, 128, 1, 1, 8),
        "coop128x128_pf2": GemmConfig(128, 128, 1, 1, 8, dact_prefetch=2),
        "coop128x128_pf3_c2": GemmConfig(128, 128, 2, 1, 16, dact_prefetch=3),
        "coop256x128_c1x2": GemmConfig(256, 128, 1, 2, 8),
        "coop128x256_e16": GemmConfig(128, 256, 1, 1, 8, epi_n=16),
        "coop64x128": GemmConfig(64, 128, 1, 1, 8),
        "pp128x192_c2": pp(128, 192, 2),
        "pp128x192_pf2_e16_c2": pp(128, 192, 2, dact_prefetch=2, epi_n=16),
        "pp128x128": pp(128, 128),
        "pp64x64": pp(64, 64),
        "sk128x256_sm6": GemmConfig(128, 256, 2, 1, 16, num_sms=6, stream_k=True),
    }[name]


VARIANTS = {
    "es3": dict(epi_stages=3),
    "sw": dict(epi_store_warp=True),
    "es3_sw": dict(epi_stages=3, epi_store_warp=True),
}


def _twins(case):
    """'config/variant' -> (the config with the variant's options, the config itself)."""
    name, variant = case.split("/")
    cfg = _config(name)
    return dataclasses.replace(cfg, **VARIANTS[variant]), cfg


COOP_PLAIN = ["coop128x256_c2", "coop128x128", "coop256x128_c1x2", "coop128x256_e16", "coop64x128"]
COOP_DACT = ["coop128x256_c2", "coop128x128", "coop128x128_pf2", "coop128x128_pf3_c2", "coop128x256_e16", "coop64x128"]
PP_PLAIN = ["pp128x192_c2", "pp64x64"]
PP_DACT = ["pp128x192_pf2_e16_c2", "pp128x128", "pp64x64"]
PLAIN = (
    [f"{n}/es3" for n in COOP_PLAIN + PP_PLAIN + ["sk128x256_sm6"]]
    + [f"{n}/es3_sw" for n in COOP_PLAIN + PP_PLAIN] + ["coop128x256_c2/sw", "pp128x192_c2/sw"]
)
DACT = (
    [f"{n}/es3" for n in COOP_DACT + PP_DACT]
    + [f"{n}/es3_sw" for n in COOP_DACT + PP_DACT]
    + ["coop128x128/sw", "coop128x128_pf3_c2/sw", "pp128x192_pf2_e16_c2/sw", "pp128x128/sw"]
)


@pytest.mark.parametrize("case", PLAIN)
@pytest.mark.parametrize("shape", [(1000, 4000, 1048), (2048, 512, 2304), (64, 128, 256)])
def test_gemm_and_accumulate(shape, case):
    cfg, twin = _twins(case)
    gemm_twins(cfg, twin, shape, what=case)
    accumulate_twins(cfg, twin, shape, times=2, what=case)


@pytest.mark.parametrize("case", PLAIN)
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 2304)])
@pytest.mark.parametrize("act,bias", [("swiglu", True), ("gelu_tanh_approx", False)])
def test_gemm_act(act, bias, shape, case):
    act_twins(*_twins(case), shape, act, bias, case)


@pytest.mark.parametrize("case", DACT)
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 2304), (1000, 64, 4096)])
@pytest.mark.parametrize("act", ["swiglu", "relu"])
def test_dact(act, shape, case):
    dact_twins(*_twins(case), shape, act, case)


@pytest.mark.parametrize("case", ["coop128x128_pf3_c2/es3", "pp128x192_pf2_e16_c2/es3", "coop128x128_pf3_c2/es3_sw",
                                  "pp128x192_pf2_e16_c2/es3_sw"])
@pytest.mark.parametrize("act", ["geglu", "gelu_tanh_approx"])
def test_dact_other_activations(act, case):
    dact_twins(*_twins(case), (4096, 1024, 2816), act, case)


def test_store_warp_over_few_tiles():
    """Fewer tiles than CTAs (some CTAs get none, some one: a pingpong CTA's second warpgroup
    then has no tile) and one tile column narrower than a subtile pair."""
    from parallel_mlp.kernels.config import GemmConfig

    for cfg in (GemmConfig(128, 128, 1, 1, 8, epi_stages=3, epi_store_warp=True),
                GemmConfig(128, 128, 2, 1, 8, epi_store_warp=True),
                GemmConfig(128, 128, 2, 1, 8, consumers="pingpong", dact_prefetch=2, epi_stages=3, epi_store_warp=True)):
        twin = dataclasses.replace(cfg, epi_stages=2, epi_store_warp=False)
        gemm_twins(cfg, twin, (200, 256, 136), what=cfg.key)
        dact_twins(cfg, twin, (130, 256, 96), "swiglu", cfg.key)
