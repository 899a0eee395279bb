"""16-column epilogue subtiles (GemmConfig(epi_n=16)) and the pingpong dact's two-slot preact
ring (dact_prefetch=2, both filled at the tile's start) on an sm_90 GPU.

Neither changes an output bit: the same WGMMAs make the same fp32 accumulators and the epilogue
applies the same per-element math, only in narrower pieces or with its loads earlier. So each
config is checked bitwise against its epi_n=32 / one-slot counterpart, and against the fp32
reference by DESIGN.md's tolerance, for every epilogue kind, over tails (N = 1040 and 1048 are
not multiples of the subtile in every channel) and multi-wave shapes.
"""

import dataclasses

import pytest
import torch

from parallel_mlp.activations import ACTIVATIONS

from test_ops_gpu import check, operand, requires_sm90  # same directory: pytest puts it on sys.path

pytestmark = [pytest.mark.gpu, requires_sm90]


def _pairs():
    from parallel_mlp.kernels.config import GemmConfig

    pp = GemmConfig(128, 128, 2, 1, 16, consumers="pingpong")
    coop = GemmConfig(128, 256, 2, 1, 8)
    big = GemmConfig(256, 128, 1, 2, 8)
    return {  # config under test -> the config it must equal bitwise
        "pp_e16": (dataclasses.replace(pp, epi_n=16), pp),
        "coop_e16": (dataclasses.replace(coop, epi_n=16), coop),
        "t256_e16": (dataclasses.replace(big, epi_n=16), big),
    }


DACT_PAIRS = ["pp_e16", "pp_pf2", "pp_pf2_e16", "coop_e16"]


def _dact_pair(name):
    from parallel_mlp.kernels.config import GemmConfig

    pp = GemmConfig(128, 128, 2, 1, 16, consumers="pingpong")
    return {
        "pp_e16": (dataclasses.replace(pp, epi_n=16), pp),
        "pp_pf2": (dataclasses.replace(pp, dact_prefetch=2), pp),
        "pp_pf2_e16": (dataclasses.replace(pp, dact_prefetch=2, epi_n=16), pp),
        "coop_e16": (GemmConfig(128, 256, 2, 1, 8, epi_n=16), GemmConfig(128, 256, 2, 1, 8)),
    }[name]


@pytest.mark.parametrize("name", ["pp_e16", "coop_e16", "t256_e16"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1048), (2048, 512, 2304), (64, 128, 256)])
def test_epi16_gemm_and_accumulate(shape, name):
    from parallel_mlp.kernels import ops

    cfg, ref_cfg = _pairs()[name]
    m, k, n = shape
    a = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    b = operand(k, n, "col", torch.bfloat16)
    got = ops.gemm(a, b, config=cfg)
    check(got, a.float() @ b.float(), a @ b, f"{name} gemm {shape}")
    assert torch.equal(got, ops.gemm(a, b, config=ref_cfg))
    at = operand(m, k, "col", torch.bfloat16, k ** -0.5)
    base = torch.randn(m, n, device="cuda")
    got, want = base.clone(), base.clone()
    ops.gemm(at, b, out=got, accumulate=True, config=cfg)
    ops.gemm(at, b, out=want, accumulate=True, config=ref_cfg)
    check(got, base + at.float() @ b.float(), base + (at @ b).float(), f"{name} accumulate {shape}")
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["pp_e16", "coop_e16", "t256_e16"])
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 2304)])
@pytest.mark.parametrize("act,bias", [("swiglu", True), ("gelu_tanh_approx", False)])
def test_epi16_gemm_act(act, bias, shape, name):
    from parallel_mlp.kernels import ops

    cfg, ref_cfg = _pairs()[name]
    A = ACTIVATIONS[act]
    m, k, n = shape
    x = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w = operand(k, n, "col", torch.bfloat16)
    b = torch.randn(n, device="cuda").to(torch.bfloat16) if bias else None
    pre, post = ops.gemm_act(x, w, act, bias=b, config=cfg)
    ref = x.float() @ w.float() + (b.float() if bias else 0)
    lowp = x @ w + (b if bias else 0)
    check(pre, ref, lowp, f"{name} preact {act}")
    check(post, A.forward(ref), A.forward(lowp), f"{name} postact {act}")
    pre2, post2 = ops.gemm_act(x, w, act, bias=b, config=ref_cfg)
    assert torch.equal(pre, pre2) and torch.equal(post, post2)


@pytest.mark.parametrize("name", DACT_PAIRS)
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 2304), (1000, 64, 4096)])
@pytest.mark.parametrize("act", ["swiglu", "relu"])
def test_epi16_and_two_slot_dact(act, shape, name):
    from parallel_mlp.kernels import ops

    cfg, ref_cfg = _dact_pair(name)
    A = ACTIVATIONS[act]
    m, k, h = shape
    dy = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w2 = operand(k, h, "row", torch.bfloat16)
    preact = torch.randn(m, 2 * h if A.gated else h, device="cuda").to(torch.bfloat16)
    dpre, post = ops.gemm_dact(dy, w2, preact, act, config=cfg)
    ref_dpre, ref_post = A.backward(preact.float(), dy.float() @ w2.float())
    lowp_dpre, lowp_post = A.backward(preact, dy @ w2)
    check(dpre, ref_dpre, lowp_dpre, f"{name} {act} dpreact {shape}")
    check(post, ref_post, lowp_post, f"{name} {act} postact {shape}")
    dpre_r, post_r = ops.gemm_dact(dy, w2, preact, act, config=ref_cfg)
    assert torch.equal(dpre, dpre_r) and torch.equal(post, post_r)
