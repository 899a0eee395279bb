"""Checks shared by the GPU tests of kernel options that must not change an output bit: run an op
with the option's config and with a reference config (the same WGMMA instruction, K order and
per-element epilogue math), check the option against the fp32 reference by DESIGN.md's
tolerance, and require the two outputs to be bitwise equal."""

import torch

from parallel_mlp.activations import ACTIVATIONS

from test_ops_gpu import check, operand  # same directory: pytest puts it on sys.path


def gemm_twins(cfg, ref_cfg, shape, a_major="row", b_major="col", what=""):
    from parallel_mlp.kernels import ops

    m, k, n = shape
    a = operand(m, k, a_major, torch.bfloat16, k ** -0.5)
    b = operand(k, n, b_major, torch.bfloat16)
    got = ops.gemm(a, b, config=cfg)
    check(got, a.float() @ b.float(), a @ b, f"{what} gemm {shape} a:{a_major} b:{b_major}")
    assert torch.equal(got, ops.gemm(a, b, config=ref_cfg)), f"{what}: gemm {shape} differs from its twin"


def accumulate_twins(cfg, ref_cfg, shape, times=1, what=""):
    """The fp32 main-grad path (TMA reduce-add), `times` launches into the same buffer."""
    from parallel_mlp.kernels import ops

    m, k, n = shape
    a = operand(m, k, "col", torch.bfloat16, k ** -0.5)
    b = operand(k, n, "row", torch.bfloat16)
    base = torch.randn(m, n, device="cuda")
    got, want = base.clone(), base.clone()
    for _ in range(times):
        ops.gemm(a, b, out=got, accumulate=True, config=cfg)
        ops.gemm(a, b, out=want, accumulate=True, config=ref_cfg)
    check(got, base + times * (a.float() @ b.float()), base + times * (a @ b).float(), f"{what} accumulate {shape}")
    assert torch.equal(got, want), f"{what}: accumulate {shape} differs from its twin"


def act_twins(cfg, ref_cfg, shape, act, bias, what=""):
    from parallel_mlp.kernels import ops

    A = ACTIVATIONS[act]
    m, k, n = shape
    x = operand(m, k, "row", torch.bfloat16, k ** -0.5)
    w = operand(k, n, "col", torch.bfloat16)
    b = torch.randn(n, device="cuda").to(torch.bfloat16) if bias else None
    pre, post = ops.gemm_act(x, w, act, bias=b, config=cfg)
    ref = x.float() @ w.float() + (b.float() if bias else 0)
    lowp = x @ w + (b if bias else 0)
    check(pre, ref, lowp, f"{what} preact {act} {shape}")
    check(post, A.forward(ref), A.forward(lowp), f"{what} postact {act} {shape}")
    pre2, post2 = ops.gemm_act(x, w, act, bias=b, config=ref_cfg)
    assert torch.equal(pre, pre2) and torch.equal(post, post2), f"{what}: act {act} {shape} differs from its twin"


def dact_operands(shape, act, dtype=torch.bfloat16):
    """(dy, W2, preact) of a dact at shape (m, k, h): dy @ W2 is the m x h dpostact."""
    m, k, h = shape
    dy = operand(m, k, "row", dtype, k ** -0.5)
    w2 = operand(k, h, "row", dtype)
    preact = torch.randn(m, 2 * h if ACTIVATIONS[act].gated else h, device="cuda").to(dtype)
    return dy, w2, preact


def dact_twins(cfg, ref_cfg, shape, act, what=""):
    from parallel_mlp.kernels import ops

    A = ACTIVATIONS[act]
    dy, w2, preact = dact_operands(shape, act)
    dpre, post = ops.gemm_dact(dy, w2, preact, act, config=cfg)
    ref_dpre, ref_post = A.backward(preact.float(), dy.float() @ w2.float())
    lowp_dpre, lowp_post = A.backward(preact, dy @ w2)
    check(dpre, ref_dpre, lowp_dpre, f"{what} {act} dpreact {shape}")
    check(post, ref_post, lowp_post, f"{what} {act} postact {shape}")
    dpre_r, post_r = ops.gemm_dact(dy, w2, preact, act, config=ref_cfg)
    assert torch.equal(dpre, dpre_r) and torch.equal(post, post_r), f"{what}: dact {act} {shape} differs from its twin"
