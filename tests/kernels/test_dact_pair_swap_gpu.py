"""The gated dact's pair swap (GemmConfig.dact_pair_swap) on an sm_90 GPU.

Threads of every other row (or pair of rows) read preact from, and write dpreact to, the
accumulator pair 16 (or 8) columns over, and swap the accumulators and postact to match. That
only moves which thread computes which element with the same math, so the outputs must equal the
unswapped kernel's bit for bit, and both DESIGN.md's fp32 reference by its tolerance. The configs
cover both subtile widths (32 columns, 128B swizzle: odd rows swap; 16 columns, 64B swizzle: rows
with bit 1 set), cooperative and pingpong consumers, the tile shapes a gated dact runs in, the
deeper preact rings (dpreact in place) and 2-CTA clusters; the shapes have tails in M, N and K.
"""

import dataclasses

import pytest

from test_ops_gpu import requires_sm90  # same directory: pytest puts it on sys.path
from twins import dact_twins

pytestmark = [pytest.mark.gpu, requires_sm90]


def _config(name):
    from parallel_mlp.kernels.config import GemmConfig

    def pp(tm, tn, cm=1, cn=1, **kw):
        return GemmConfig(tm, tn, cm, cn, 16, consumers="pingpong", **kw)

    return {
        "coop128x256_c2": GemmConfig(128, 256, 2, 1, 8),
        "coop128x128_e32": GemmConfig(128, 128, 1, 1, 8),
        "coop128x256_e16": GemmConfig(128, 256, 2, 1, 8, epi_n=16),
        "coop128x128_pf3": GemmConfig(128, 128, 1, 1, 8, dact_prefetch=3),
        "pp128x128_pf2_e16": pp(128, 128, 2, dact_prefetch=2, epi_n=16),
        "pp128x192_pf2_e16": pp(128, 192, 2, dact_prefetch=2, epi_n=16),
        "pp128x192_e32": pp(128, 192, 2),
        "pp192x128_pf2_e16": pp(192, 128, 1, 2, dact_prefetch=2, epi_n=16),
        "pp128x160_pf2_e16": pp(128, 160, 2, dact_prefetch=2, epi_n=16),
        "pp64x64": pp(64, 64),
    }[name]


CONFIGS = [
    "coop128x256_c2", "coop128x128_e32", "coop128x256_e16", "coop128x128_pf3",
    "pp128x128_pf2_e16", "pp128x192_pf2_e16", "pp128x192_e32", "pp192x128_pf2_e16",
    "pp128x160_pf2_e16", "pp64x64",
]


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 2304), (1000, 64, 4096), (136, 1000, 200)])
def test_pair_swap_is_bitwise_the_unswapped_dact(shape, name):
    cfg = _config(name)
    assert cfg.dact_pair_swap
    dact_twins(cfg, dataclasses.replace(cfg, dact_pair_swap=False), shape, "swiglu", name)


@pytest.mark.parametrize("name", ["coop128x128_e32", "pp128x192_pf2_e16"])
@pytest.mark.parametrize("act", ["geglu", "swiglu_oai"])
def test_pair_swap_other_gated_acts(act, name):
    cfg = _config(name)
    dact_twins(cfg, dataclasses.replace(cfg, dact_pair_swap=False), (1000, 1000, 1040), act, name)


@pytest.mark.parametrize("name", ["coop128x128_e32", "pp128x192_pf2_e16"])
def test_pair_swap_fp16(name):
    import torch

    from parallel_mlp.activations import ACTIVATIONS
    from parallel_mlp.kernels import ops
    from test_ops_gpu import check, operand

    cfg = _config(name)
    m, k, h = 1000, 1000, 1040
    dy = operand(m, k, "row", torch.float16, k ** -0.5)
    w2 = operand(k, h, "row", torch.float16)
    preact = torch.randn(m, 2 * h, device="cuda").to(torch.float16)
    got = ops.gemm_dact(dy, w2, preact, "swiglu", config=cfg)
    want = ops.gemm_dact(dy, w2, preact, "swiglu", config=dataclasses.replace(cfg, dact_pair_swap=False))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"{name}: fp16 dact differs"
    ref_dpre, _ = ACTIVATIONS["swiglu"].backward(preact.float(), dy.float() @ w2.float())
    check(got[0], ref_dpre, ACTIVATIONS["swiglu"].backward(preact, dy @ w2)[0], f"{name} fp16 swiglu")
