"""ops' launch arguments (CPU): the C structs ops builds for a compiled kernel's launcher must be
byte for byte what the DSL itself builds (generate_execution_args) from the same tensors
converted by from_dlpack + mark_layout_dynamic, for every kind of argument list the ops pass:
row- and column-major operands, padded leading strides, absent (None) channels, a bias, a
double-width preact / dpreact pair, a dynamic scheduler's tile counter. Equal bytes mean the
GPU sees the same call."""

import ctypes

import pytest
import torch

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")


def matrix(rows, cols, major="row", pad=0, dtype=torch.bfloat16):
    """(rows, cols), row- or column-major, with `pad` extra elements per leading stride."""
    if major == "row":
        return torch.randn(rows, cols + pad).to(dtype)[:, :cols]
    return torch.randn(cols, rows + pad).to(dtype)[:, :rows].t()


def dsl_argument_bytes(fn, tensors, stream_handle):
    """What the DSL's own argument path passes: from_dlpack + mark_layout_dynamic (ops._to_cute)."""
    import cuda.bindings.driver as cuda

    from parallel_mlp.kernels import ops

    cute_tensors = [ops._to_cute(t) for t in tensors]
    exe_args, adapted = fn.generate_execution_args(*cute_tensors, cuda.CUstream(stream_handle))
    return exe_args, (cute_tensors, adapted)  # the structs live inside these: keep them alive


def struct_size(t):
    return 8 if t is None else (12 if t.dim() == 1 else 24)  # stream handle: 8 bytes


CASES = [
    # (epilogue kind args, config kwargs, tensors builder)
    ("store", {}, lambda: (matrix(300, 200), matrix(136, 200, "col", pad=8), matrix(300, 136), None, None, None, None, None)),
    ("store_colA", {}, lambda: (matrix(300, 200, "col", pad=24), matrix(136, 200, pad=16), matrix(300, 136, dtype=torch.float32), None, None, None, None, None)),
    ("act_bias", {}, lambda: (matrix(300, 200), matrix(272, 200), matrix(300, 272), matrix(300, 136), None, None, torch.randn(272).to(torch.bfloat16), None)),
    ("dact_gated", {}, lambda: (matrix(300, 200), matrix(136, 200, "col"), None, matrix(300, 136), matrix(300, 272), matrix(300, 272), None, None)),
    ("store_m1", {}, lambda: (matrix(1, 200, "col"), matrix(8, 200), matrix(1, 8), None, None, None, None, None)),
    ("accumulate_dynamic", {"scheduler": "dynamic"}, lambda: (matrix(300, 200, "col"), matrix(136, 200, "col"), matrix(300, 136, dtype=torch.float32), None, None, None, None, torch.zeros(1, dtype=torch.int32))),
]


def key_for(name, cfg_kwargs, tensors):
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.compile import KernelKey
    from parallel_mlp.kernels.config import GemmConfig
    from parallel_mlp.kernels.epilogue_spec import EpilogueSpec

    spec = {
        "store": EpilogueSpec("store"), "store_colA": EpilogueSpec("store"), "store_m1": EpilogueSpec("store"),
        "act_bias": EpilogueSpec("act", "swiglu", True, True),
        "dact_gated": EpilogueSpec("dact", "swiglu"),
        "accumulate_dynamic": EpilogueSpec("accumulate"),
    }[name]
    a, bk, d, post, prein, dpre, bias, _ = tensors
    names = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
    d_dtype = (d if d is not None else dpre).dtype
    return KernelKey(spec, GemmConfig(128, 128, **cfg_kwargs), "bfloat16", ops._major(a), ops._major(bk),
                     names[d_dtype], names[bias.dtype] if bias is not None else None)


@pytest.mark.parametrize("name,cfg_kwargs,build", CASES, ids=[c[0] for c in CASES])
def test_launch_args_equal_the_dsl_arguments(name, cfg_kwargs, build, monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from parallel_mlp.kernels import ops
    from parallel_mlp.kernels.compile import compile_kernel

    tensors = build()
    fn = compile_kernel(key_for(name, cfg_kwargs, tensors))
    stream = 0x1234_5678
    ours, keep = ops._launch_args(tensors, stream)
    theirs, keep2 = dsl_argument_bytes(fn, tensors, stream)
    present = [t for t in tensors if t is not None] + [None]
    assert len(ours) == len(theirs) == len(present)
    for i, (x, y, t) in enumerate(zip(ours, theirs, present)):
        n = struct_size(t)
        assert ctypes.string_at(x, n) == ctypes.string_at(y, n), f"{name}: argument {i} differs"


def test_each_thread_reuses_its_own_argument_buffer():
    """Launches are synchronous on the host, so a thread packs every launch of an argument count
    into one buffer; another thread never shares it."""
    import threading

    from parallel_mlp.kernels import ops

    a, b = torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(8, 16, dtype=torch.bfloat16)
    first, _ = ops._launch_args((a, None, b), 7)
    first = list(first)
    again, keep = ops._launch_args((b, a), 9)
    assert again == first  # same count, same slots
    assert ctypes.string_at(again[0], 8) == b.data_ptr().to_bytes(8, "little")
    assert ctypes.string_at(again[1], 8) == a.data_ptr().to_bytes(8, "little")
    assert ctypes.string_at(again[2], 8) == (9).to_bytes(8, "little")
    other = []
    worker = threading.Thread(target=lambda: other.append(list(ops._launch_args((a, b), 7)[0])))
    worker.start()
    worker.join()
    assert not set(other[0]) & set(first)
