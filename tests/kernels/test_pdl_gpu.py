"""Programmatic dependent launch (GemmConfig.pdl, ops.set_pdl) on an sm_90 GPU.

A kernel launched with it may start while the kernel before it on the stream still runs; each
CTA waits (griddepcontrol.wait) before it touches global memory. So the option must change no
bit of any output (each op against its twin without it, and against the fp32 reference), and a
kernel must never see what the one before it has not finished: one that reads the output of a
kernel still running (written NaN first), one that overwrites the operand a kernel still
reads, both with the earlier kernel on one CTA for a long K so that the later one's CTAs find
idle SMs at once; in CUDA graphs (where the launches become programmatic edges); and the
layer's whole step through its launch groups, against the same step launched without it.
"""

import dataclasses

import pytest
import torch

from test_ops_gpu import check, requires_sm90  # same directory: pytest puts it on sys.path
from twins import accumulate_twins, act_twins, dact_twins, gemm_twins

pytestmark = [pytest.mark.gpu, requires_sm90]


def _config(name):
    from parallel_mlp.kernels.config import GemmConfig

    return {
        "coop128x256_c2": GemmConfig(128, 256, 2, 1, 8),
        "coop128x128_pf3": GemmConfig(128, 128, 1, 1, 8, dact_prefetch=3),
        "coop128x64": GemmConfig(128, 64, 1, 1, 8),
        "pp128x192_pf2_e16_c2": GemmConfig(128, 192, 2, 1, 8, consumers="pingpong", dact_prefetch=2, epi_n=16),
        "dynamic128x128": GemmConfig(128, 128, 1, 1, 8, scheduler="dynamic"),
        "sk128x256_sm6": GemmConfig(128, 256, 2, 1, 16, num_sms=6, stream_k=True),
    }[name]


def _twins(name):
    cfg = _config(name)
    return dataclasses.replace(cfg, pdl=True), cfg


ALL = ["coop128x256_c2", "coop128x128_pf3", "coop128x64", "pp128x192_pf2_e16_c2", "dynamic128x128", "sk128x256_sm6"]
DACT = [n for n in ALL if not n.startswith("sk")]  # stream-K serves no dact


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("shape", [(1000, 4000, 1048), (2048, 512, 2304), (64, 128, 256)])
def test_gemm_and_accumulate(shape, name):
    cfg, twin = _twins(name)
    gemm_twins(cfg, twin, shape, what=cfg.key)
    accumulate_twins(cfg, twin, shape, times=2, what=cfg.key)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("act,bias", [("swiglu", True), ("gelu_tanh_approx", False)])
def test_gemm_act(act, bias, name):
    cfg, twin = _twins(name)
    act_twins(cfg, twin, (1000, 4000, 1040), act, bias, cfg.key)


@pytest.mark.parametrize("name", DACT)
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_approx"])
def test_dact(act, name):
    cfg, twin = _twins(name)
    dact_twins(cfg, twin, (1000, 4000, 1040), act, cfg.key)


# ---- hazards between consecutive kernels ------------------------------------------------------

LONG_K = 65536


def _long_and_wide(pdl: bool):
    """(the earlier kernel's config: one 128x128 tile, so one CTA, over a long K; the later
    kernel's: 128x128 tiles over many CTAs), both with pdl as given."""
    from parallel_mlp.kernels.config import GemmConfig

    return GemmConfig(128, 128, 1, 1, 8, pdl=pdl), GemmConfig(128, 128, 1, 1, 8, pdl=pdl)


def _raw_operands():
    g = torch.Generator(device="cuda").manual_seed(3)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).bfloat16()

    a = rand(128, LONG_K, scale=LONG_K ** -0.5)
    b = rand(128, LONG_K).t()  # K-major B, as a weight's transpose
    w = rand(8192, 128, scale=128 ** -0.5).t()
    return a, b, w


def _raw_chain(a, b, w, pdl: bool, mid, out):
    """mid = a @ b on one CTA, then out = mid @ w on 64, back to back on the stream."""
    from parallel_mlp.kernels import ops

    long, wide = _long_and_wide(pdl)
    ops.gemm(a, b, out=mid, config=long)
    ops.gemm(mid, w, out=out, config=wide)


def test_a_kernel_reads_the_output_of_the_kernel_before_it_only_once_that_one_ends():
    """mid is NaN until the one-CTA kernel writes it; the 64-CTA kernel after it starts on idle
    SMs at once and must read the written mid, every time."""
    a, b, w = _raw_operands()
    mid_ref, out_ref = torch.empty(128, 128, device="cuda").bfloat16(), torch.empty(128, 8192, device="cuda").bfloat16()
    _raw_chain(a, b, w, False, mid_ref, out_ref)
    check(out_ref, (a.float() @ b.float()).bfloat16().float() @ w.float(), mid_ref @ w, "the chain without pdl")
    mid, out = torch.empty_like(mid_ref), torch.empty_like(out_ref)
    for i in range(20):
        mid.fill_(float("nan"))
        out.fill_(float("nan"))
        _raw_chain(a, b, w, True, mid, out)
        torch.cuda.synchronize()
        assert torch.equal(mid, mid_ref), f"round {i}: the first kernel's output differs"
        assert torch.equal(out, out_ref), f"round {i}: the second kernel read mid before it was written"


def test_a_kernel_overwrites_an_operand_only_once_the_kernel_reading_it_ends():
    """The one-CTA kernel reads a for a long K; the 256-CTA kernel after it writes its output into
    a's storage. a @ b must be that of a as it was."""
    from parallel_mlp.kernels import ops

    g = torch.Generator(device="cuda").manual_seed(4)
    a0 = (torch.randn(128, 32768, device="cuda", generator=g) * 32768 ** -0.5).bfloat16()
    b = torch.randn(128, 32768, device="cuda", generator=g).bfloat16().t()
    x = (torch.randn(2048, 256, device="cuda", generator=g) * 256 ** -0.5).bfloat16()
    w = torch.randn(2048, 256, device="cuda", generator=g).bfloat16().t()
    long_off, wide_off = _long_and_wide(False)
    long_on, wide_on = _long_and_wide(True)
    want = ops.gemm(a0, b, config=long_off)
    overwritten = ops.gemm(x, w, config=wide_off)
    check(want, a0.float() @ b.float(), a0 @ b, "the first kernel without pdl")
    for i in range(20):
        a = a0.clone()
        got = torch.empty_like(want)
        ops.gemm(a, b, out=got, config=long_on)
        ops.gemm(x, w, out=a.view(2048, 2048), config=wide_on)
        torch.cuda.synchronize()
        assert torch.equal(got, want), f"round {i}: the first kernel read a after the second wrote it"
        assert torch.equal(a.view(2048, 2048), overwritten), f"round {i}: the second kernel's output differs"


def test_chains_of_every_epilogue_kind_replayed_from_a_cuda_graph():
    """fc1 + act, fc2, the dact, both weight gradients accumulated in fp32 and dx, each reading
    what the one before wrote, captured once into a CUDA graph with pdl (programmatic edges) and
    replayed: the bits of the same chain launched without pdl, at every replay."""
    from parallel_mlp.kernels import ops

    g = torch.Generator(device="cuda").manual_seed(5)
    T, d, h = 1000, 1024, 1408

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).bfloat16()

    x, dy = rand(T, d), rand(T, d)
    w1, w2 = rand(2 * h, d, scale=d ** -0.5), rand(d, h, scale=h ** -0.5)

    def chain(pdl, outs):
        """The step's six GEMMs on the rule's configs (ops.set_pdl), into ``outs``."""
        previous = ops.set_pdl(pdl)
        try:
            preact, postact, y, dpre, post2, gw1, gw2, dx = outs
            ops.gemm_act(x, w1.t(), "swiglu", out_preact=preact, out_postact=postact)
            ops.gemm(postact, w2.t(), out=y)
            ops.gemm_dact(dy, w2, preact, "swiglu", out_dpreact=dpre, out_postact=post2)
            ops.gemm(dy.t(), post2, out=gw2, accumulate=True)
            ops.gemm(dpre.t(), x, out=gw1, accumulate=True)
            ops.gemm(dpre, w1, out=dx)
        finally:
            ops.set_pdl(previous)

    def buffers():
        bf = dict(device="cuda", dtype=torch.bfloat16)
        return [torch.empty(T, 2 * h, **bf), torch.empty(T, h, **bf), torch.empty(T, d, **bf),
                torch.empty(T, 2 * h, **bf), torch.empty(T, h, **bf),
                torch.zeros(2 * h, d, device="cuda"), torch.zeros(d, h, device="cuda"), torch.empty(T, d, **bf)]

    want = buffers()
    chain(False, want)
    got = buffers()
    chain(True, got)  # loads the pdl kernels before the capture
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        assert torch.equal(a, b), "the pdl chain differs from the plain one"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for t in got[5:7]:
            t.zero_()
        chain(True, got)
    for i in range(5):
        for t in got:
            if t.dtype == torch.bfloat16:
                t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for name, a, b in zip(("preact", "postact", "y", "dpreact", "postact again", "dW1", "dW2", "dx"), got, want):
            assert torch.equal(a, b), f"replay {i}: {name} differs from the plain chain"


# ---- the layer --------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens,d,h,activation,backend", [
    (8192, 1024, 2816, "swiglu", "auto"), (1000, 1000, 1000, "swiglu", "cute"),
    (4096, 1024, 4096, "gelu_tanh_approx", "cute")])
@pytest.mark.parametrize("mode", ["default", "recompute", "main_grad"])
def test_the_layers_step_with_pdl_gives_the_bits_without(tokens, d, h, activation, backend, mode):
    """ParallelMLP's fwd+bwd with ops.set_pdl(True), its launch groups captured and replayed, gives
    the bits of the same steps without pdl (y, dx and both weight gradients, fresh or fp32
    main grads accumulated), and every kernel the rule picked ran with pdl."""
    from layer_steps import mlp_and_batch  # tests/: conftest puts it on sys.path
    from parallel_mlp.kernels import ops
    from parallel_mlp.launch_graphs import GRAPHS

    def steps(pdl):
        GRAPHS.clear()
        previous = ops.set_pdl(pdl)
        try:
            mlp, params, x, dy = mlp_and_batch(tokens, d, h, activation, backend, mode)
            for _ in range(6):  # plain, captured, then replayed
                for p in params + [x]:
                    p.grad = None
                y = mlp(x)
                y.backward(dy)
            torch.cuda.synchronize()
            grads = [x.grad] + [p.main_grad if mode == "main_grad" else p.grad for p in params]
            configs = [cfg for cfg, _ in ops._plans.values()]
            return y.detach().clone(), [t.clone() for t in grads], configs, dict(GRAPHS.stats)
        finally:
            ops.set_pdl(previous)
            GRAPHS.clear()

    y_off, grads_off, configs_off, _ = steps(False)
    y_on, grads_on, configs_on, stats = steps(True)
    assert configs_on and all(c.pdl for c in configs_on), [c.key for c in configs_on]
    assert not any(c.pdl for c in configs_off)
    assert stats.get("replays", 0) > 0 and not stats.get("capture failures"), stats
    assert torch.equal(y_on, y_off), "y differs with pdl"
    for name, a, b in zip(("dx", "dW1", "dW2"), grads_on, grads_off):
        assert torch.equal(a, b), f"{name} differs with pdl"
