"""What the cute ops say on a machine where they cannot run."""

import pytest
import torch

from parallel_mlp.kernels import ops


def marking_launch(launched: list):
    """A stand-in for ops._launch (inside stubbed_kernels) that records each launch's outputs as
    {"d" / "post" / "dpre": tensor} and, since the stub computes nothing, marks what the kernel
    would have stored: 1 in d and dpre, 2 in post."""
    launch = ops._launch

    def record(spec, a, bk, **kw):
        outs = {k: kw[k] for k in ("d", "post", "dpre") if kw.get(k) is not None}
        launched.append(outs)
        for name, t in outs.items():
            t.fill_(2.0 if name == "post" else 1.0)
        return launch(spec, a, bk, **kw)

    return record


def test_unsupported_reason_cpu_tensor():
    r = ops.unsupported_reason(torch.randn(8, 8, dtype=torch.bfloat16))
    assert r and "CUDA" in r


def test_unsupported_reason_dtype():
    r = ops.unsupported_reason(dtype=torch.float64)
    assert r and "float64" in r


def test_unsupported_reason_shape_alignment():
    r = ops.unsupported_reason((8, 7), dtype=torch.bfloat16)
    assert r and "16 bytes" in r


def test_unsupported_reason_fp32_inputs_only():
    # fp32 is accepted as an output dtype, never as the only operand dtype
    r = ops.unsupported_reason(torch.randn(8, 8), torch.randn(8, 8))
    assert r is not None


def test_stream_k_grid_larger_than_the_gpu_is_refused(monkeypatch):
    """A stream-K grid must fit the GPU at once (owners wait on later clusters): a config sized
    for 132 SMs on a 114-SM part is refused before anything launches."""
    import pytest

    from parallel_mlp.kernels.config import GemmConfig
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    monkeypatch.setattr(ops, "_num_sms", lambda index: 114)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    a = torch.empty(256, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="config.num_sms=132 with stream_k=True on a GPU with 114 SMs"):
        ops._launch(EpilogueSpec("store"), a, a.t(), d_dtype=torch.bfloat16, config=GemmConfig(stream_k=True))


def launch_without_a_gpu(monkeypatch, get_kernel, stream: int = 0) -> None:
    """Let ops._launch run on CPU tensors: kernels from ``get_kernel(key)``, an empty plan cache,
    the given stream handle, a CPU tensor's device index as the current one, 132 SMs."""
    from parallel_mlp.kernels import compile as kcompile

    monkeypatch.setattr(kcompile, "get_kernel", lambda key, use_disk=True: get_kernel(key))
    monkeypatch.setattr(ops, "_plans", {})
    monkeypatch.setattr(ops, "_stream_handle", lambda index: stream)
    monkeypatch.setattr(ops, "_current_device", lambda: None)  # a CPU tensor's index
    monkeypatch.setattr(ops, "_num_sms", lambda index: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_a_launch_of_a_shape_seen_before_reuses_its_plan(monkeypatch):
    """The config rule and the kernel table are consulted once per shape and layout; every
    launch still packs its own tensors' addresses. A caller's config bypasses the plans."""
    from parallel_mlp.kernels.config import GemmConfig
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    lookups, launches = [], []

    class Kernel:
        def run_compiled_program(self, args):  # the argument structs live for this call only
            launches.append(ctypes_first_pointer(args))

    def get_kernel(key):
        lookups.append(key)
        return Kernel()

    launch_without_a_gpu(monkeypatch, get_kernel)
    spec = EpilogueSpec("store")
    a, b, a2 = (torch.empty(256, 512, dtype=torch.bfloat16) for _ in range(3))
    d, d2 = (torch.empty(256, 256, dtype=torch.bfloat16) for _ in range(2))
    ops._launch(spec, a, b[:256].t(), d=d, d_dtype=torch.bfloat16)
    ops._launch(spec, a2, b[:256].t(), d=d2, d_dtype=torch.bfloat16)
    assert len(lookups) == 1 and len(launches) == 2
    assert launches == [a.data_ptr(), a2.data_ptr()]
    ops._launch(spec, a[:128], b[:256].t(), d=d[:128], d_dtype=torch.bfloat16)  # another M: a new plan
    assert len(lookups) == 2
    ops._launch(spec, a, b[:256].t(), d=d, d_dtype=torch.bfloat16, config=GemmConfig(128, 128))
    ops._launch(spec, a, b[:256].t(), d=d, d_dtype=torch.bfloat16, config=GemmConfig(128, 128))
    assert len(lookups) == 4 and lookups[-1].config == GemmConfig(128, 128)


def test_a_config_rewrite_reaches_launches_whose_plan_is_cached(monkeypatch):
    """bench configs times other configs than the rule's through ops.rewriting_configs: the
    rewritten config must be the one launched even where the rule's plan for that shape is
    cached, and the cache must hold the rule's plan again afterwards."""
    import dataclasses

    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    launched = []

    class Kernel:
        def __init__(self, key):
            self.key = key

        def run_compiled_program(self, args):
            launched.append(self.key.config)

    launch_without_a_gpu(monkeypatch, Kernel)
    spec = EpilogueSpec("store")
    a, b = torch.empty(256, 512, dtype=torch.bfloat16), torch.empty(256, 512, dtype=torch.bfloat16)
    d = torch.empty(256, 256, dtype=torch.bfloat16)
    ops._launch(spec, a, b.t(), d=d, d_dtype=torch.bfloat16)  # the rule's plan, now cached
    rule = launched[-1]
    with ops.rewriting_configs(lambda cfg: dataclasses.replace(cfg, tile_n=192)):
        ops._launch(spec, a, b.t(), d=d, d_dtype=torch.bfloat16)
    assert launched[-1] == dataclasses.replace(rule, tile_n=192) != rule
    ops._launch(spec, a, b.t(), d=d, d_dtype=torch.bfloat16)
    assert launched[-1] == rule


def ctypes_first_pointer(args):
    """The data pointer in a launch's first argument struct."""
    import ctypes

    return ctypes.c_uint64.from_address(args[0]).value


def test_transient_bytes_is_the_stream_k_workspace_of_the_default_config(monkeypatch):
    """What the backward orders dx and dW1 by: dx at T=1000, d=5120, h=10240 runs stream-K
    (28 of 132 clusters in its last wave, K = 10240) with a 16.5 MiB workspace; dW1 there
    (K = 1000) runs whole tiles and allocates nothing; the backends say the same."""
    from parallel_mlp.backends import CuteBackend, TorchBackend
    from parallel_mlp.kernels.config import default_config

    monkeypatch.setattr(ops, "_num_sms", lambda index: 132)
    ops._transient_bytes.cache_clear()
    dev = torch.device("cuda", 0)
    cfg = default_config(1000, 5120, 10240)
    assert cfg.stream_k
    assert ops.transient_bytes(1000, 5120, 10240, dev) == 4 * ops._stream_k_words(1000, 5120, 10240, cfg)[0]
    assert 16 * 2**20 < ops.transient_bytes(1000, 5120, 10240, dev) < 17 * 2**20
    assert ops.transient_bytes(10240, 5120, 1000, dev) == 0
    assert CuteBackend.transient_bytes(1000, 5120, 10240, dev) == ops.transient_bytes(1000, 5120, 10240, dev)
    assert TorchBackend.transient_bytes(1000, 5120, 10240, dev) == 0


def test_gemm_refuses_bad_operands_naming_the_rule():
    """ops check shapes and dtypes before anything else, on any device."""
    from parallel_mlp.kernels import ops

    a = torch.zeros(4, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"must be matrices; got \(2, 4, 8\) and \(8, 16\)"):
        ops.gemm(torch.zeros(2, 4, 8, dtype=torch.bfloat16), torch.zeros(8, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"a is \(4, 8\) and b is \(9, 16\): inner dims differ"):
        ops.gemm(a, torch.zeros(9, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="both be bfloat16 or both float16; got torch.bfloat16, torch.float16"):
        ops.gemm(a, torch.zeros(8, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match="got torch.float32, torch.float32"):
        ops.gemm(a.float(), torch.zeros(8, 16))


@pytest.mark.parametrize("n", [700, 300, 36])
def test_gemm_stores_rows_tma_cannot_address_through_padded_rows(monkeypatch, n):
    """A fresh [m, n] output whose rows are not a 16-byte multiple (n=700 bf16: 1400 bytes) is
    launched on rows padded to one and handed back contiguous; a misaligned out= the same way,
    through a fresh one. (Launched on the unpadded rows, the GPU stored wrong sums.) The
    kernels stubbed out: what is checked is what reaches the launch."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.bench.host_stub import stubbed_kernels

    launched = []
    a = torch.zeros(100, 4096, dtype=torch.bfloat16)
    b = torch.zeros(4096, n, dtype=torch.bfloat16).t().contiguous().t()  # its rows: K long
    with stubbed_kernels():
        monkeypatch.setattr(ops, "_launch", marking_launch(launched))
        got = ops.gemm(a, b, checked=True)
        out = torch.zeros(100, n, dtype=torch.bfloat16)
        same = ops.gemm(a, b, out=out, checked=True)
    assert got.shape == (100, n) and got.is_contiguous() and bool((got == 1).all())
    assert same is out and bool((out == 1).all())
    assert len(launched) == 2
    for outs in launched:
        d = outs["d"]
        assert (d.stride(0) * d.element_size()) % 16 == 0 and d.shape == (100, n)


@pytest.mark.parametrize("act,n", [("swiglu", 4200), ("swiglu", 20), ("relu", 12)])
def test_gemm_act_stores_rows_tma_cannot_address_through_padded_rows(monkeypatch, act, n):
    """gemm_act's own outputs (a gated postact of N / 2 = 2100 bf16: 4200 bytes a row) are
    launched on rows padded to 16 bytes and handed back contiguous, so the kernel runs at every
    shape (its preact then has a plain gemm's bits); a caller's misaligned out_postact gets the
    kernel's result copied in. The kernels stubbed out: what is checked is what reaches the
    launch."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.bench.host_stub import stubbed_kernels

    launched = []
    post_n = n // 2 if act == "swiglu" else n
    a = torch.zeros(100, 64, dtype=torch.bfloat16)
    b = torch.zeros(64, n, dtype=torch.bfloat16).t().contiguous().t()
    with stubbed_kernels():
        monkeypatch.setattr(ops, "_launch", marking_launch(launched))
        pre, post = ops.gemm_act(a, b, act, checked=True)
        none, post_only = ops.gemm_act(a, b, act, store_preact=False, checked=True)
        room = torch.zeros(100, post_n + 8, dtype=torch.bfloat16)
        into = room[:, 1:post_n + 1]  # data pointer 2 bytes past 16-byte alignment
        _, post_into = ops.gemm_act(a, b, act, out_postact=into, checked=True)
    assert pre.shape == (100, n) and pre.is_contiguous() and bool((pre == 1).all())
    assert post.shape == (100, post_n) and post.is_contiguous() and bool((post == 2).all())
    assert none is None and bool((post_only == 2).all())
    assert post_into.data_ptr() == into.data_ptr() and bool((into == 2).all())
    assert bool((room[:, 0] == 0).all()) and bool((room[:, post_n + 1:] == 0).all())
    assert len(launched) == 3
    for outs in launched:
        for t in outs.values():
            assert (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0


def test_caller_views_whose_rows_end_inside_a_16_byte_chunk_get_the_result_copied_in(monkeypatch):
    """TMA stores whole 16-byte chunks, so a launch into a caller's column view whose rows are not
    a whole number of them (37 bf16 columns of a 64-wide buffer, 6 fp32 columns of a 16-wide
    one, 37 rows of a column-major view) would overwrite the caller's next columns: gemm (store
    and accumulate) and gemm_act launch on rows made for it and copy (or add) the result into the
    view, and the buffer's other columns keep their values; a view of whole chunks (32 columns)
    still goes to the launch itself. The kernels stubbed out: what is checked is what reaches the
    launch."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.bench.host_stub import stubbed_kernels

    launched = []
    a = torch.zeros(40, 64, dtype=torch.bfloat16)

    def b(n):
        return torch.zeros(64, n, dtype=torch.bfloat16).t().contiguous().t()

    with stubbed_kernels():
        monkeypatch.setattr(ops, "_launch", marking_launch(launched))
        room = torch.full((40, 64), 7.0, dtype=torch.bfloat16)
        view = room[:, :37]
        assert ops.gemm(a, b(37), out=view, checked=True) is view
        assert bool((view == 1).all()) and bool((room[:, 37:] == 7).all())
        assert launched[-1]["d"].data_ptr() != room.data_ptr()

        room32 = torch.full((40, 16), 7.0)
        ops.gemm(a, b(6), out=room32[:, :6], accumulate=True, checked=True)
        assert bool((room32[:, :6] == 8).all()) and bool((room32[:, 6:] == 7).all())

        cols = torch.full((40, 64), 7.0, dtype=torch.bfloat16)
        col_major = cols[:, :37].t()  # 37 x 40, its columns 37 rows long
        ops.gemm(torch.zeros(37, 64, dtype=torch.bfloat16), b(40), out=col_major, checked=True)
        assert bool((cols[:, :37] == 1).all()) and bool((cols[:, 37:] == 7).all())

        pre_room = torch.full((40, 64), 7.0, dtype=torch.bfloat16)
        post_room = torch.full((40, 64), 7.0, dtype=torch.bfloat16)
        pre, post = ops.gemm_act(a, b(37), "relu", out_preact=pre_room[:, :37],
                                 out_postact=post_room[:, :37], checked=True)
        assert pre.data_ptr() == pre_room.data_ptr() and post.data_ptr() == post_room.data_ptr()
        assert bool((pre == 1).all()) and bool((post == 2).all())
        assert bool((pre_room[:, 37:] == 7).all()) and bool((post_room[:, 37:] == 7).all())
        assert launched[-1]["d"].data_ptr() != pre_room.data_ptr()
        assert launched[-1]["post"].data_ptr() != post_room.data_ptr()

        whole = torch.full((40, 64), 7.0, dtype=torch.bfloat16)
        ops.gemm(a, b(32), out=whole[:, :32], checked=True)
        assert launched[-1]["d"].data_ptr() == whole.data_ptr()  # whole chunks: the view itself
        assert bool((whole[:, :32] == 1).all()) and bool((whole[:, 32:] == 7).all())


def test_column_major_outputs_of_the_fused_ops_get_the_result_copied_in(monkeypatch):
    """The kernels write row-major outputs (their compiled key has no output layout), so a
    caller's column-major buffer for gemm_act's preact and postact or gemm_dact's dpreact and
    postact is never launched on: the kernel writes rows made for it and the result is copied
    in, every element of the caller's buffer set. The kernels stubbed out: what is checked is
    what reaches the launch."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.bench.host_stub import stubbed_kernels

    launched = []
    def column_major(rows, cols):
        return torch.zeros(cols, rows, dtype=torch.bfloat16).t()

    a = torch.zeros(40, 64, dtype=torch.bfloat16)
    b = torch.zeros(64, 32, dtype=torch.bfloat16).t().contiguous().t()
    dy, w2 = torch.zeros(40, 16, dtype=torch.bfloat16), torch.zeros(16, 32, dtype=torch.bfloat16)
    with stubbed_kernels():
        monkeypatch.setattr(ops, "_launch", marking_launch(launched))
        pre, post = column_major(40, 32), column_major(40, 32)
        got = ops.gemm_act(a, b, "relu", out_preact=pre, out_postact=post, checked=True)
        assert got[0] is pre and got[1] is post
        assert bool((pre == 1).all()) and bool((post == 2).all())
        dpre, post2 = column_major(40, 32), column_major(40, 32)
        preact = torch.zeros(40, 32, dtype=torch.bfloat16)
        got = ops.gemm_dact(dy, w2, preact, "relu", out_dpreact=dpre, out_postact=post2, checked=True)
        assert got[0] is dpre and got[1] is post2
        assert bool((dpre == 1).all()) and bool((post2 == 2).all())
    assert len(launched) == 2
    for outs in launched:
        for t in outs.values():
            assert ops._major(t) == "row"
            assert t.data_ptr() not in (pre.data_ptr(), post.data_ptr(), dpre.data_ptr(), post2.data_ptr())


def test_gemm_act_checks_its_buffers_before_anything_runs(monkeypatch):
    """A caller's buffer of the wrong shape is refused, naming it, before any launch."""
    monkeypatch.setattr(ops, "_launch", lambda *a, **k: pytest.fail("launched"))
    a = torch.zeros(100, 64, dtype=torch.bfloat16)
    b = torch.zeros(64, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"out_postact is \(100, 32\).*expected \(100, 16\)"):
        ops.gemm_act(a, b, "swiglu", out_postact=torch.empty(100, 32, dtype=torch.bfloat16), checked=True)
    with pytest.raises(ValueError, match=r"out_preact is \(100, 16\).*expected \(100, 32\)"):
        ops.gemm_act(a, b, "swiglu", out_preact=torch.empty(100, 16, dtype=torch.bfloat16), checked=True)


def _argument_bytes(addresses, tensors):
    """The bytes of each packed argument: a matrix's 24, a vector's 12, the stream's 8."""
    import ctypes

    sizes = [24 if t.dim() == 2 else 12 for t in tensors if t is not None] + [8]
    return [ctypes.string_at(x, n) for x, n in zip(addresses, sizes)]


@pytest.mark.parametrize("a_layout,b_layout", [("row", "row"), ("row", "col"), ("col", "row"),
                                               ("col", "col"), ("one row", "row"),
                                               ("row", "one column")])
@pytest.mark.parametrize("epilogue", ["store", "act with bias", "gated dact"])
def test_a_launch_packs_b_as_the_kernels_transposed_view(a_layout, b_layout, epilogue, monkeypatch):
    """_launch takes b as [K, N] and packs the struct of bk = b.T from b's own sizes and strides,
    without making the view: the bytes must be those _launch_args packs from the view itself
    (the layout the DSL's adapters are checked against in test_launch_args), for row- and
    column-major operands, a single row or column, and each epilogue's argument list; and the
    plan is the one the view would have keyed."""
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    m, k, n = (1 if a_layout == "one row" else 48), 64, (1 if b_layout == "one column" else 80)

    def matrix(rows, cols, layout):
        return torch.randn(cols, rows).t() if layout == "col" else torch.randn(rows, cols)

    a = matrix(m, k, a_layout).bfloat16()
    b = matrix(k, n, b_layout).bfloat16()
    out = torch.empty(m, n, dtype=torch.bfloat16)
    extra = {"store": dict(d=out),
             "act with bias": dict(d=out, post=torch.empty(m, n, dtype=torch.bfloat16),
                                   bias=torch.randn(n).bfloat16()),
             "gated dact": dict(post=out, prein=torch.empty(m, 2 * n, dtype=torch.bfloat16),
                                dpre=torch.empty(m, 2 * n, dtype=torch.bfloat16))}[epilogue]
    spec = {"store": EpilogueSpec("store"), "act with bias": EpilogueSpec("act", "gelu_tanh_approx", True),
            "gated dact": EpilogueSpec("dact", "swiglu")}[epilogue]
    packed, keys = [], []

    class Kernel:
        def run_compiled_program(self, args):
            tensors = (a, b.t(), extra.get("d"), extra.get("post"), extra.get("prein"),
                       extra.get("dpre"), extra.get("bias"))
            packed.append(_argument_bytes(args, tensors))

    def get_kernel(key):
        keys.append(key)
        return Kernel()

    launch_without_a_gpu(monkeypatch, get_kernel, stream=0x1234)
    ops._launch(spec, a, b, d_dtype=torch.bfloat16, **extra)
    ops._launch(spec, a, b, d_dtype=torch.bfloat16, **extra)  # from the plan cache
    view_args, keep = ops._launch_args((a, b.t(), extra.get("d"), extra.get("post"), extra.get("prein"),
                                        extra.get("dpre"), extra.get("bias")), 0x1234)
    expected = _argument_bytes(view_args, (a, b.t(), extra.get("d"), extra.get("post"),
                                           extra.get("prein"), extra.get("dpre"), extra.get("bias")))
    assert packed == [expected, expected]
    assert len(keys) == 1
    assert (keys[0].a_major, keys[0].b_major) == (ops._major(a), ops._major(b.t()))


def test_caller_outputs_laid_out_as_fresh_ones_go_straight_to_the_launch():
    """gemm's out (bf16 stores and fp32 accumulation), gemm_act's and gemm_dact's buffers that
    are what fresh outputs would be (whole tensors, or blocks of their rows, as the layer's launch
    groups and the overlap's row blocks hand in) reach the launch themselves, without the
    per-buffer checks; a buffer of another layout still takes the checked path. The kernels
    stubbed out: what is checked is what reaches the launch."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    from parallel_mlp.bench.host_stub import stubbed_kernels

    launched = []
    launch = ops._launch

    def record(spec, a, bk, **kw):
        launched.append({k: v for k, v in kw.items() if k in ("d", "post", "dpre")})
        return launch(spec, a, bk, **kw)

    def refuse(*args, **kw):
        raise AssertionError("a plainly laid out buffer was checked")

    a = torch.zeros(100, 64, dtype=torch.bfloat16)
    b = torch.zeros(64, 32, dtype=torch.bfloat16).t().contiguous().t()
    dy = torch.zeros(100, 16, dtype=torch.bfloat16)
    w2 = torch.zeros(16, 16, dtype=torch.bfloat16)
    # Patched inside the stubs' context, undone before it ends: stubbed_kernels patches
    # _tensor_reason itself and puts back what it found.
    with stubbed_kernels(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops, "_launch", record)
        mp.setattr(ops, "_tensor_reason", refuse)
        mp.setattr(ops, "_output", refuse)
        out = torch.empty(100, 32, dtype=torch.bfloat16)
        assert ops.gemm(a, b, out=out, checked=True) is out
        grad = torch.zeros(100, 32)
        assert ops.gemm(a, b, out=grad, accumulate=True, checked=True) is grad
        rows = torch.empty(300, 32, dtype=torch.bfloat16)[100:200]  # a block of rows
        assert ops.gemm(a, b, out=rows, checked=True) is rows
        pre, post = torch.empty(100, 32, dtype=torch.bfloat16), torch.empty(100, 16, dtype=torch.bfloat16)
        assert ops.gemm_act(a, b, "swiglu", out_preact=pre, out_postact=post, checked=True) == (pre, post)
        assert ops.gemm_act(a, b, "swiglu", store_preact=False, out_postact=post,
                            checked=True) == (None, post)
        dpre, post2 = torch.empty(100, 32, dtype=torch.bfloat16), torch.empty(100, 16, dtype=torch.bfloat16)
        got = ops.gemm_dact(dy, w2, pre, "swiglu", out_dpreact=dpre, out_postact=post2, checked=True)
        assert got[0] is dpre and got[1] is post2
    assert [e.get("d") is out for e in launched[:1]] == [True]
    assert launched[1]["d"] is grad and launched[2]["d"] is rows
    assert launched[3]["d"] is pre and launched[3]["post"] is post
    assert launched[4]["d"] is None and launched[4]["post"] is post
    assert launched[5]["dpre"] is dpre and launched[5]["post"] is post2

    # Another layout (a column-major out, a view whose pointer is off 16 bytes): checked.
    checked = []
    with stubbed_kernels(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops, "_tensor_reason", lambda t, name: checked.append(name))
        ops.gemm(a, b, out=torch.empty(32, 100, dtype=torch.bfloat16).t(), checked=True)
        room = torch.empty(100, 48, dtype=torch.bfloat16)
        ops.gemm_act(a, b, "swiglu", store_preact=False, out_postact=room[:, 1:17], checked=True)
    assert len(checked) >= 2
    assert ops._tensor_reason(torch.empty(2, 8), "t") is not None  # the real check is back
