"""The op interface on the torch backend, and backend selection."""

import logging

import pytest
import torch

import reference
from parallel_mlp import backends
from parallel_mlp.backends import TorchBackend, resolve

M, K, N = 37, 29, 22  # nothing tile-aligned


def test_gemm_plain_out_dtype_and_out():
    a, b = torch.randn(M, K), torch.randn(N, K).t()  # b as a transposed weight view
    torch.testing.assert_close(TorchBackend.gemm(a, b), a @ b)
    assert TorchBackend.gemm(a.bfloat16(), b.bfloat16(), out_dtype=torch.float32).dtype == torch.float32
    out = torch.empty(M, N)
    assert TorchBackend.gemm(a, b, out=out) is out
    torch.testing.assert_close(out, a @ b)


def test_gemm_accumulates_bf16_products_in_fp32():
    a = torch.randn(K, M, dtype=torch.bfloat16).t()
    b = torch.randn(K, N, dtype=torch.bfloat16)
    main_grad = torch.randn(M, N)
    want = main_grad.double() + a.double() @ b.double()
    got = TorchBackend.gemm(a, b, out=main_grad, accumulate=True)
    assert got is main_grad
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_fp32_addmm_is_only_taken_where_it_was_checked():
    """The one-addmm main-grad path is a CUDA path (cuBLAS with an fp32 output); on the CPU the
    probe says no and accumulation goes through the fp32 product (the test above)."""
    assert backends.fp32_addmm_works(torch.device("cpu"), torch.bfloat16) is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemm_accumulates_in_place_on_cuda(dtype):
    """On CUDA, with or without the fp32-output addmm, out += a @ b in fp32, in place, for the
    wgrad layout (a a transposed view), and an odd shape."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(1001, 515, device="cuda", generator=g).to(dtype).t()
    b = torch.randn(1001, 77, device="cuda", generator=g).to(dtype)
    main_grad = torch.randn(515, 77, device="cuda", generator=g)
    want = main_grad.double() + a.double() @ b.double()
    got = TorchBackend.gemm(a, b, out=main_grad, accumulate=True)
    assert got is main_grad and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    print("fp32 addmm path:", backends.fp32_addmm_works(main_grad.device, dtype))


def test_gemm_accumulate_needs_out():
    with pytest.raises(ValueError, match="accumulate=True"):
        TorchBackend.gemm(torch.randn(2, 2), torch.randn(2, 2), accumulate=True)


@pytest.mark.parametrize("name", reference.NAMES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm_act_and_dact(name, with_bias):
    F = 2 * N if reference.is_gated(name) else N
    a = torch.randn(M, K, dtype=torch.float64)
    b = torch.randn(F, K, dtype=torch.float64).t()
    bias = torch.randn(F, dtype=torch.float64) if with_bias else None
    preact, postact = TorchBackend.gemm_act(a, b, name, bias=bias)
    want_pre = a @ b + (bias if with_bias else 0)
    torch.testing.assert_close(preact, want_pre)
    torch.testing.assert_close(postact, reference.act(name, want_pre))
    none, post2 = TorchBackend.gemm_act(a, b, name, bias=bias, store_preact=False)
    assert none is None and torch.equal(post2, postact)

    # dact: dpostact = dy @ W2 with W2 [d_out, h]
    h = postact.shape[1]
    dy, w2 = torch.randn(M, 9, dtype=torch.float64), torch.randn(9, h, dtype=torch.float64)
    pre = want_pre.clone().requires_grad_()
    reference.act(name, pre).backward(dy @ w2)
    dpreact, post = TorchBackend.gemm_dact(dy, w2, want_pre, name)
    torch.testing.assert_close(dpreact, pre.grad)
    torch.testing.assert_close(post, reference.act(name, want_pre))


def test_cute_backend_on_cpu_raises_with_the_reason():
    with pytest.raises(ValueError, match=r"backend='cute' cannot run here: a cpu tensor"):
        resolve("cute", torch.randn(2, 2))


def test_auto_falls_back_to_torch_and_says_why_once(caplog):
    backends._warned.clear()
    with caplog.at_level(logging.DEBUG, logger="parallel_mlp.backends"):
        assert resolve("auto", torch.randn(2, 2)) is TorchBackend
        assert resolve("auto", torch.randn(2, 2)) is TorchBackend
    msgs = [r.getMessage() for r in caplog.records if "falls back" in r.getMessage()]
    assert len(msgs) == 1 and "cpu tensor" in msgs[0]


def test_torch_backend_is_always_torch():
    assert resolve("torch", torch.randn(2, 2)) is TorchBackend


def test_unknown_backend_name():
    with pytest.raises(ValueError, match=r"backend='triton' is not known"):
        backends.check_backend_name("triton")


@pytest.mark.parametrize("name", ["swiglu", "relu_sq"])
def test_row_chunking_gives_the_same_bits(name, monkeypatch):
    """The torch backend works through the activation a block of rows at a time; the blocks
    (here several, with a ragged last one) must not change a single bit."""
    F = 2 * N if reference.is_gated(name) else N
    a, b = torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, F, dtype=torch.bfloat16)
    dy, w2 = torch.randn(M, 9, dtype=torch.bfloat16), torch.randn(9, F // (2 if F != N else 1), dtype=torch.bfloat16)
    whole = TorchBackend.gemm_act(a, b, name), TorchBackend.gemm_dact(dy, w2, a @ b, name)
    monkeypatch.setattr(backends, "_CHUNK_ELEMENTS", 5 * F)  # 5 rows a block: 37 = 7*5 + 2
    chunked = TorchBackend.gemm_act(a, b, name), TorchBackend.gemm_dact(dy, w2, a @ b, name)
    for got, want in zip(sum(chunked, ()), sum(whole, ())):
        assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["swiglu", "gelu_tanh_approx"])
def test_activation_is_fused_on_cuda_by_default(name, monkeypatch):
    """On CUDA the torch backend evaluates the activation as one compiled kernel (fused_act):
    within a bf16 unit of the unfused formulas, with the backward's recomputed postact equal
    to the forward's to the bit; a tail shape."""
    from parallel_mlp import fused_act

    monkeypatch.delenv(fused_act.ENV, raising=False)
    monkeypatch.setattr(fused_act, "_compiled", {})
    F = 2 * 136 if reference.is_gated(name) else 136
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(1000, 72, device="cuda", generator=g).bfloat16()
    w1 = torch.randn(72, F, device="cuda", generator=g).bfloat16()
    dy = torch.randn(1000, 40, device="cuda", generator=g).bfloat16()
    w2 = torch.randn(40, 136, device="cuda", generator=g).bfloat16()
    pre, post = TorchBackend.gemm_act(a, w1, name)
    dpre, post_again = TorchBackend.gemm_dact(dy, w2, pre, name)
    assert fused_act._compiled.get((name, "forward")) is not None
    assert fused_act._compiled.get((name, "backward")) is not None
    assert torch.equal(post_again, post)
    monkeypatch.setenv(fused_act.ENV, "0")
    _, want_post = TorchBackend.gemm_act(a, w1, name)
    want_dpre, _ = TorchBackend.gemm_dact(dy, w2, pre, name)
    for got, want in ((post, want_post), (dpre, want_dpre)):
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-4)


def test_ops_write_into_given_row_blocks_and_refuse_misfits():
    """The overlap's output buffers: gemm_act and gemm_dact fill row views of larger tensors with
    what they would return; a buffer of the wrong shape or dtype is refused by name."""
    a = torch.randn(M, K, dtype=torch.float64)
    b = torch.randn(2 * N, K, dtype=torch.float64).t()
    pre, post = TorchBackend.gemm_act(a, b, "swiglu")
    big_pre, big_post = torch.zeros(2 * M, 2 * N, dtype=torch.float64), torch.zeros(2 * M, N, dtype=torch.float64)
    got = TorchBackend.gemm_act(a, b, "swiglu", out_preact=big_pre[M:], out_postact=big_post[M:])
    assert got[0].data_ptr() == big_pre[M:].data_ptr() and torch.equal(big_pre[M:], pre)
    assert torch.equal(big_post[M:], post) and not big_post[:M].any()
    dy, w2 = torch.randn(M, 9, dtype=torch.float64), torch.randn(9, N, dtype=torch.float64)
    dpre, post2 = TorchBackend.gemm_dact(dy, w2, pre, "swiglu")
    out_dpre = torch.empty_like(dpre)
    TorchBackend.gemm_dact(dy, w2, pre, "swiglu", out_dpreact=out_dpre)
    assert torch.equal(out_dpre, dpre)
    with pytest.raises(ValueError, match="output buffer is"):
        TorchBackend.gemm_act(a, b, "swiglu", out_postact=torch.empty(M, N + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="output buffer is"):
        TorchBackend.gemm_dact(dy, w2, pre, "swiglu", out_postact=torch.empty(M, N))


@pytest.mark.parametrize("m,n,k,num_sms,on_cublas", [
    (1000, 4096, 11008, 132, True),    # 8 x 32 = 256 tiles, 90 GFLOP: T=1000's fc2
    (1000, 5120, 10240, 132, True),    # 320 tiles
    (2048, 704, 65536, 132, True),     # 96 tiles: T=65536's dW2 at h=704
    (129, 165 * 128, 2 ** 20, 132, True),   # a row tail counts a whole row of tiles: 2 x 165 = 330
    (129, 166 * 128, 2 ** 20, 132, False),  # 332
    (4096, 1376, 8192, 132, False),    # 32 x 11 = 352 tiles
    (8192, 1024, 2816, 132, False),
    (2048, 2048, 5632, 132, False),    # 256 tiles but 47 GFLOP: T=2048's dx stays on ours
    (512, 1024, 2816, 132, False),     # 3 GFLOP
    (128, 256, 2 ** 21, 1, True), (256, 256, 2 ** 21, 1, False),
    (2 ** 20, 1, 2 ** 20, 0, False),   # no SMs (not a CUDA device): never
])
def test_cublas_runs_long_plain_gemms_of_at_most_two_and_a_half_waves(m, n, k, num_sms, on_cublas):
    assert backends.cublas_runs(m, n, k, num_sms) is on_cublas


class _FakeKernels:
    """Stands in for kernels.ops: records each call, computes with torch."""

    def __init__(self):
        self.calls = []

    def gemm(self, a, b, out=None, out_dtype=None, accumulate=False, whole_rows=None,
             checked=False):
        self.calls.append(("gemm", a.shape[0], whole_rows, accumulate))
        result = (a.float() @ b.float())
        if accumulate:
            return out.add_(result.to(out.dtype))
        dtype = out_dtype or (out.dtype if out is not None else a.dtype)
        return result.to(dtype) if out is None else out.copy_(result)

    def transient_bytes(self, m, n, k, device):
        return 12345


@pytest.fixture
def auto_on_one_sm(monkeypatch):
    """AutoBackend on CPU tensors as if on a GPU of one SM (cuBLAS up to 2 tiles of 128x128,
    at any FLOP), its CuTe kernels faked."""
    fake = _FakeKernels()
    monkeypatch.setattr(backends.CuteBackend, "_module", fake)
    monkeypatch.setattr(backends, "_sm_count", lambda device: 1)
    monkeypatch.setattr(backends, "CUBLAS_MIN_FLOP", 0)
    return fake


def test_auto_runs_small_plain_gemms_on_cublas_and_the_rest_on_ours(auto_on_one_sm):
    fake, auto = auto_on_one_sm, backends.AutoBackend
    bf = torch.bfloat16
    a, b = torch.randn(100, 64, dtype=bf), torch.randn(64, 256, dtype=bf)   # 1 x 2 tiles
    assert torch.equal(auto.gemm(a, b), torch.mm(a, b)) and fake.calls == []
    out = torch.empty(100, 256, dtype=bf)
    assert auto.gemm(a, b, out=out) is out and torch.equal(out, torch.mm(a, b))
    assert fake.calls == []
    big = torch.randn(300, 64, dtype=bf)                                      # 3 x 2 tiles
    auto.gemm(big, b)
    assert fake.calls == [("gemm", 300, None, False)]
    # a block of rows goes where its whole GEMM goes
    fake.calls.clear()
    auto.gemm(a, b, whole_rows=300)
    assert fake.calls == [("gemm", 100, 300, False)]
    # recompute's replay of fc1 runs gemm_act's kernel, for its bits
    fake.calls.clear()
    auto.gemm(a, b, replay=True)
    # an output dtype other than the operands' (one rounding of the fp32 sum on ours)
    auto.gemm(a, b, out_dtype=torch.float32)
    # a 16-bit gradient accumulated in place
    auto.gemm(a, b, out=torch.zeros(100, 256, dtype=bf), accumulate=True)
    assert len(fake.calls) == 3 and all(c[1] == 100 for c in fake.calls)


def test_auto_accumulates_into_fp32_on_cublas_where_its_addmm_works(auto_on_one_sm, monkeypatch):
    fake, auto = auto_on_one_sm, backends.AutoBackend
    a, b = torch.randn(100, 64, dtype=torch.bfloat16), torch.randn(64, 256, dtype=torch.bfloat16)
    main_grad = torch.randn(100, 256)
    want = main_grad + a.float() @ b.float()
    on_cublas = []
    monkeypatch.setattr(backends, "_accumulate_fp32",
                        lambda a, b, out: on_cublas.append(1) or out.add_(a.float() @ b.float()))
    monkeypatch.setattr(backends, "fp32_addmm_works", lambda device, dtype: False)
    auto.gemm(a, b, out=main_grad.clone(), accumulate=True)
    assert on_cublas == [] and len(fake.calls) == 1
    monkeypatch.setattr(backends, "fp32_addmm_works", lambda device, dtype: True)
    got = auto.gemm(a, b, out=main_grad.clone(), accumulate=True)
    assert on_cublas == [1] and len(fake.calls) == 1
    torch.testing.assert_close(got, want)


def test_on_cublas_says_where_gemm_with_out_goes(auto_on_one_sm):
    """on_cublas (what the launch groups ask, so that they never capture a cuBLAS call) agrees
    with where gemm(a, b, out=...) runs; the cute backend never says cuBLAS."""
    fake, auto = auto_on_one_sm, backends.AutoBackend
    bf = torch.bfloat16
    b = torch.randn(64, 256, dtype=bf)
    for rows, out_dtype, accumulate in ((100, bf, False), (300, bf, False), (100, torch.float32, False),
                                        (100, bf, True)):
        a, out = torch.randn(rows, 64, dtype=bf), torch.zeros(rows, 256, dtype=out_dtype)
        before = len(fake.calls)
        auto.gemm(a, b, out=out, accumulate=accumulate)
        ran_on_cublas = len(fake.calls) == before
        assert auto.on_cublas(a, b, out, accumulate) is ran_on_cublas, (rows, out_dtype, accumulate)
        assert backends.CuteBackend.on_cublas(a, b, out, accumulate) is False
    assert [c[1] for c in fake.calls] == [300, 100, 100]  # only the first went to cuBLAS


def test_auto_transient_bytes_are_none_on_cublas(auto_on_one_sm):
    dev = torch.device("cpu")
    assert backends.AutoBackend.transient_bytes(100, 256, 4096, dev) == 0
    assert backends.AutoBackend.transient_bytes(300, 256, 4096, dev) == 12345


def test_auto_resolves_to_the_auto_backend_where_cute_applies(monkeypatch):
    monkeypatch.setattr(backends.CuteBackend, "unsupported_reason", classmethod(lambda cls, *t: None))
    t = torch.randn(2, 2)
    assert resolve("auto", t) is backends.AutoBackend
    assert resolve("cute", t) is backends.CuteBackend


class _FakeKernelsWithActs(_FakeKernels):
    """The fake kernels with the fused ops, computed by the torch backend."""

    def gemm_act(self, a, b, activation, bias=None, store_preact=True, out_preact=None,
                 out_postact=None, whole_rows=None, checked=False):
        self.calls.append(("gemm_act", a.shape[0], whole_rows, False))
        return TorchBackend.gemm_act(a, b, activation, bias=bias, store_preact=store_preact,
                                     out_preact=out_preact, out_postact=out_postact)

    def gemm_dact(self, a, b, preact, activation, out_dpreact=None, out_postact=None,
                  whole_rows=None, checked=False):
        self.calls.append(("gemm_dact", a.shape[0], whole_rows, False))
        return TorchBackend.gemm_dact(a, b, preact, activation, out_dpreact=out_dpreact,
                                      out_postact=out_postact)


def _auto_step_beside_torch(recompute: bool) -> list:
    """One fwd+bwd of a small swiglu layer on auto and the same on the torch backend: the pairs
    (ours, want) of dx, dW1 and dW2."""
    from parallel_mlp import ParallelMLP

    torch.manual_seed(0)
    mlp = ParallelMLP(16, 32, activation="swiglu", recompute=recompute, backend="auto",
                      dtype=torch.bfloat16)
    ref = ParallelMLP(16, 32, activation="swiglu", backend="torch", dtype=torch.bfloat16)
    ref.load_state_dict(mlp.state_dict())
    x = torch.randn(9, 16, dtype=torch.bfloat16)
    dy = torch.randn(9, 16, dtype=torch.bfloat16)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    mlp(x1).backward(dy)
    ref(x2).backward(dy)
    return [(x1.grad, x2.grad), (mlp.fc1.weight.grad, ref.fc1.weight.grad),
            (mlp.fc2.weight.grad, ref.fc2.weight.grad)]


@pytest.mark.parametrize("recompute", [False, True])
def test_the_layer_on_auto_sends_only_its_plain_gemms_to_cublas(recompute, monkeypatch):
    """With every plain GEMM small enough for cuBLAS, the fused ops and recompute's replay of
    fc1 still run our kernels (the replay must give gemm_act's bits); gradients as the torch
    backend's."""
    fake = _FakeKernelsWithActs()
    monkeypatch.setattr(backends.CuteBackend, "_module", fake)
    monkeypatch.setattr(backends.CuteBackend, "unsupported_reason", classmethod(lambda cls, *t: None))
    monkeypatch.setattr(backends, "_sm_count", lambda device: 10_000)
    monkeypatch.setattr(backends, "CUBLAS_MIN_FLOP", 0)
    mm = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b, **kw: mm.append(a.shape) or real_mm(a, b, **kw))
    grads = _auto_step_beside_torch(recompute)
    kinds = [c[0] for c in fake.calls]
    assert kinds == ["gemm_act"] + (["gemm"] if recompute else []) + ["gemm_dact"]
    assert len(mm) == 4  # fc2, dW2, dx, dW1
    for ours, want in grads:
        torch.testing.assert_close(ours, want)


def test_auto_accumulate_without_out_says_so(auto_on_one_sm, monkeypatch):
    """A GEMM cuBLAS would take, asked to accumulate with no buffer: the kernels' clear error."""
    from parallel_mlp.kernels import ops

    monkeypatch.setattr(backends.CuteBackend, "_module", ops)
    a, b = torch.randn(100, 64, dtype=torch.bfloat16), torch.randn(64, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="accumulate=True needs out="):
        backends.AutoBackend.gemm(a, b, accumulate=True)


def test_sm_count_is_the_kernels_count_on_cuda_and_none_elsewhere(monkeypatch):
    from parallel_mlp.kernels import ops

    monkeypatch.setattr(backends.CuteBackend, "_module", ops)
    monkeypatch.setattr(ops, "_num_sms", lambda index: 114 + index)
    assert backends._sm_count(torch.device("cuda", 1)) == 115
    assert backends._sm_count(torch.device("cpu")) == 0


@pytest.mark.parametrize("gated", [False, True])
def test_for_step_takes_the_cute_backend_exactly_where_auto_would_send_no_gemm_to_cublas(
        gated, monkeypatch):
    """for_step's one question per step agrees with AutoBackend's question per GEMM: CuteBackend
    exactly where none of the step's plain GEMMs (fc2, dx, dW2, dW1) would go to cuBLAS, across
    a floor that fc1's and fc2's sizes cross at different row counts."""
    monkeypatch.setattr(backends, "_sm_count", lambda device: 10_000)
    monkeypatch.setattr(backends, "CUBLAS_MIN_FLOP", 2 * 20 * 16 * 16)
    auto, bf = backends.AutoBackend, torch.bfloat16
    d_in, hidden, d_out = 16, 8, 12
    features = 2 * hidden if gated else hidden
    w1, w2 = torch.empty(features, d_in, dtype=bf), torch.empty(d_out, hidden, dtype=bf)
    seen = set()
    for rows in range(1, 80):
        x, dy = torch.empty(rows, d_in, dtype=bf), torch.empty(rows, d_out, dtype=bf)
        postact, dpreact = torch.empty(rows, hidden, dtype=bf), torch.empty(rows, features, dtype=bf)
        gemms = [(postact, w2.t(), torch.empty(rows, d_out, dtype=bf)),        # fc2
                 (dpreact, w1, torch.empty(rows, d_in, dtype=bf)),             # dx
                 (dy.t(), postact, torch.empty(d_out, hidden, dtype=bf)),      # dW2
                 (dpreact.t(), x, torch.empty(features, d_in, dtype=bf))]      # dW1
        any_on_cublas = any(auto.on_cublas(a, b, out) for a, b, out in gemms)
        chosen = backends.for_step(auto, rows, w1.shape, w2.shape)
        assert chosen is (auto if any_on_cublas else backends.CuteBackend), rows
        seen.add(chosen)
    assert seen == {auto, backends.CuteBackend}  # the floor was crossed
    for other in (backends.CuteBackend, TorchBackend):
        assert backends.for_step(other, 1, w1.shape, w2.shape) is other


@pytest.mark.parametrize("recompute", [False, True])
def test_a_step_below_the_floor_asks_no_gemm_whether_it_goes_to_cublas(recompute, monkeypatch):
    """The layer on auto, every plain GEMM below CUBLAS_MIN_FLOP: all six (seven with recompute's
    replay) run our kernels, and no GEMM asks AutoBackend's per-GEMM question (for_step answered
    it for the step); gradients as the torch backend's."""
    fake = _FakeKernelsWithActs()
    monkeypatch.setattr(backends.CuteBackend, "_module", fake)
    monkeypatch.setattr(backends.CuteBackend, "unsupported_reason", classmethod(lambda cls, *t: None))
    monkeypatch.setattr(backends, "_sm_count", lambda device: 10_000)
    asked = []
    on_cublas = backends.AutoBackend._on_cublas.__func__
    monkeypatch.setattr(backends.AutoBackend, "_on_cublas", classmethod(
        lambda cls, *args: asked.append(1) or on_cublas(cls, *args)))
    grads = _auto_step_beside_torch(recompute)
    kinds = [c[0] for c in fake.calls]
    assert kinds.count("gemm_act") == 1 and kinds.count("gemm_dact") == 1
    assert kinds.count("gemm") == 4 + recompute  # fc2, dW2, dW1, dx (and fc1's replay)
    assert asked == []
    for ours, want in grads:
        torch.testing.assert_close(ours, want)
