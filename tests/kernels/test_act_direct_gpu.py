"""The direct act (GemmConfig.act_direct) on an sm_90 GPU.

It computes every element from the same accumulators (same tile, same WGMMAs, same K order) with
the same per-element math (Epilogue.act_unit, the same fp32 bias add) as the act that stages
its epilogue in shared memory, only storing preact and postact straight from registers to
global memory. So its outputs must equal that act's bit for bit, and DESIGN.md's fp32 reference
by its tolerance. Shapes have tails in M, N and K (M = 136 and 1000 against 64- to 256-row
tiles, N = 208 and 2080 against 128- to 256-wide tiles, K = 64 and 1000), gated and not, with
and without a bias, postact alone, stream-K, bf16 and fp16, an odd N (the staged twin's, by
ops._storable_config), and outputs written into row blocks of larger tensors.
"""

import dataclasses

import pytest

from test_ops_gpu import requires_sm90  # same directory: pytest puts it on sys.path
from twins import act_twins

pytestmark = [pytest.mark.gpu, requires_sm90]


def _config(name):
    from parallel_mlp.kernels.config import GemmConfig

    def pp(tm, tn, cm=1, cn=1, **kw):
        return GemmConfig(tm, tn, cm, cn, 16, consumers="pingpong", act_direct=True, **kw)

    return {
        "pp128x192_c2": pp(128, 192, 2),
        "pp128x128": pp(128, 128),
        "pp192x128_c12": pp(192, 128, 1, 2),
        "pp64x128": pp(64, 128),
        "coop128x256_c2": GemmConfig(128, 256, 2, 1, 8, act_direct=True),
        "coop128x128": GemmConfig(128, 128, 1, 1, 8, act_direct=True),
        "coop256x128_c12": GemmConfig(256, 128, 1, 2, 8, act_direct=True),
        "coop64x128": GemmConfig(64, 128, 1, 1, 8, act_direct=True),
        "coop128x128_sk": GemmConfig(128, 128, 1, 1, 8, stream_k=True, act_direct=True),
    }[name]


CONFIGS = ["pp128x192_c2", "pp128x128", "pp192x128_c12", "pp64x128", "coop128x256_c2", "coop128x128",
           "coop256x128_c12", "coop64x128", "coop128x128_sk"]
SHAPES = [(1000, 1000, 2080), (2048, 512, 4096), (1000, 64, 1024), (136, 1000, 208)]


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
@pytest.mark.parametrize("shape", SHAPES)
def test_direct_act_is_bitwise_the_staged_act(shape, act, name):
    cfg = _config(name)
    act_twins(cfg, dataclasses.replace(cfg, act_direct=False), shape, act, False, name)


@pytest.mark.parametrize("name", ["pp128x192_c2", "coop128x256_c2", "coop128x128_sk"])
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_direct_act_with_a_bias(act, name):
    cfg = _config(name)
    act_twins(cfg, dataclasses.replace(cfg, act_direct=False), (1000, 1000, 2080), act, True, f"{name} bias")


@pytest.mark.parametrize("name", ["pp128x192_c2", "coop128x256_c2"])
@pytest.mark.parametrize("act", ["geglu", "swiglu_oai", "relu", "relu_sq", "gelu"])
def test_direct_act_other_acts(act, name):
    cfg = _config(name)
    act_twins(cfg, dataclasses.replace(cfg, act_direct=False), (1000, 1000, 2080), act, False, act)


def _operands(shape, dtype, bias):
    import torch

    from test_ops_gpu import operand

    m, k, n = shape
    x = operand(m, k, "row", dtype, k ** -0.5)
    w = operand(k, n, "col", dtype)
    b = torch.randn(n, device="cuda").to(dtype) if bias else None
    return x, w, b


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
@pytest.mark.parametrize("name", ["pp128x192_c2", "coop128x256_c2"])
def test_direct_act_postact_alone(act, name):
    """store_preact=False (recompute's forward): postact alone, the same bits."""
    import torch

    from parallel_mlp.kernels import ops

    cfg = _config(name)
    x, w, _ = _operands((1000, 1000, 2080), torch.bfloat16, False)
    pre, post = ops.gemm_act(x, w, act, store_preact=False, config=cfg)
    _, want = ops.gemm_act(x, w, act, config=dataclasses.replace(cfg, act_direct=False))
    assert pre is None and torch.equal(post, want)


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
@pytest.mark.parametrize("name", ["pp128x192_c2", "coop128x256_c2"])
def test_direct_act_fp16(act, name):
    import torch

    from parallel_mlp.activations import ACTIVATIONS
    from parallel_mlp.kernels import ops
    from test_ops_gpu import check

    cfg = _config(name)
    x, w, b = _operands((1000, 1000, 2080), torch.float16, True)
    got = ops.gemm_act(x, w, act, bias=b, config=cfg)
    want = ops.gemm_act(x, w, act, bias=b, config=dataclasses.replace(cfg, act_direct=False))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"{act}: fp16 direct act differs"
    ref = x.float() @ w.float() + b.float()
    check(got[1], ACTIVATIONS[act].forward(ref), ACTIVATIONS[act].forward(x @ w + b), f"fp16 {act} postact")


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
@pytest.mark.parametrize("name", ["pp128x192_c2", "coop128x256_c2"])
def test_direct_act_into_row_blocks(act, name):
    """Outputs that are row blocks of larger tensors (the layer's row-block launches): the
    direct stores follow the blocks' strides and leave the rows around them untouched."""
    import torch

    from parallel_mlp.activations import ACTIVATIONS
    from parallel_mlp.kernels import ops

    cfg = _config(name)
    m, n = 1000, 2080
    post_n = n // 2 if ACTIVATIONS[act].gated else n
    x, w, b = _operands((m, 512, n), torch.bfloat16, True)
    big_pre = torch.full((m + 300, n), 7.0, device="cuda", dtype=torch.bfloat16)
    big_post = torch.full((m + 300, post_n), 7.0, device="cuda", dtype=torch.bfloat16)
    ops.gemm_act(x, w, act, bias=b, config=cfg, out_preact=big_pre[100:100 + m],
                 out_postact=big_post[100:100 + m])
    want = ops.gemm_act(x, w, act, bias=b, config=dataclasses.replace(cfg, act_direct=False))
    assert torch.equal(big_pre[100:100 + m], want[0]) and torch.equal(big_post[100:100 + m], want[1])
    for t in (big_pre, big_post):
        assert (t[:100] == 7).all() and (t[100 + m:] == 7).all(), "a direct store left its row block"


@pytest.mark.parametrize("name", ["pp128x192_c2", "coop128x256_c2"])
def test_odd_n_stays_inside_a_callers_columns(name):
    """A non-gated N of 1001 into column views of wider buffers: ops gives it the staged twin,
    and the column after the view's last is never written."""
    import torch

    from parallel_mlp.kernels import ops

    cfg = _config(name)
    m, n = 1000, 1001
    x, w, _ = _operands((m, 512, n), torch.bfloat16, False)
    big_pre = torch.full((m, 1024), 7.0, device="cuda", dtype=torch.bfloat16)
    big_post = torch.full((m, 1024), 7.0, device="cuda", dtype=torch.bfloat16)
    ops.gemm_act(x, w, "gelu_tanh_approx", config=cfg, out_preact=big_pre[:, :n], out_postact=big_post[:, :n])
    want = ops.gemm_act(x, w, "gelu_tanh_approx", config=dataclasses.replace(cfg, act_direct=False))
    assert torch.equal(big_pre[:, :n], want[0]) and torch.equal(big_post[:, :n], want[1])
    assert (big_pre[:, n:] == 7).all() and (big_post[:, n:] == 7).all()
