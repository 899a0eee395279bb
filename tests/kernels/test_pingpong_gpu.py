"""The pingpong consumer schedule (GemmConfig(consumers="pingpong")) on an sm_90 GPU.

Each test checks the pingpong kernel against the fp32 reference by DESIGN.md's tolerance (the
helpers of test_ops_gpu) AND bitwise against a cooperative kernel whose warpgroups issue the same
WGMMA instruction shape: pingpong 128x128 (one warpgroup, two m64n128 atoms along M) against
cooperative 128x128 (two warpgroups, one m64n128 atom each), pingpong 64x256 against cooperative
128x256 (m64n256 atoms), pingpong 64x128 and 64x64 against cooperative 128x128 and 128x64. Why
bitwise must hold: every output element is accumulated in fp32 from zero by the same sequence
of WGMMAs (same instruction, K slices of 64 in order, k16 steps in order), and the epilogue
applies the same per-element math (visit) to the same fp32 value; only which warpgroup (and when)
computes a tile differs. A bitwise failure with the tolerance passing
means a different K order or instruction shape crept in; a tolerance failure is a real bug (a wrong
tile, a skipped or repeated ring stage, an epilogue buffer overwritten by the other warpgroup).

Shapes: tails in every dim (M=1000, K=4000, N=48 / 1040 / 1048), a multi-wave shape (2048 x 2304
x 512: 288 128x128 tiles on 132 SMs, so CTAs have 2 or 3 tiles and WG1 sometimes has one fewer),
K of one slice (1000 x 64 x 4096: the ring skips a single stage per tile; the producer runs far
ahead) and a single-tile problem (WG1 has no tile at all).
"""

import pytest
import torch

from parallel_mlp.activations import ACTIVATIONS

from test_ops_gpu import check, operand, requires_sm90  # same directory: pytest puts it on sys.path

pytestmark = [pytest.mark.gpu, requires_sm90]

# pingpong tile -> the cooperative config with the same WGMMA instruction shape; the 64-row tiles
# of 64 and 128 columns are the candidates for GEMMs with fewer 128-row tiles than SMs
PAIRS = {(128, 128): (128, 128), (64, 256): (128, 256), (64, 128): (128, 128), (64, 64): (128, 64)}
TILES = list(PAIRS)
TILE_IDS = [f"{m}x{n}" for m, n in TILES]


def _configs(tile, cluster=(1, 1), scheduler="static"):
    from parallel_mlp.kernels.config import GemmConfig

    pp = GemmConfig(*tile, *cluster, consumers="pingpong", scheduler=scheduler)
    coop = GemmConfig(*PAIRS[tile], *cluster)
    return pp, coop


GEMM_SHAPES = [(1000, 4000, 48), (2048, 512, 2304), (1000, 64, 4096), (64, 128, 256)]


@pytest.mark.parametrize("tile", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("a_major,b_major", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")])
@pytest.mark.parametrize("shape", GEMM_SHAPES)
def test_pingpong_gemm(shape, a_major, b_major, tile):
    from parallel_mlp.kernels import ops

    pp, coop = _configs(tile)
    m, k, n = shape
    a = operand(m, k, a_major, torch.bfloat16, k ** -0.5)
    b = operand(k, n, b_major, torch.bfloat16)
    got = ops.gemm(a, b, config=pp)
    check(got, a.float() @ b.float(), a @ b, f"pingpong gemm {shape} {tile} a:{a_major} b:{b_major}")
    assert torch.equal(got, ops.gemm(a, b, config=coop)), f"pingpong != cooperative {shape} {tile}"


@pytest.mark.parametrize("tile", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1000, 4000, 48), (2048, 512, 2304)])
def test_pingpong_gemm_dtypes_fp32_out(shape, dtype, tile):
    from parallel_mlp.kernels import ops

    pp, coop = _configs(tile)
    m, k, n = shape
    a = operand(m, k, "row", dtype, k ** -0.5)
    b = operand(k, n, "col", dtype)
    got = ops.gemm(a, b, config=pp)
    check(got, a.float() @ b.float(), a @ b, f"pingpong gemm {dtype} {shape} {tile}")
    assert torch.equal(got, ops.gemm(a, b, config=coop))
    got32 = ops.gemm(a, b, out_dtype=torch.float32, config=pp)
    check(got32, a.float() @ b.float(), a @ b, f"pingpong gemm fp32 out {dtype} {shape} {tile}")
    assert torch.equal(got32, ops.gemm(a, b, out_dtype=torch.float32, config=coop))


@pytest.mark.parametrize("tile", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("shape", [(1000, 4000, 1048), (2048, 512, 3072)])
def test_pingpong_accumulate(shape, tile):
    """The main-grad path (TMA reduce-add): every tile added exactly once per launch."""
    from parallel_mlp.kernels import ops

    pp, coop = _configs(tile)
    m, k, n = shape
    a = operand(m, k, "col", torch.bfloat16, k ** -0.5)
    b = operand(k, n, "row", torch.bfloat16)
    base = torch.randn(m, n, device="cuda")
    got, want = base.clone(), base.clone()
    for _ in range(2):
        ops.gemm(a, b, out=got, accumulate=True, config=pp)
        ops.gemm(a, b, out=want, accumulate=True, config=coop)
    check(got, base + 2 * (a.float() @ b.float()), base + 2 * (a @ b).float(), f"pingpong accumulate {shape} {tile}")
    assert torch.equal(got, want)


# N = 1040: a tail in N whose gated half-width rows TMA can still store.
@pytest.mark.parametrize("tile", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 2304)])
@pytest.mark.parametrize(
    "act,bias,store_preact",
    [("swiglu", False, True), ("swiglu", True, True), ("gelu_tanh_approx", True, True), ("gelu_tanh_approx", False, False)],
)
def test_pingpong_act(act, bias, store_preact, shape, tile):
    from parallel_mlp.kernels import ops

    pp, coop = _configs(tile)
    A = ACTIVATIONS[act]
    m, k, n = shape
    x = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w = operand(n, k, "row", torch.bfloat16)
    b1 = (torch.randn(n, device="cuda") * 0.5).to(torch.bfloat16) if bias else None
    pre, post = ops.gemm_act(x, w.t(), act, bias=b1, store_preact=store_preact, config=pp)
    ref_pre = x.float() @ w.float().t() + (b1.float() if bias else 0)
    lowp_pre = x @ w.t() + (b1 if bias else 0)
    check(post, A.forward(ref_pre), A.forward(lowp_pre), f"pingpong {act} postact {shape} {tile}")
    assert (pre is None) == (not store_preact)
    if store_preact:
        check(pre, ref_pre, lowp_pre, f"pingpong {act} preact {shape} {tile}")
    pre_c, post_c = ops.gemm_act(x, w.t(), act, bias=b1, store_preact=store_preact, config=coop)
    assert torch.equal(post, post_c)
    if store_preact:
        assert torch.equal(pre, pre_c)


@pytest.mark.parametrize("tile", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 2304)])
@pytest.mark.parametrize("act", ["swiglu", "relu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pingpong_dact(dtype, act, shape, tile):
    from parallel_mlp.kernels import ops

    pp, coop = _configs(tile)
    A = ACTIVATIONS[act]
    m, k, h = shape
    width = 2 * h if A.gated else h
    dy = operand(m, k, "row", dtype, k ** -0.5)
    w2 = operand(k, h, "row", dtype)
    preact = torch.randn(m, width, device="cuda").to(dtype)
    dpre, post = ops.gemm_dact(dy, w2, preact, act, config=pp)
    ref_dpre, ref_post = A.backward(preact.float(), dy.float() @ w2.float())
    lowp_dpre, lowp_post = A.backward(preact, dy @ w2)
    check(dpre, ref_dpre, lowp_dpre, f"pingpong {act} dpreact {shape} {tile}")
    check(post, ref_post, lowp_post, f"pingpong {act} postact {shape} {tile}")
    dpre_c, post_c = ops.gemm_dact(dy, w2, preact, act, config=coop)
    assert torch.equal(dpre, dpre_c) and torch.equal(post, post_c)


@pytest.mark.parametrize("cluster", [(2, 1), (1, 2)])
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 2304)])
def test_pingpong_cluster(shape, cluster):
    """Multicast A/B: a ring stage is released by one warpgroup in each CTA of the cluster."""
    from parallel_mlp.kernels import ops

    pp, coop = _configs((128, 128), cluster)
    m, k, n = shape
    a = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    b = operand(k, n, "col", torch.bfloat16)
    got = ops.gemm(a, b, config=pp)
    check(got, a.float() @ b.float(), a @ b, f"pingpong gemm cluster {cluster} {shape}")
    assert torch.equal(got, ops.gemm(a, b, config=coop))
    _, post = ops.gemm_act(a, b, "swiglu", config=pp)
    check(post, ACTIVATIONS["swiglu"].forward(a.float() @ b.float()), ACTIVATIONS["swiglu"].forward(a @ b), "act")
    preact = torch.randn(m, 2 * n, device="cuda").to(torch.bfloat16)
    dpre, post = ops.gemm_dact(a, b, preact, "swiglu", config=pp)
    dpre_c, post_c = ops.gemm_dact(a, b, preact, "swiglu", config=coop)
    assert torch.equal(dpre, dpre_c) and torch.equal(post, post_c)


@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 2304), (1000, 64, 4096)])
def test_pingpong_dynamic_scheduler(shape):
    """Pingpong with the dynamic scheduler: both warpgroups read every published index and each
    keeps every other one; never read past the terminating index."""
    from parallel_mlp.kernels import ops

    pp, coop = _configs((128, 128), scheduler="dynamic")
    m, k, n = shape
    a = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    b = operand(k, n, "col", torch.bfloat16)
    want = ops.gemm(a, b, config=coop)
    for i in range(3):
        got = ops.gemm(a, b, config=pp)
        assert torch.equal(got, want), f"dynamic pingpong launch {i}"
    check(got, a.float() @ b.float(), a @ b, f"dynamic pingpong gemm {shape}")
    preact = torch.randn(m, 2 * n, device="cuda").to(torch.bfloat16)
    dpre, post = ops.gemm_dact(a, b, preact, "swiglu", config=pp)
    dpre_c, post_c = ops.gemm_dact(a, b, preact, "swiglu", config=coop)
    assert torch.equal(dpre, dpre_c) and torch.equal(post, post_c)


@pytest.mark.parametrize("cfg_index", range(4))
def test_every_pingpong_candidate_is_correct(cfg_index):
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import PINGPONG_CANDIDATES

    cfg = PINGPONG_CANDIDATES[cfg_index]
    a = operand(1000, 4000, "row", torch.bfloat16, 4000 ** -0.5)
    b = operand(4000, 1048, "col", torch.bfloat16)
    check(ops.gemm(a, b, config=cfg), a.float() @ b.float(), a @ b, f"gemm {cfg.key}")
    _, post = ops.gemm_act(a, b, "swiglu", config=cfg)
    check(post, ACTIVATIONS["swiglu"].forward(a.float() @ b.float()), ACTIVATIONS["swiglu"].forward(a @ b), f"act {cfg.key}")


def test_pingpong_deterministic():
    from parallel_mlp.kernels import ops

    pp, _ = _configs((128, 128))
    a = operand(2048, 512, "row", torch.bfloat16, 512 ** -0.5)
    b = operand(512, 2304, "col", torch.bfloat16)
    first = ops.gemm(a, b, config=pp)
    for _ in range(3):
        assert torch.equal(ops.gemm(a, b, config=pp), first)
