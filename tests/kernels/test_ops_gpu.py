"""The cute ops against an fp32 reference, on an sm_90 GPU (skipped elsewhere).

Tolerance (DESIGN.md): max |ours - ref| <= 2 * max |torch_lowp - ref| + a small absolute slack,
where ref is the op computed in fp32 from the same (bf16/fp16) inputs and torch_lowp is PyTorch's
own path in the input dtype (cuBLAS + the reference activation).
"""

import pytest
import torch

from parallel_mlp.activations import ACTIVATIONS

requires_sm90 = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
    reason="needs an sm_90 GPU (H100/H200)",
)

pytestmark = [pytest.mark.gpu, requires_sm90]

DTYPES = [torch.bfloat16, torch.float16]
# (M, K, N): tails in every dim (M=1000, K=4000, small N), and one aligned multi-wave shape.
SHAPES = [(1000, 4000, 48), (1000, 4000, 1024), (2048, 512, 3072), (64, 128, 256)]


def operand(rows, cols, major, dtype, scale=1.0):
    if major == "row":
        t = torch.randn(rows, cols, device="cuda", dtype=torch.float32)
    else:
        t = torch.randn(cols, rows, device="cuda", dtype=torch.float32).t()
    return (t * scale).to(dtype)


def check(ours, ref, lowp, what):
    ours, ref, lowp = ours.float(), ref.float(), lowp.float()
    assert torch.isfinite(ours).all(), f"{what}: non-finite values"
    err = (ours - ref).abs().max().item()
    base = (lowp - ref).abs().max().item()
    slack = 1e-3 * ref.abs().max().item() + 1e-5
    assert err <= 2 * base + slack, f"{what}: max err {err:.3e} > 2 * torch's {base:.3e} + {slack:.1e}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_major", ["row", "col"])
@pytest.mark.parametrize("b_major", ["row", "col"])
@pytest.mark.parametrize("shape", SHAPES)
def test_gemm(shape, b_major, a_major, dtype):
    from parallel_mlp.kernels import ops

    m, k, n = shape
    a = operand(m, k, a_major, dtype, k ** -0.5)
    b = operand(k, n, b_major, dtype)
    ref = a.float() @ b.float()
    out = ops.gemm(a, b)
    assert out.shape == (m, n) and out.dtype == dtype
    check(out, ref, a @ b, f"gemm {shape} a:{a_major} b:{b_major}")
    out32 = ops.gemm(a, b, out_dtype=torch.float32)
    assert out32.dtype == torch.float32
    check(out32, ref, a @ b, "gemm fp32 out")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1000, 4000, 48), (1024, 1000, 2048)])
def test_gemm_accumulate_fp32(shape, dtype):
    """The main-grad path: out += a @ b into an fp32 buffer, twice (two micro-batches)."""
    from parallel_mlp.kernels import ops

    m, k, n = shape
    # wgrad layout: a = dy.T (column-major view), b = postact (row-major)
    a = operand(m, k, "col", dtype, k ** -0.5)
    b = operand(k, n, "row", dtype)
    base = torch.randn(m, n, device="cuda")
    out = base.clone()
    ops.gemm(a, b, out=out, accumulate=True)
    ops.gemm(a, b, out=out, accumulate=True)
    ref = base + 2 * (a.float() @ b.float())
    lowp = base + 2 * (a @ b).float()
    check(out, ref, lowp, "accumulate")


def test_gemm_col_major_out():
    from parallel_mlp.kernels import ops

    a = operand(1000, 4000, "row", torch.bfloat16, 4000 ** -0.5)
    b = operand(4000, 256, "col", torch.bfloat16)
    out = torch.empty(256, 1000, device="cuda", dtype=torch.float32).t()
    ops.gemm(a, b, out=out)
    check(out, a.float() @ b.float(), a @ b, "column-major out")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_act(act, dtype, bias):
    from parallel_mlp.kernels import ops

    A = ACTIVATIONS[act]
    m, k, n = 1000, 4000, 512
    x = operand(m, k, "row", dtype, k ** -0.5)
    w = operand(n, k, "row", dtype)  # weight [F, d]; b = w.T
    b1 = (torch.randn(n, device="cuda") * 0.5).to(dtype) if bias else None
    pre, post = ops.gemm_act(x, w.t(), act, bias=b1)
    ref_pre = x.float() @ w.float().t() + (b1.float() if bias else 0)
    ref_post = A.forward(ref_pre)
    lowp_pre = x @ w.t() + (b1 if bias else 0)
    lowp_post = A.forward(lowp_pre)
    check(pre, ref_pre, lowp_pre, f"{act} preact")
    check(post, ref_post, lowp_post, f"{act} postact")
    assert post.shape == (m, n // 2 if A.gated else n)
    none, post2 = ops.gemm_act(x, w.t(), act, bias=b1, store_preact=False)
    assert none is None
    assert torch.equal(post2, post), "postact must not depend on store_preact"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_gemm_dact(act, dtype):
    from parallel_mlp.kernels import ops

    A = ACTIVATIONS[act]
    m, k, h = 1000, 4000, 512
    width = 2 * h if A.gated else h
    dy = operand(m, k, "row", dtype, k ** -0.5)
    w2 = operand(k, h, "row", dtype)  # W2 [d_out, h]: dpostact = dy @ W2
    preact = torch.randn(m, width, device="cuda").to(dtype)
    dpre, post = ops.gemm_dact(dy, w2, preact, act)
    ref_dpost = dy.float() @ w2.float()
    ref_dpre, ref_post = A.backward(preact.float(), ref_dpost)
    lowp_dpre, lowp_post = A.backward(preact, dy @ w2)
    assert dpre.shape == (m, width) and post.shape == (m, h)
    check(dpre, ref_dpre, lowp_dpre, f"{act} dpreact")
    check(post, ref_post, lowp_post, f"{act} postact")


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_big_pingpong_dact_of_every_activation(act):
    """Every activation's dact in the big default's pingpong 128x192 tiles (2x1 clusters, two
    preact slots per warpgroup, 16-column subtiles) against the reference, tails in M, N and K:
    the other dact tests run most activations in the short-K and small-shape configs only, and
    the swiglu family here."""
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import GemmConfig

    cfg = GemmConfig(128, 192, 2, 1, 16, consumers="pingpong", dact_prefetch=2, epi_n=16)
    A = ACTIVATIONS[act]
    m, k, h = 1000, 1000, 1040
    dy = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w2 = operand(k, h, "row", torch.bfloat16)
    preact = torch.randn(m, 2 * h if A.gated else h, device="cuda").to(torch.bfloat16)
    dpre, post = ops.gemm_dact(dy, w2, preact, act, config=cfg)
    ref_dpre, ref_post = A.backward(preact.float(), dy.float() @ w2.float())
    lowp_dpre, lowp_post = A.backward(preact, dy @ w2)
    check(dpre, ref_dpre, lowp_dpre, f"{act} pingpong dpreact")
    check(post, ref_post, lowp_post, f"{act} pingpong postact")


def test_deterministic():
    from parallel_mlp.kernels import ops

    a = operand(2048, 4096, "row", torch.bfloat16, 0.02)
    b = operand(4096, 2048, "col", torch.bfloat16)
    r1 = ops.gemm(a, b)
    r2 = ops.gemm(a, b)
    assert torch.equal(r1, r2)


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_device_math_matches_reference(act):
    """The activation math on device (DEVICE_MATH) vs TorchMath, isolated from GEMM rounding:
    with b = identity, preact equals x exactly, so postact differs only by the math."""
    from parallel_mlp.kernels import ops

    A = ACTIVATIONS[act]
    n = 256
    x = (torch.randn(512, n, device="cuda") * 3).to(torch.bfloat16)
    eye = torch.eye(n, device="cuda", dtype=torch.bfloat16)
    pre, post = ops.gemm_act(x, eye, act)
    assert torch.equal(pre, x)
    ref = A.forward(x.float())
    err = (post.float() - ref).abs().max().item()
    # One bf16 rounding of the output is all that may separate them.
    assert err <= 2 ** -7 * ref.abs().max().item() + 1e-6, err


def test_unsupported_reason_on_gpu():
    from parallel_mlp.kernels import ops

    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    assert ops.unsupported_reason(a, a) is None
    assert "dtype" in ops.unsupported_reason(a.float().double())
    assert "16 bytes" in ops.unsupported_reason(torch.randn(64, 66, device="cuda", dtype=torch.bfloat16)[:, :63])


@pytest.mark.parametrize("act", ["swiglu", "relu"])
def test_unaligned_output_rows(act):
    """A gated h (or N) whose output rows TMA cannot store: gemm_act runs the kernel on padded
    rows (preact with a plain gemm's bits), the dact falls back to the reference math; both right."""
    from parallel_mlp.kernels import ops

    A = ACTIVATIONS[act]
    n = 20 if A.gated else 12  # postact / output rows of 10 or 12 bf16: not 16-byte multiples
    x = operand(100, 64, "row", torch.bfloat16, 0.125)
    w = operand(n, 64, "row", torch.bfloat16)
    pre, post = ops.gemm_act(x, w.t(), act)
    assert pre.is_contiguous() and post.is_contiguous()
    ref = x.float() @ w.float().t()
    check(post, A.forward(ref), A.forward(x @ w.t()), "act on padded rows")
    assert torch.equal(pre, ops.gemm(x, w.t()))
    none, post_only = ops.gemm_act(x, w.t(), act, store_preact=False)
    assert none is None and torch.equal(post_only, post)
    dy = operand(100, 64, "row", torch.bfloat16, 0.125)
    w2 = operand(64, n // 2 if A.gated else n, "col", torch.bfloat16)  # aligned storage, narrow N
    dpre, post2 = ops.gemm_dact(dy, w2, pre, act)
    rd, rp = A.backward(pre.float(), dy.float() @ w2.float())
    ld, lp = A.backward(pre, dy @ w2)
    check(dpre, rd, ld, "fallback dact")


def test_act_into_a_buffer_tma_cannot_store_to():
    """A caller's postact view with a misaligned row stride: the kernel's result, copied in."""
    from parallel_mlp.kernels import ops

    x = operand(300, 256, "row", torch.bfloat16, 0.0625)
    w = operand(512, 256, "row", torch.bfloat16)
    want_pre, want_post = ops.gemm_act(x, w.t(), "swiglu")
    big = torch.full((300, 264), 7.0, device="cuda", dtype=torch.bfloat16)
    out_post = big[:, 1:257]  # data pointer 2 bytes past alignment
    pre, post = ops.gemm_act(x, w.t(), "swiglu", out_postact=out_post)
    assert post.data_ptr() == out_post.data_ptr()
    assert torch.equal(post, want_post) and torch.equal(pre, want_pre)
    assert (big[:, 0] == 7).all() and (big[:, 257:] == 7).all()


@pytest.mark.parametrize("cluster", [None, (1, 1), (2, 1)])
def test_stores_into_column_views_leave_the_columns_after_them(cluster):
    """Outputs whose rows are not a whole number of 16-byte chunks (N = 1001 in bf16, 2002
    bytes), written into column views of wider buffers: gemm, fp32 accumulation into one and
    gemm_act give the bits of fresh outputs, and every column after the view keeps its 7s (TMA
    stores whole 16-byte chunks, so a launch on the view itself overwrote the next 7 columns).
    The default config and cooperative 128x128 tiles in 1x1 and 2x1 clusters."""
    import dataclasses

    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import GemmConfig

    cfg = None if cluster is None else dataclasses.replace(GemmConfig(128, 128, 1, 1, 8),
                                                           cluster_m=cluster[0], cluster_n=cluster[1])
    m, k, n = 1000, 512, 1001
    x = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w = operand(k, n, "col", torch.bfloat16)

    def room(dtype):
        return torch.full((m, 1024), 7.0, device="cuda", dtype=dtype)

    big = room(torch.bfloat16)
    out = ops.gemm(x, w, out=big[:, :n], config=cfg)
    assert out.data_ptr() == big.data_ptr() and torch.equal(out, ops.gemm(x, w, config=cfg))
    assert (big[:, n:] == 7).all(), "gemm wrote past its out view"

    acc = room(torch.float32)
    ops.gemm(x, w, out=acc[:, :n], accumulate=True, config=cfg)
    want = ops.gemm(x, w, out_dtype=torch.float32, config=cfg) + 7
    assert torch.equal(acc[:, :n], want) and (acc[:, n:] == 7).all(), "accumulate wrote past its view"

    pre_room, post_room = room(torch.bfloat16), room(torch.bfloat16)
    pre, post = ops.gemm_act(x, w, "gelu_tanh_approx", config=cfg, out_preact=pre_room[:, :n],
                             out_postact=post_room[:, :n])
    want_pre, want_post = ops.gemm_act(x, w, "gelu_tanh_approx", config=cfg)
    assert torch.equal(pre, want_pre) and torch.equal(post, want_post)
    assert (pre_room[:, n:] == 7).all() and (post_room[:, n:] == 7).all(), "gemm_act wrote past its views"


def test_column_major_outputs_of_the_fused_ops_hold_the_fresh_outputs_bits():
    """gemm_act and gemm_dact into a caller's column-major buffers (the kernels write row-major
    ones, so the result is copied in) give the bits of fresh outputs."""
    from parallel_mlp.kernels import ops

    def column_major(rows, cols):
        return torch.empty(cols, rows, device="cuda", dtype=torch.bfloat16).t()

    x = operand(1000, 512, "row", torch.bfloat16, 512 ** -0.5)
    w = operand(512, 768, "col", torch.bfloat16)
    pre, post = column_major(1000, 768), column_major(1000, 384)
    ops.gemm_act(x, w, "swiglu", out_preact=pre, out_postact=post)
    want_pre, want_post = ops.gemm_act(x, w, "swiglu")
    assert torch.equal(pre, want_pre) and torch.equal(post, want_post)
    dy = operand(1000, 256, "row", torch.bfloat16, 0.125)
    w2 = operand(256, 384, "col", torch.bfloat16)
    dpre, post2 = column_major(1000, 768), column_major(1000, 384)
    ops.gemm_dact(dy, w2, want_pre, "swiglu", out_dpreact=dpre, out_postact=post2)
    want_dpre, want_post2 = ops.gemm_dact(dy, w2, want_pre, "swiglu")
    assert torch.equal(dpre, want_dpre) and torch.equal(post2, want_post2)


def test_operand_views_whose_rows_end_inside_a_16_byte_chunk_read_nothing_past_them():
    """A and B as K-major views of wider buffers whose other columns hold NaN, K = 1001 (rows of
    2002 bytes): the K tail past the views must load as zeros, as TMA's bounds promise, not as
    the NaNs in the rest of the 16-byte chunk, for gemm and gemm_act alike."""
    from parallel_mlp.kernels import ops

    m, k, n = 1000, 1001, 512
    a_room = torch.full((m, 1024), float("nan"), device="cuda", dtype=torch.bfloat16)
    b_room = torch.full((n, 1024), float("nan"), device="cuda", dtype=torch.bfloat16)
    a_room[:, :k] = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    b_room[:, :k] = operand(n, k, "row", torch.bfloat16)
    a, b = a_room[:, :k], b_room[:, :k].t()
    ref = a.float() @ b.float()
    check(ops.gemm(a, b), ref, a @ b, "gemm of operand views")
    _, post = ops.gemm_act(a, b, "relu")
    check(post, torch.relu(ref), torch.relu(a @ b), "gemm_act of operand views")


def test_tuned_choice_is_timed_once_and_kept_on_disk(tmp_path, monkeypatch):
    import json

    from parallel_mlp.kernels import ops, tuning

    monkeypatch.setenv("PARALLEL_MLP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "_choices", None)
    a = operand(512, 1024, "row", torch.bfloat16, 1024 ** -0.5)
    b = operand(1024, 768, "col", torch.bfloat16)
    out = ops.gemm(a, b, tuned=True)
    check(out, a.float() @ b.float(), a @ b, "tuned gemm")
    assert tuning._path().parent == tmp_path
    saved = json.loads(tuning._path().read_text())
    assert len(saved) == 1
    calls = []
    from parallel_mlp.bench import timing  # what tuned_config times candidates with

    monkeypatch.setattr(timing, "median_ms_held", lambda fns, **kw: calls.append(1) or [1.0] * len(fns))
    ops.gemm(a, b, tuned=True)
    assert not calls, "a kept choice must not be timed again"


@pytest.mark.parametrize("cfg_index", range(6))
def test_every_tuning_candidate_is_correct(cfg_index):
    """tuned=True may pick any candidate, so each must be right (clusters, tiles, tails)."""
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import TUNE_CANDIDATES

    cfg = TUNE_CANDIDATES[cfg_index]
    a = operand(1000, 4000, "row", torch.bfloat16, 4000 ** -0.5)
    b = operand(4000, 1048, "col", torch.bfloat16)
    check(ops.gemm(a, b, config=cfg), a.float() @ b.float(), a @ b, f"gemm {cfg.key}")
    _, post = ops.gemm_act(a, b, "swiglu", config=cfg)
    ref = ACTIVATIONS["swiglu"].forward(a.float() @ b.float())
    check(post, ref, ACTIVATIONS["swiglu"].forward(a @ b), f"act {cfg.key}")


# ---- the dynamic tile scheduler (GemmConfig(scheduler="dynamic")) ---------------------------------
#
# Same tile shape => same per-tile math, only the CTA that computes a tile differs, so every output
# must equal the static kernel's bit for bit (and be within tolerance of the fp32 reference).
# Shapes: tails in every dim; many more tiles than SMs (so CTAs claim tiles from the counter); K of
# one slice (tiny tiles: the producer runs far ahead of the consumers through the index ring).
DYNAMIC_SHAPES = [(1000, 4000, 48), (1000, 4000, 1048), (2048, 512, 3072), (1000, 64, 4096), (4096, 256, 4096)]
DYNAMIC_TILES = [(128, 256), (128, 128), (64, 128)]


def _static_and_dynamic(tile):
    from parallel_mlp.kernels.config import GemmConfig

    return GemmConfig(*tile), GemmConfig(*tile, scheduler="dynamic")


@pytest.mark.parametrize("tile", DYNAMIC_TILES)
@pytest.mark.parametrize("shape", DYNAMIC_SHAPES)
def test_dynamic_scheduler_gemm(shape, tile):
    from parallel_mlp.kernels import ops

    static, dynamic = _static_and_dynamic(tile)
    m, k, n = shape
    a = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    b = operand(k, n, "col", torch.bfloat16)
    want = ops.gemm(a, b, config=static)
    # Several launches in a row: each must start from a zeroed counter.
    for i in range(3):
        got = ops.gemm(a, b, config=dynamic)
        assert torch.equal(got, want), f"dynamic != static {shape} {tile} (launch {i})"
    check(got, a.float() @ b.float(), a @ b, f"dynamic gemm {shape} {tile}")
    got32 = ops.gemm(a, b, out_dtype=torch.float32, config=dynamic)
    assert torch.equal(got32, ops.gemm(a, b, out_dtype=torch.float32, config=static))


@pytest.mark.parametrize("tile", [(128, 256), (128, 128)])
@pytest.mark.parametrize("shape", [(1000, 4000, 1048), (2048, 512, 3072)])
def test_dynamic_scheduler_accumulate(shape, tile):
    """The main-grad path: each tile is reduce-added exactly once per launch."""
    from parallel_mlp.kernels import ops

    static, dynamic = _static_and_dynamic(tile)
    m, k, n = shape
    a = operand(m, k, "col", torch.bfloat16, k ** -0.5)
    b = operand(k, n, "row", torch.bfloat16)
    base = torch.randn(m, n, device="cuda")
    want, got = base.clone(), base.clone()
    for _ in range(2):
        ops.gemm(a, b, out=want, accumulate=True, config=static)
        ops.gemm(a, b, out=got, accumulate=True, config=dynamic)
    assert torch.equal(got, want)
    check(got, base + 2 * (a.float() @ b.float()), base + 2 * (a @ b).float(), f"dynamic accumulate {shape} {tile}")


# N = 1040: a tail in N whose gated half-width rows (520 bf16) TMA stores directly (at N = 1048
# gemm_act would store them padded and copy them out).
@pytest.mark.parametrize("tile", [(128, 256), (128, 128)])
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 3072)])
@pytest.mark.parametrize("act,bias,store_preact", [("swiglu", True, True), ("gelu_tanh_approx", False, False), ("relu_sq", True, True)])
def test_dynamic_scheduler_act(act, bias, store_preact, shape, tile):
    from parallel_mlp.kernels import ops

    static, dynamic = _static_and_dynamic(tile)
    A = ACTIVATIONS[act]
    m, k, n = shape
    x = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w = operand(n, k, "row", torch.bfloat16)
    b1 = (torch.randn(n, device="cuda") * 0.5).to(torch.bfloat16) if bias else None
    pre_s, post_s = ops.gemm_act(x, w.t(), act, bias=b1, store_preact=store_preact, config=static)
    pre_d, post_d = ops.gemm_act(x, w.t(), act, bias=b1, store_preact=store_preact, config=dynamic)
    assert torch.equal(post_d, post_s)
    assert (pre_d is None) == (not store_preact)
    if store_preact:
        assert torch.equal(pre_d, pre_s)
    ref_pre = x.float() @ w.float().t() + (b1.float() if bias else 0)
    lowp_pre = x @ w.t() + (b1 if bias else 0)
    check(post_d, A.forward(ref_pre), A.forward(lowp_pre), f"dynamic {act} postact {shape} {tile}")


@pytest.mark.parametrize("tile", [(128, 256), (128, 128)])
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 3072)])
@pytest.mark.parametrize("act", ["swiglu", "relu"])
def test_dynamic_scheduler_dact(act, shape, tile):
    from parallel_mlp.kernels import ops

    static, dynamic = _static_and_dynamic(tile)
    A = ACTIVATIONS[act]
    m, k, h = shape
    width = 2 * h if A.gated else h
    dy = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w2 = operand(k, h, "row", torch.bfloat16)
    preact = torch.randn(m, width, device="cuda").to(torch.bfloat16)
    dpre_s, post_s = ops.gemm_dact(dy, w2, preact, act, config=static)
    dpre_d, post_d = ops.gemm_dact(dy, w2, preact, act, config=dynamic)
    assert torch.equal(dpre_d, dpre_s) and torch.equal(post_d, post_s)
    ref_dpre, ref_post = A.backward(preact.float(), dy.float() @ w2.float())
    lowp_dpre, lowp_post = A.backward(preact, dy @ w2)
    check(dpre_d, ref_dpre, lowp_dpre, f"dynamic {act} dpreact {shape} {tile}")
    check(post_d, ref_post, lowp_post, f"dynamic {act} postact {shape} {tile}")


def test_dynamic_scheduler_two_streams():
    """GEMMs on two streams of one device may overlap; each launch has its own tile counter."""
    from parallel_mlp.kernels import ops

    static, dynamic = _static_and_dynamic((128, 128))
    a = operand(4096, 512, "row", torch.bfloat16, 512 ** -0.5)
    b = operand(512, 4096, "col", torch.bfloat16)
    want = ops.gemm(a, b, config=static)
    ops.gemm(a, b, config=dynamic)  # compile outside the timed overlap
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    outs_main, outs_side = [], []
    with torch.cuda.stream(side):
        for _ in range(4):
            outs_side.append(ops.gemm(a, b, config=dynamic))
    for _ in range(4):
        outs_main.append(ops.gemm(a, b, config=dynamic))
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for o in outs_main + outs_side:
        assert torch.equal(o, want)


def test_dynamic_scheduler_two_threads():
    """Two threads launching on one stream interleave their counter resets and launches."""
    import threading

    from parallel_mlp.kernels import ops

    static, dynamic = _static_and_dynamic((128, 128))
    a = operand(2048, 512, "row", torch.bfloat16, 512 ** -0.5)
    b = operand(512, 3072, "col", torch.bfloat16)
    want = ops.gemm(a, b, config=static)
    ops.gemm(a, b, config=dynamic)  # compile before the threads start
    outs, errors = [], []

    def worker():
        try:
            for _ in range(8):
                outs.append(ops.gemm(a, b, config=dynamic))
        except Exception as e:  # surfaced below: an exception in a thread does not fail the test
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not errors, errors
    assert len(outs) == 16 and all(torch.equal(o, want) for o in outs)


def test_dynamic_scheduler_cuda_graph():
    """Captured into a CUDA graph, the counter reset is replayed before the kernel every time."""
    from parallel_mlp.kernels import ops

    static, dynamic = _static_and_dynamic((128, 128))
    a = operand(2048, 512, "row", torch.bfloat16, 512 ** -0.5)
    b = operand(512, 3072, "col", torch.bfloat16)
    want = ops.gemm(a, b, config=static)
    out = torch.empty_like(want)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, load the module) outside the capture
        ops.gemm(a, b, out=out, config=dynamic)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.gemm(a, b, out=out, config=dynamic)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


# Tile columns 1, 7, 8, 9 and 29 (with 128-wide tiles) around the rasterization group of 8, an
# odd number of tile rows with an M tail, and every cluster shape: the grouped rasterization must
# name each output tile exactly once (a missed tile leaves the NaN poison, a repeated one adds
# twice into the accumulator), and the grid must never exceed the number of tiles. Groups of
# columns or of rows (raster_along), each with and without the serpentine walk.
@pytest.mark.parametrize("raster", [("n", False), ("n", True), ("m", False), ("m", True)])
@pytest.mark.parametrize("cluster", [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize("group", [8, 3])
@pytest.mark.parametrize("n", [128, 7 * 128 - 8, 8 * 128, 9 * 128, 29 * 128 + 64])
def test_rasterization_covers_every_tile_once(n, group, cluster, raster):
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import GemmConfig

    cfg = GemmConfig(128, 128, *cluster, group, raster_along=raster[0], serpentine=raster[1])
    m, k = 4 * 128 + 17, 256  # 5 tile rows: the last 2x1 pair's second CTA has no rows
    a = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    b = operand(k, n, "row", torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.gemm(a, b, out=out, config=cfg)
    check(out, a.float() @ b.float(), a @ b, f"store {n} g{group} c{cluster}")
    base = torch.randn(m, n, device="cuda")
    acc = base.clone()
    ops.gemm(a, b, out=acc, accumulate=True, config=cfg)
    check(acc, base + a.float() @ b.float(), base + (a @ b).float(), f"accumulate {n} g{group} c{cluster}")


# dpreact written in place over a deeper preact ring (GemmConfig.dact_prefetch 2 or 3) moves the
# same values through other shared memory, so it must equal the two-slot kernel of the same tile
# bit for bit. Shapes: tails in M, K and the gated width (h = 1040), more tiles than SMs (so the
# ring carries over from tile to tile), and K = 64 (one k-block: the epilogue dominates). At
# 128x128 with epi_n=32, dact_prefetch=3's four slots hold a whole tile's preact.
@pytest.mark.parametrize("tile_n", [256, 128])
@pytest.mark.parametrize("pf", [2, 3])
@pytest.mark.parametrize("cluster_m", [1, 2])
@pytest.mark.parametrize("shape", [(1000, 4000, 1040), (2048, 512, 3072), (4096, 64, 2048)])
@pytest.mark.parametrize("act", ["swiglu", "relu", "gelu_tanh_approx", "geglu"])
def test_dact_in_place_equals_two_slot_ring(act, shape, cluster_m, pf, tile_n):
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import GemmConfig

    A = ACTIVATIONS[act]
    m, k, h = shape
    width = 2 * h if A.gated else h
    dy = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w2 = operand(k, h, "row", torch.bfloat16)
    preact = torch.randn(m, width, device="cuda").to(torch.bfloat16)
    base = GemmConfig(128, tile_n, cluster_m, 1)
    want_dpre, want_post = ops.gemm_dact(dy, w2, preact, act, config=base)
    for i in range(2):
        dpre, post = ops.gemm_dact(dy, w2, preact, act, config=GemmConfig(128, tile_n, cluster_m, 1, dact_prefetch=pf))
        assert torch.equal(dpre, want_dpre), f"{act} {shape} pf{pf}: dpreact differs (launch {i})"
        assert torch.equal(post, want_post), f"{act} {shape} pf{pf}: postact differs (launch {i})"
    ref_dpre, ref_post = A.backward(preact.float(), dy.float() @ w2.float())
    lowp_dpre, lowp_post = A.backward(preact, dy @ w2)
    check(dpre, ref_dpre, lowp_dpre, f"in-place {act} dpreact {shape} pf{pf}")
    check(post, ref_post, lowp_post, f"in-place {act} postact {shape} pf{pf}")


@pytest.mark.parametrize("act", ["swiglu", "relu"])
def test_dact_in_place_fp16(act):
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import GemmConfig

    A = ACTIVATIONS[act]
    m, k, h = 1000, 4000, 1040
    width = 2 * h if A.gated else h
    dy = operand(m, k, "row", torch.float16, k ** -0.5)
    w2 = operand(k, h, "row", torch.float16)
    preact = torch.randn(m, width, device="cuda").to(torch.float16)
    want = ops.gemm_dact(dy, w2, preact, act, config=GemmConfig())
    got = ops.gemm_dact(dy, w2, preact, act, config=GemmConfig(dact_prefetch=2))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    ref_dpre, _ = A.backward(preact.float(), dy.float() @ w2.float())
    check(got[0], ref_dpre, A.backward(preact, dy @ w2)[0], f"in-place fp16 {act}")


# The default config for two or more waves of 128x256 tiles is pingpong 128x192 with a 2x1
# cluster and raster group 16, or from K = COOPERATIVE_MIN_K up (not for the dact) cooperative
# 128x256 (unless pingpong's waves fill the grid better; here stream-K keeps it cooperative);
# these shapes reach both with tails in M, N and K, through the ops' own config choice. A gated
# act's postact rows there (N / 2 = 2100 or 2820 bf16) are not 16-byte multiples: gemm_act runs
# the kernel on padded rows.
BIG_TAILED = (4104, 1000, 4200)  # (M, K, N): 33 x 17 tiles of 128x256 on 132 SMs; M a multiple of 8 (col-major a)
BIG_LONG_K = (4104, 6200, 4200)  # the same with K past COOPERATIVE_MIN_K
# K past COOPERATIVE_MIN_K where pingpong 128x192's waves fill the grid better than whole
# cooperative 128x256 tiles (config.default_config): pingpong at long K, tails in M, N and K
BIG_LONG_K_WAVES = (2568, 6200, 5640)
# The same from K = LONG_K_COOPERATIVE_MIN_K up, where cooperative 128x256 takes over whatever
# the columns: tails in M, N and K
BIG_LONGER_K = (2568, 10312, 5640)  # K: 161 tiles of 64 and a tail of 8
# K from NARROW_COOPERATIVE_MIN_K, below COOPERATIVE_MIN_K, where pingpong would take 128x128
# tiles: cooperative 128x256 for store and act (accumulate keeps pingpong), tails in M, N, K
BIG_NARROW_COOP = (5512, 4200, 1288)
# K from STREAM_K_MIN_K, below COOPERATIVE_MIN_K, where pingpong 128x192's last wave and
# cooperative 128x256's both leave the grid idle: stream-K 128x256 for store and act
# (config.STREAM_K_OVER_PINGPONG_KINDS; accumulate keeps pingpong), tails in M, N and K
BIG_SK_OVER_PINGPONG = (8200, 4104, 2760)
BIG_SHAPE_IDS = ["tailed", "long_k", "long_k_waves", "longer_k", "narrow_coop",
                 "sk_over_pingpong"]


@pytest.mark.parametrize("shape", [BIG_TAILED, BIG_LONG_K, BIG_LONG_K_WAVES, BIG_LONGER_K,
                                   BIG_NARROW_COOP, BIG_SK_OVER_PINGPONG], ids=BIG_SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_default_big_gemm_and_accumulate(dtype, shape):
    check_default_gemm_and_accumulate(shape, dtype, "default big")


def check_default_gemm_and_accumulate(shape, dtype, what):
    """A plain GEMM (row-major A) and two fp32 accumulations in the wgrad layout (column-major
    A) at shape (m, k, n), each at the config the default rule gives it."""
    from parallel_mlp.kernels import ops

    m, k, n = shape
    a = operand(m, k, "row", dtype, k ** -0.5)
    b = operand(k, n, "col", dtype)
    check(ops.gemm(a, b), a.float() @ b.float(), a @ b, f"{what} gemm")
    at = operand(m, k, "col", dtype, k ** -0.5)  # the wgrad layout
    base = torch.randn(m, n, device="cuda")
    acc = base.clone()
    ops.gemm(at, b, out=acc, accumulate=True)
    ops.gemm(at, b, out=acc, accumulate=True)
    check(acc, base + 2 * (at.float() @ b.float()), base + 2 * (at @ b).float(), f"{what} accumulate")


def check_default_act_and_replay(shape, act, what):
    """fc1 + act at shape (m, k, n) against the reference, and recompute's plain replay of fc1
    bit for bit equal to its preact (both at the config the default rule gives them)."""
    from parallel_mlp.kernels import ops

    A = ACTIVATIONS[act]
    m, k, n = shape
    x = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w = operand(n, k, "row", torch.bfloat16)
    pre, post = ops.gemm_act(x, w.t(), act)
    ref_pre, lowp_pre = x.float() @ w.float().t(), x @ w.t()
    check(pre, ref_pre, lowp_pre, f"{act} {what} preact")
    check(post, A.forward(ref_pre), A.forward(lowp_pre), f"{act} {what} postact")
    assert torch.equal(ops.gemm(x, w.t()), pre)


@pytest.mark.parametrize("shape", [BIG_TAILED, BIG_LONG_K, BIG_LONG_K_WAVES, BIG_LONGER_K,
                                   BIG_NARROW_COOP, BIG_SK_OVER_PINGPONG], ids=BIG_SHAPE_IDS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx", "relu_sq"])
def test_default_big_gemm_act_and_recompute_bits(act, bias, shape):
    from parallel_mlp.kernels import ops

    A = ACTIVATIONS[act]
    m, k, n = shape
    if shape == BIG_SK_OVER_PINGPONG:  # the premise: this GPU's default runs it in stream-K
        from parallel_mlp.kernels.config import default_config

        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert default_config(m, n, k, sms, "act").stream_k
    x = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w = operand(n, k, "row", torch.bfloat16)
    b1 = (torch.randn(n, device="cuda") * 0.5).to(torch.bfloat16) if bias else None
    pre, post = ops.gemm_act(x, w.t(), act, bias=b1)
    ref_pre = x.float() @ w.float().t() + (b1.float() if bias else 0)
    lowp_pre = x @ w.t() + (b1 if bias else 0)
    check(pre, ref_pre, lowp_pre, f"{act} default big preact")
    check(post, A.forward(ref_pre), A.forward(lowp_pre), f"{act} default big postact")
    if not bias:
        # recompute replays fc1 as a plain GEMM: the same config, so the same bits
        assert torch.equal(ops.gemm(x, w.t()), pre)


def check_default_dact(shape, act, what):
    """The dact (dy @ W2, then the activation's backward with preact) at shape (m, k, h), at the
    config the default rule gives it, against the fp32 reference."""
    from parallel_mlp.kernels import ops
    from twins import dact_operands  # imports this module: here, once it is whole

    A = ACTIVATIONS[act]
    dy, w2, preact = dact_operands(shape, act)
    dpre, post = ops.gemm_dact(dy, w2, preact, act)
    ref_dpre, ref_post = A.backward(preact.float(), dy.float() @ w2.float())
    lowp_dpre, lowp_post = A.backward(preact, dy @ w2)
    check(dpre, ref_dpre, lowp_dpre, f"{act} {what} dpreact")
    check(post, ref_post, lowp_post, f"{act} {what} dact postact")


# A big GEMM of few rows in 2x1 pingpong clusters (config.PAIR_MIN_ROWS): 9 tile rows, so the
# last pair's second tile lies wholly past M; tails in M, N and K.
BIG_PAIRED_FEW_ROWS = (1096, 4104, 7688)


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_default_big_pingpong_pairs_at_few_rows(act):
    """fc1 + act (and recompute's replay, bit for bit), a plain GEMM, fp32 accumulation and the
    dact at the few-row big shape, each in the 2x1 pingpong config the rule gives it."""
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import default_config

    m, k, n = BIG_PAIRED_FEW_ROWS
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for kind in ("act", "dact"):
        cfg = default_config(m, n, k, sms, kind)
        assert (cfg.consumers, cfg.cluster_m) == ("pingpong", 2), (kind, cfg)
    check_default_act_and_replay(BIG_PAIRED_FEW_ROWS, act, "paired few-row")
    at = operand(m, k, "col", torch.bfloat16, k ** -0.5)
    w = operand(n, k, "row", torch.bfloat16)
    base = torch.randn(m, n, device="cuda")
    acc = base.clone()
    ops.gemm(at, w.t(), out=acc, accumulate=True)
    check(acc, base + at.float() @ w.float().t(), base + (at @ w.t()).float(), "paired few-row accumulate")
    check_default_dact((m, k, n), act, "paired few-row")


# Below two waves of 128x256 tiles, where stream-K 128x256 tiles would pad N much more than 128
# columns do (config.STREAM_K_WIDE_MAX_PAD): whole 128x128 tiles, tails in M, N and K
NARROW_WHOLE = (4104, 8200, 1320)


def test_default_narrow_whole_tiles_gemm_and_accumulate():
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import default_config

    m, k, n = NARROW_WHOLE
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = default_config(m, n, k, sms, "accumulate")
    assert (cfg.tile_m, cfg.tile_n, cfg.stream_k) == (128, 128, False)
    at = operand(m, k, "col", torch.bfloat16, k ** -0.5)  # the wgrad layout
    b = operand(k, n, "col", torch.bfloat16)
    base = torch.randn(m, n, device="cuda")
    acc = base.clone()
    ops.gemm(at, b, out=acc, accumulate=True)
    ops.gemm(at, b, out=acc, accumulate=True)
    check(acc, base + 2 * (at.float() @ b.float()), base + 2 * (at @ b).float(), "narrow whole-tile accumulate")
    check(ops.gemm(at, b), at.float() @ b.float(), at @ b, "narrow whole-tile gemm")


# Just under one wave of 128x256 tiles (config.ONE_WAVE_MIN_FILL): whole 128x256 tiles, 2x1 where
# the tile rows pair up (8 x 16 and 4 x 32 tiles), 1x1 where an odd one would pad a cluster
# (5 x 24); tails in M, N and K.
ONE_WAVE_PAIRED = (1000, 2760, 4000)  # (M, K, N)
ONE_WAVE_PAIRED_FEW_ROWS = (504, 1000, 8104)
ONE_WAVE_SINGLE = (632, 1000, 6136)


@pytest.mark.parametrize("shape,cluster_m", [(ONE_WAVE_PAIRED, 2), (ONE_WAVE_PAIRED_FEW_ROWS, 2),
                                             (ONE_WAVE_SINGLE, 1)],
                         ids=["paired", "paired-few-rows", "single"])
def test_default_one_wave_whole_256_tiles(shape, cluster_m):
    """A plain GEMM, fp32 accumulation and fc1 + act (with recompute's replay, bit for bit) at
    the whole 128x256 config the rule gives a GEMM just under one wave of those tiles."""
    from parallel_mlp.kernels.config import default_config

    m, k, n = shape
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if sms != 132:
        pytest.skip(f"the shapes fill 120-128 of 132 SMs' tiles; this GPU has {sms}")
    for kind in ("store", "act", "accumulate"):
        cfg = default_config(m, n, k, sms, kind)
        assert (cfg.tile_n, cfg.cluster_m, cfg.stream_k) == (256, cluster_m, False), (kind, cfg)
    check_default_gemm_and_accumulate(shape, torch.bfloat16, "one-wave")
    check_default_act_and_replay(shape, "swiglu", "one-wave")


# A big dact past SHORT_K_DACT_MAX_K (BIG_TAILED's K = 1000 takes the short-K cooperative tiles)
BIG_DACT_PINGPONG = (4104, 2104, 4200)  # K rows 16-byte aligned, as TMA needs


@pytest.mark.parametrize("shape,consumers", [(BIG_TAILED, "cooperative"),
                                             (BIG_DACT_PINGPONG, "pingpong"),
                                             (BIG_NARROW_COOP, "cooperative")])
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_default_big_gemm_dact(act, shape, consumers):
    """The default big-shape dacts against the reference: pingpong (dpreact in place over its
    preact slots), at a short K cooperative 128x128 tiles, and at a narrow N from
    NARROW_COOPERATIVE_MIN_K cooperative 128x256 tiles."""
    from parallel_mlp.kernels.config import default_config

    m, k, h = shape
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert default_config(m, h, k, sms, "dact").consumers == consumers
    check_default_dact(shape, act, "default big")
