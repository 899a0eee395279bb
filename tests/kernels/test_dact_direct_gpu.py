"""The direct dact (GemmConfig.dact_direct) on an sm_90 GPU.

It computes every element with the same accumulators (same tile, same WGMMAs, same K order) and
the same per-element math as the dact that stages its epilogue in shared memory, only writing
dpreact and postact straight from registers to global memory (and, cooperative, reading preact
into registers before the mainloop; pingpong keeps its preact ring). So its outputs
must equal that dact's bit for bit, and DESIGN.md's fp32 reference by its tolerance. Shapes have
tails in M, N and K (M = 136 and 1000 against 64- and 128-row tiles, h = 200 and 1040 against
64- to 192-wide tiles, K = 64 and 1000), gated and not, bf16 and fp16, and outputs written
into row blocks of larger tensors.
"""

import dataclasses

import pytest

from test_ops_gpu import requires_sm90  # same directory: pytest puts it on sys.path
from twins import dact_operands, dact_twins

pytestmark = [pytest.mark.gpu, requires_sm90]


def _config(name):
    from parallel_mlp.kernels.config import GemmConfig

    def pp(tm, tn, cm=1, cn=1, **kw):
        return GemmConfig(tm, tn, cm, cn, 16, consumers="pingpong", dact_direct=True, **kw)

    return {
        "pp128x192_pf2_e16": pp(128, 192, 2, dact_prefetch=2, epi_n=16),
        "pp128x128_pf2_e16": pp(128, 128, 2, dact_prefetch=2, epi_n=16),
        "pp128x192_e32": pp(128, 192, 2),
        "pp192x128_pf2_e16": pp(192, 128, 1, 2, dact_prefetch=2, epi_n=16),
        "pp64x64": pp(64, 64),
        "coop128x128": GemmConfig(128, 128, 1, 1, 8, dact_direct=True),
        "coop128x128_c2": GemmConfig(128, 128, 2, 1, 8, dact_direct=True),
        "coop128x192": GemmConfig(128, 192, 1, 1, 8, dact_direct=True),
        "coop128x64": GemmConfig(128, 64, 1, 1, 8, dact_direct=True),
        "coop64x128": GemmConfig(64, 128, 1, 1, 8, dact_direct=True),
    }[name]


CONFIGS = ["coop128x128", "coop128x128_c2", "coop128x192", "coop128x64", "coop64x128",
           "pp128x192_pf2_e16", "pp128x128_pf2_e16", "pp128x192_e32", "pp192x128_pf2_e16", "pp64x64"]
SHAPES = [(1000, 4000, 1040), (2048, 512, 2304), (1000, 64, 4096), (136, 1000, 200)]


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
@pytest.mark.parametrize("shape", SHAPES)
def test_direct_dact_is_bitwise_the_staged_dact(shape, act, name):
    cfg = _config(name)
    dact_twins(cfg, dataclasses.replace(cfg, dact_direct=False), shape, act, name)


@pytest.mark.parametrize("name", ["coop128x128", "pp128x192_pf2_e16"])
@pytest.mark.parametrize("act", ["geglu", "swiglu_oai", "relu", "relu_sq", "gelu"])
def test_direct_dact_other_acts(act, name):
    cfg = _config(name)
    dact_twins(cfg, dataclasses.replace(cfg, dact_direct=False), (1000, 1000, 1040), act, act)


def test_pingpong_direct_dact_with_l2_prefetch():
    cfg = dataclasses.replace(_config("pp128x192_pf2_e16"), l2_prefetch=True)
    dact_twins(cfg, dataclasses.replace(cfg, dact_direct=False), (2048, 512, 2304), "swiglu", "l2pf")


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
@pytest.mark.parametrize("name", ["coop128x128", "pp128x192_pf2_e16"])
def test_direct_dact_fp16(act, name):
    import torch

    from parallel_mlp.activations import ACTIVATIONS
    from parallel_mlp.kernels import ops
    from test_ops_gpu import check

    cfg = _config(name)
    A = ACTIVATIONS[act]
    dy, w2, preact = dact_operands((1000, 1000, 1040), act, torch.float16)
    got = ops.gemm_dact(dy, w2, preact, act, config=cfg)
    want = ops.gemm_dact(dy, w2, preact, act, config=dataclasses.replace(cfg, dact_direct=False))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"{act}: fp16 direct dact differs"
    ref_dpre, ref_post = A.backward(preact.float(), dy.float() @ w2.float())
    lowp_dpre, lowp_post = A.backward(preact, dy @ w2)
    check(got[0], ref_dpre, lowp_dpre, f"fp16 {act} dpreact")
    check(got[1], ref_post, lowp_post, f"fp16 {act} postact")


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
@pytest.mark.parametrize("name", ["coop128x128", "pp128x192_pf2_e16"])
def test_direct_dact_into_row_blocks(act, name):
    """Outputs that are row blocks of larger tensors (the layer's row-block launches): the
    direct stores follow the blocks' strides and leave the rows around them untouched."""
    import torch

    from parallel_mlp.kernels import ops

    cfg = _config(name)
    m, h = 1000, 1040
    dy, w2, preact = dact_operands((m, 512, h), act)
    width = preact.shape[1]
    big_dpre = torch.full((m + 300, width), 7.0, device="cuda", dtype=torch.bfloat16)
    big_post = torch.full((m + 300, h), 7.0, device="cuda", dtype=torch.bfloat16)
    ops.gemm_dact(dy, w2, preact, act, config=cfg, out_dpreact=big_dpre[100:100 + m],
                  out_postact=big_post[100:100 + m])
    want = ops.gemm_dact(dy, w2, preact, act, config=dataclasses.replace(cfg, dact_direct=False))
    assert torch.equal(big_dpre[100:100 + m], want[0]) and torch.equal(big_post[100:100 + m], want[1])
    for t in (big_dpre, big_post):
        assert (t[:100] == 7).all() and (t[100 + m:] == 7).all(), "a direct store left its row block"
