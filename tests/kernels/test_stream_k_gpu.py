"""Stream-K (GemmConfig.stream_k) on an sm_90 GPU: the store and accumulate epilogues.

The last partial wave's K blocks are split between clusters and summed through a workspace, so
the bits differ from the whole-tile kernel's; what must hold is DESIGN.md's tolerance against
the fp32 reference, the same bits on every run (the owner adds the partial sums in a fixed
order), and agreement with the whole-tile kernel within rounding. `num_sms` shrinks the grid
so that small problems have full waves, a partial last wave, tiles split two ways and tiles
split many ways with some clusters' segments empty; and problems with fewer tiles than the grid
holds, whose K blocks every cluster shares.
"""

import dataclasses

import pytest
import torch

from test_ops_gpu import check, operand, requires_sm90  # same directory: pytest puts it on sys.path

pytestmark = [pytest.mark.gpu, requires_sm90]


def _configs(name):
    from parallel_mlp.kernels.config import GemmConfig

    return {
        # 3 clusters of 2; (1000, 1048) is 4 x 5 cluster tiles: 6 full waves and 2 tiles split
        # over the 3 clusters (one owner piece and one contributor piece each)
        "c2x1_sm6": GemmConfig(128, 256, 2, 1, 16, num_sms=6, stream_k=True),
        # 7 clusters of 1: on 8 tiles (512 x 512), 1 full wave, then one tile's K blocks over the
        # 7 clusters (K = 448: one each; K = 200: 4 K blocks, so three clusters get none); on
        # 16 tiles (504 x 1000), 2 full waves and 2 tiles 3.5 ways
        "c1x1_sm7": GemmConfig(128, 256, 1, 1, 8, num_sms=7, stream_k=True),
        # the MLP's shapes on the whole H200
        "c2x1": GemmConfig(128, 256, 2, 1, 16, stream_k=True),
        # fewer tiles than the grid holds: no whole-tile wave, every cluster shares the tiles'
        # K blocks (the wgrads at T=65536 d=1024: 64 tiles of 128x128 on 132 SMs)
        "c1x1_t128": GemmConfig(128, 128, 1, 1, 8, stream_k=True),
        # the same with 128x256 tiles, in 2x1 and in 1x1 clusters
        "c2x1_t256": GemmConfig(128, 256, 2, 1, 8, stream_k=True),
        "c1x1_t256": GemmConfig(128, 256, 1, 1, 8, stream_k=True),
        # 128x64 tiles: the short-K under-filled GEMMs' default tile, shared over the grid
        "c1x1_t64": GemmConfig(128, 64, 1, 1, 8, stream_k=True),
    }[name]


CASES = [
    ("c2x1_sm6", (1000, 4000, 1048)),
    ("c1x1_sm7", (512, 448, 512)),
    ("c1x1_sm7", (512, 200, 512)),
    ("c1x1_sm7", (504, 4000, 1000)),  # 504: an M-major A needs a 16-byte leading stride
    ("c2x1", (8192, 7168, 4096)),  # fc2 at h=7168: 7.76 waves of 128x256
]
# Fewer tile clusters than the grid: 2 tiles (256 x 256) over 7 clusters, K = 448 (7 K blocks:
# 14 pieces) and K = 128 (2 blocks: the grid shrinks to 4 clusters, one block each); 16 clusters
# of 2 over all 66 (1000 x 1000, K = 1000: 16 K blocks per tile); the wgrad at T=65536, d=1024
# in 128x128 and 128x256 tiles; and the short-T shapes with 16 to 32 tiles over K of 2816-65536.
UNDERFILLED = [
    ("c1x1_sm7", (256, 448, 256)),
    ("c1x1_sm7", (256, 128, 256)),
    ("c2x1", (1000, 1000, 1000)),
    ("c1x1_t128", (1024, 65536, 1024)),
    ("c2x1_t256", (1024, 65536, 1024)),
    ("c2x1_t256", (2048, 65536, 704)),  # dW2 at T=65536, d=2048, h=704: N = 704, a tail of 192
    ("c1x1_t256", (512, 2816, 1024)),  # fc2 at T=512, d=1024, h=2816: 16 tiles, K = 44 blocks
    ("c2x1_t256", (512, 5632, 1000)),  # dx at T=512 with an N tail
    ("c1x1_t64", (512, 2816, 1024)),  # fc2 at T=512: 64 tiles, 44 K blocks each
    ("c1x1_t64", (512, 5632, 1000)),
    # an odd number of tile rows in 2x1 clusters (3: the last pair's second CTA has no rows; 20
    # tile clusters, split 3.3 ways), and a single partial tile row in 1x1 (16 tiles, 8.25
    # ways), at the under-filled rule's K
    ("c2x1_t256", (296, 40000, 2560)),
    ("c1x1_t256", (104, 40000, 4096)),
    # each tile split many ways: 4 tiles 33 ways, 2 tiles 66 ways (with an M tail), and 6 tile
    # clusters of 2x1 11 ways
    ("c1x1_t256", (256, 40000, 512)),
    ("c1x1_t256", (104, 40000, 304)),
    ("c2x1_t256", (512, 40000, 768)),
]
# Output rows that TMA cannot store (N = 700 and 300 in bf16: 1400 and 600 bytes; B
# column-major, so its own rows are K long), computed in padded rows: launched on the unpadded
# rows these gave wrong sums, stream-K and whole tiles alike.
UNALIGNED_ROWS = [("c2x1_t256", (300, 40000, 700)), ("c1x1_t256", (100, 40000, 300))]
# A partial last wave of 1 tile (133 of 128x128 on 132 SMs) split 132 ways.
PARTIAL_WAVE_132_WAYS = ("c1x1_t128", (133 * 128, 8192, 128))


@pytest.mark.parametrize("name,shape", CASES + UNDERFILLED + [PARTIAL_WAVE_132_WAYS])
@pytest.mark.parametrize("b_major", ["row", "col"])
def test_stream_k_gemm(name, shape, b_major):
    from parallel_mlp.kernels import ops

    cfg = _configs(name)
    m, k, n = shape
    a = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    b = operand(k, n, b_major, torch.bfloat16)
    got = ops.gemm(a, b, config=cfg)
    check(got, a.float() @ b.float(), a @ b, f"{name} stream-K gemm {shape} b:{b_major}")
    assert torch.equal(got, ops.gemm(a, b, config=cfg)), f"{name}: stream-K gemm {shape} not deterministic"
    whole = ops.gemm(a, b, config=dataclasses.replace(cfg, stream_k=False))
    check(got, a.float() @ b.float(), whole, f"{name} stream-K vs whole tiles {shape}")


@pytest.mark.parametrize("name,shape", UNALIGNED_ROWS)
def test_output_rows_tma_cannot_store(name, shape):
    from parallel_mlp.kernels import ops

    cfg = _configs(name)
    m, k, n = shape
    a = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    b = operand(k, n, "col", torch.bfloat16)
    ref, lowp = a.float() @ b.float(), a @ b
    for c in (cfg, dataclasses.replace(cfg, stream_k=False), None):
        got = ops.gemm(a, b, config=c)
        assert got.is_contiguous() and got.shape == (m, n)
        check(got, ref, lowp, f"{c} gemm {shape}, output rows of {n * 2} bytes")
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        assert ops.gemm(a, b, out=out, config=c) is out
        check(out, ref, lowp, f"{c} gemm {shape} into out= rows of {n * 2} bytes")


@pytest.mark.parametrize("name,shape", CASES[:4] + [("c2x1", (4096, 8192, 7168))] + UNDERFILLED)  # dW2 at h=7168
def test_stream_k_accumulate(name, shape):
    from parallel_mlp.kernels import ops

    cfg = dataclasses.replace(_configs(name), l2_prefetch=True)
    m, k, n = shape
    a = operand(m, k, "col", torch.bfloat16, k ** -0.5)
    b = operand(k, n, "row", torch.bfloat16)
    base = torch.randn(m, n, device="cuda")
    got, again = base.clone(), base.clone()
    for _ in range(2):
        ops.gemm(a, b, out=got, accumulate=True, config=cfg)
        ops.gemm(a, b, out=again, accumulate=True, config=cfg)
    check(got, base + 2 * (a.float() @ b.float()), base + 2 * (a @ b).float(), f"{name} stream-K accumulate {shape}")
    assert torch.equal(got, again), f"{name}: stream-K accumulate {shape} not deterministic"


@pytest.mark.parametrize("name,shape", [CASES[0], CASES[2]])
@pytest.mark.parametrize("act,bias", [("swiglu", True), ("gelu_tanh_approx", False)])
def test_stream_k_gemm_act(name, shape, act, bias):
    """The act epilogue on stream-K, and the property recompute relies on: without a bias, its
    preact is bit for bit the plain stream-K GEMM's output (both sum the same pieces in order)."""
    from parallel_mlp.activations import ACTIVATIONS
    from parallel_mlp.kernels import ops

    A = ACTIVATIONS[act]
    cfg = _configs(name)
    m, k, n = shape
    x = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w = operand(k, n, "col", torch.bfloat16)
    b = torch.randn(n, device="cuda").to(torch.bfloat16) if bias else None
    pre, post = ops.gemm_act(x, w, act, bias=b, config=cfg)
    ref = x.float() @ w.float() + (b.float() if bias else 0)
    lowp = x @ w + (b if bias else 0)
    check(pre, ref, lowp, f"{name} stream-K preact {act} {shape}")
    check(post, A.forward(ref), A.forward(lowp), f"{name} stream-K postact {act} {shape}")
    if not bias:
        assert torch.equal(pre, ops.gemm(x, w, config=cfg)), f"{name}: stream-K act preact != plain GEMM"
