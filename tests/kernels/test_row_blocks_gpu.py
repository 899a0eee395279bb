"""Row blocks of a GEMM with the whole GEMM's kernel (the ops' whole_rows, used by the
tensor-parallel overlap): bitwise the rows of the whole GEMM, for the plain, act and dact
epilogues, written into row views of the whole outputs. On an sm_90 GPU (skipped elsewhere)."""

import pytest
import torch

requires_sm90 = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
    reason="needs an sm_90 GPU (H100/H200)",
)
pytestmark = [pytest.mark.gpu, requires_sm90]

# (M, K, N) and row blocks: two TP ranks' blocks of 1000 rows (not a tile multiple), four blocks
# of whole 256-row tiles, and fc2 of the swiglu h=14336 MLP (cooperative 128x256, 2x1 clusters).
CASES = [((2000, 1024, 1536), 2), ((4096, 2048, 1024), 4)]
BIG = ((8192, 14336, 4096), 4)


def blocks(m, n_blocks):
    step = m // n_blocks
    return [slice(i * step, (i + 1) * step) for i in range(n_blocks)]


@pytest.mark.parametrize("case", CASES + [BIG])
def test_plain_gemm_blocks_equal_the_whole(case):
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.config import default_config

    (m, k, n), nb = case
    assert not default_config(m, n, k).stream_k  # a stream-K whole would split K differently
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16().t()
    whole = ops.gemm(a, b)
    out = torch.empty_like(whole)
    for rows in blocks(m, nb):
        ops.gemm(a[rows], b, out=out[rows], whole_rows=m)
    assert torch.equal(out, whole)


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
@pytest.mark.parametrize("case", CASES)
def test_act_and_dact_blocks_equal_the_whole(case, activation):
    from parallel_mlp.activations import ACTIVATIONS
    from parallel_mlp.kernels import ops

    (m, k, n), nb = case
    gated = ACTIVATIONS[activation].gated
    a = torch.randn(m, k, device="cuda").bfloat16()
    w1 = (torch.randn(n, k, device="cuda") * k**-0.5).bfloat16()
    bias = torch.randn(n, device="cuda").bfloat16()
    pre, post = ops.gemm_act(a, w1.t(), activation, bias=bias)
    pre_b, post_b = torch.empty_like(pre), torch.empty_like(post)
    for rows in blocks(m, nb):
        ops.gemm_act(a[rows], w1.t(), activation, bias=bias, out_preact=pre_b[rows],
                     out_postact=post_b[rows], whole_rows=m)
    assert torch.equal(pre_b, pre) and torch.equal(post_b, post)

    h = post.shape[1]
    dy = torch.randn(m, 512, device="cuda").bfloat16()
    w2 = (torch.randn(512, h, device="cuda") * h**-0.5).bfloat16()
    dpre, post2 = ops.gemm_dact(dy, w2, pre, activation)
    dpre_b, post2_b = torch.empty_like(dpre), torch.empty_like(post2)
    for rows in blocks(m, nb):
        ops.gemm_dact(dy[rows], w2, pre[rows], activation, out_dpreact=dpre_b[rows],
                      out_postact=post2_b[rows], whole_rows=m)
    assert torch.equal(dpre_b, dpre) and torch.equal(post2_b, post2)
    assert dpre.shape[1] == (2 * h if gated else h)
