"""GemmConfig.l2_prefetch on an sm_90 GPU: the producer's L2 prefetch of the epilogue input is a
cache hint, so every output must equal the kernel without it bit for bit, and the reference
within DESIGN.md's tolerance. Shapes: tails in M, K and N; more tiles than SMs; K = 64 (one K
block: fewer K blocks than subtiles to prefetch); N = 48 (the tile's last subtiles out of bounds)."""

import dataclasses

import pytest
import torch

from parallel_mlp.activations import ACTIVATIONS

from test_ops_gpu import check, operand, requires_sm90  # same directory: pytest puts it on sys.path

pytestmark = [pytest.mark.gpu, requires_sm90]

CONFIGS = [(128, 256, 1), (128, 256, 2), (128, 128, 1)]


@pytest.mark.parametrize("tile", CONFIGS)
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 3072), (4096, 64, 2048), (8192, 1024, 4096)])
@pytest.mark.parametrize("act", ["swiglu", "relu"])
def test_dact_with_prefetch_equals_without(act, shape, tile):
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import GemmConfig

    A = ACTIVATIONS[act]
    m, k, h = shape
    width = 2 * h if A.gated else h
    dy = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w2 = operand(k, h, "row", torch.bfloat16)
    preact = torch.randn(m, width, device="cuda").to(torch.bfloat16)
    base = GemmConfig(*tile, 1)
    want = ops.gemm_dact(dy, w2, preact, act, config=base)
    got = ops.gemm_dact(dy, w2, preact, act, config=dataclasses.replace(base, l2_prefetch=True))
    assert torch.equal(got[0], want[0]), f"{act} {shape} {tile}: dpreact differs"
    assert torch.equal(got[1], want[1]), f"{act} {shape} {tile}: postact differs"
    ref_dpre, ref_post = A.backward(preact.float(), dy.float() @ w2.float())
    lowp_dpre, lowp_post = A.backward(preact, dy @ w2)
    check(got[0], ref_dpre, lowp_dpre, f"prefetch {act} dpreact {shape}")
    check(got[1], ref_post, lowp_post, f"prefetch {act} postact {shape}")


@pytest.mark.parametrize("tile, dtype", [(t, torch.bfloat16) for t in CONFIGS] + [(CONFIGS[0], torch.float16)])
@pytest.mark.parametrize("shape", [(1000, 4000, 48), (1024, 1000, 2048), (4096, 8192, 1024)])
def test_accumulate_with_prefetch_equals_without(shape, tile, dtype):
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import GemmConfig

    m, k, n = shape
    a = operand(m, k, "col", dtype, k ** -0.5)  # the wgrad layout: dy.T as a column-major view
    b = operand(k, n, "row", dtype)
    base = torch.randn(m, n, device="cuda")
    cfg = GemmConfig(*tile, 1)
    want, got = base.clone(), base.clone()
    for _ in range(2):  # two micro-batches into the same main grad
        ops.gemm(a, b, out=want, accumulate=True, config=cfg)
        ops.gemm(a, b, out=got, accumulate=True, config=dataclasses.replace(cfg, l2_prefetch=True))
    assert torch.equal(got, want), f"accumulate {shape} {tile}: differs with the prefetch"
    check(got, base + 2 * (a.float() @ b.float()), base + 2 * (a @ b).float(), f"prefetch accumulate {shape}")
