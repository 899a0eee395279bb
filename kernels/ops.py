"""The `cute` backend's ops (DESIGN.md's op interface) on CUDA tensors.

    gemm(a, b, out=None, out_dtype=None, accumulate=False) -> out        out (+)= a @ b
    gemm_act(a, b, activation, bias=None, store_preact=True) -> (preact | None, postact)
    gemm_dact(a, b, preact, activation) -> (dpreact, postact)            dpostact = a @ b
    unsupported_reason(*tensors, dtype=None, device=None) -> str | None

a is [M, K] and b is [K, N], each row- or column-major (b is usually a transposed weight view);
no operand is copied. Gated activations: b is [K, 2h] with interleaved (gate, up) columns,
postact is [M, h]; in gemm_dact, b is [K, h], preact and dpreact are [M, 2h] interleaved.
Every op also takes keyword-only `config=` (a GemmConfig) and `tuned=` (time candidates once per
shape, remember the choice on disk).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import importlib.util
import os
import struct
import threading
from typing import Optional

import torch

from parallel_mlp.activations import get_activation

from .config import GemmConfig, default_config
from .epilogue_spec import EpilogueSpec

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


# ---- can the cute path run these inputs? --------------------------------------------------------


@functools.lru_cache(maxsize=None)  # checked on every launch; an import's outcome does not change
def _dsl_import_error() -> Optional[str]:
    if importlib.util.find_spec("cutlass") is None:
        return "the CuTe DSL (nvidia-cutlass-dsl) is not installed"
    from . import aot_runtime

    if aot_runtime.available():
        # Cached kernels launch through the DSL's C runtime without importing the DSL (a new
        # process then starts ~0.5 s sooner); a kernel that must be compiled imports it then.
        return None
    try:
        import cutlass  # noqa: F401
        import cutlass.cute  # noqa: F401

        from . import gemm_sm90  # noqa: F401
    except Exception as e:  # ImportError, or a DSL that fails to initialise
        return f"the CuTe DSL (nvidia-cutlass-dsl) is not importable: {type(e).__name__}: {e}"
    return None


@functools.lru_cache(maxsize=None)
def _device_reason(index: int) -> Optional[str]:
    cap = torch.cuda.get_device_capability(index)
    if cap != (9, 0):
        return f"the CuTe kernels need an sm_90 GPU (H100/H200); cuda:{index} is sm_{cap[0]}{cap[1]}"
    return None


def _tensor_reason(t: torch.Tensor, name: str) -> Optional[str]:
    if t.device.type != "cuda":
        return f"{name} is on {t.device}, not CUDA"
    if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"{name} has dtype {t.dtype}; the CuTe kernels take bfloat16/float16 (fp32 only for outputs)"
    if t.dim() not in (1, 2):
        return f"{name} has {t.dim()} dims; the CuTe ops take matrices (and 1-D biases)"
    es = t.element_size()
    if t.dim() == 2:
        if t.stride(1) != 1 and t.stride(0) != 1:
            return f"{name} has strides {tuple(t.stride())}: neither dim is contiguous"
        ld = t.stride(0) if _major(t) == "row" else t.stride(1)
        if (ld * es) % 16 != 0:
            return f"{name} has strides {tuple(t.stride())}: the leading stride is not a multiple of 16 bytes"
        if t.data_ptr() % 16 != 0:
            return f"{name}'s data pointer is not 16-byte aligned"
    return None


def unsupported_reason(*tensors, dtype=None, device=None) -> Optional[str]:
    """None if the CuTe path can run on these inputs, else a short reason.

    Arguments may be tensors (checked for device, dtype, rank, strides and alignment) or shapes
    (checked for a 16-byte-aligned contiguous last dim at `dtype`); `dtype` and `device` are
    checked when given.
    """
    if dtype is not None and dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {dtype} is not bfloat16/float16"
    devs = [torch.device(device)] if device is not None else []
    halves = set()
    for i, t in enumerate(tensors):
        if t is None:
            continue
        if isinstance(t, torch.Tensor):
            # This runs on every call of the layer: the message (and its shape) only on failure.
            if _tensor_reason(t, "") is not None:
                return _tensor_reason(t, f"tensor {i} {tuple(t.shape)}")
            devs.append(t.device)
            if t.dtype != torch.float32:
                halves.add(t.dtype)
        else:  # a shape
            shape = tuple(t)
            es = (dtype or torch.bfloat16).itemsize
            if shape and (shape[-1] * es) % 16 != 0:
                return f"shape {shape}: the last dim is not a multiple of 16 bytes"
    if len(halves) > 1:
        return f"mixed input dtypes {sorted(map(str, halves))}"
    if not halves and any(isinstance(t, torch.Tensor) for t in tensors):
        return "no bfloat16/float16 operand: the CuTe kernels take 16-bit inputs (fp32 only as an output)"
    for d in devs:
        if d.type != "cuda":
            return f"device {d} is not CUDA"
    if devs or dtype is not None:
        if not devs and not torch.cuda.is_available():  # a CUDA tensor implies CUDA is there
            return "CUDA is not available"
        idx = devs[0].index if devs and devs[0].index is not None else torch.cuda.current_device()
        r = _device_reason(idx)
        if r:
            return r
    return _dsl_import_error()


def _check(*tensors):
    r = unsupported_reason(*tensors)
    if r:
        raise ValueError(f"backend='cute' cannot run this: {r}")


# ---- launching ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _row_major(rows: int, cols: int, s0: int, s1: int) -> bool:
    """Whether a [rows, cols] matrix with strides (s0, s1) is row-major: its last dim contiguous
    (a single column counts as column-major unless it is also a single row)."""
    return s1 == 1 and (cols > 1 or s0 != 1 or rows == 1)


def _major(t: torch.Tensor) -> str:
    """'row' if the last dim is contiguous, else 'col' (_row_major's rule)."""
    rows, cols = t.shape
    s0, s1 = t.stride()
    return "row" if _row_major(rows, cols, s0, s1) else "col"


def _to_cute(t: Optional[torch.Tensor]):
    """The DSL's own argument path (a cute tensor with a dynamic layout). `_launch` does not
    use it (see _launch_args); it is the reference the packed structs' bytes are tested against."""
    if t is None:
        return None
    from cutlass.cute.runtime import from_dlpack

    if t.dim() == 1:
        return from_dlpack(t.detach(), assumed_align=t.element_size()).mark_layout_dynamic(leading_dim=0)
    lead = 1 if _major(t) == "row" else 0
    return from_dlpack(t.detach(), assumed_align=16).mark_layout_dynamic(leading_dim=lead)


def _stream():
    import cuda.bindings.driver as cuda

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


# The raw handle of the current stream of a device: torch's own C entry point, which inductor's
# generated code calls for every kernel, where torch.cuda.current_stream() builds a Stream object
# (~8 us a launch on an H200 host, 2026-12-01).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream_handle(index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


# The compiled launcher reads each tensor argument as a small C struct: its data pointer, its
# dynamic sizes and its one dynamic (leading) stride; a 1-D tensor (bias, tile counter) as its
# pointer and size. Building these directly costs a few microseconds, where from_dlpack(...)
# .mark_layout_dynamic(...) plus the DSL's argument adapters cost ~45 us per launch (H200 host,
# 2026-11-30, `python -m parallel_mlp.bench host`). tests/kernels/test_launch_args.py checks that
# the bytes equal what the DSL's own generate_execution_args builds from the _to_cute tensors.
_MATRIX = struct.Struct("<QiiQ")  # data pointer, 2 dynamic sizes (int32), leading stride: 24 bytes
_VECTOR = struct.Struct("<Qi")    # data pointer, size: 12 bytes in a 16-byte slot
_POINTER = struct.Struct("<Q")    # the CUstream handle
_SLOT = 24


# Each thread packs its launches' arguments into one buffer per argument count, made once: a
# launch is synchronous on the host (the launcher has copied the structs into the kernel's
# parameters when it returns), so the next launch may overwrite them. A fresh buffer and address
# list per launch cost ~1 us of a small GEMM's ~10 (CPU machine, 2026-12-01).
_arg_buffers = threading.local()


def _arg_buffer(n: int):
    """This thread's (buffer, slot addresses) for n argument slots."""
    buffers = _arg_buffers.__dict__
    entry = buffers.get(n)
    if entry is None:
        buf = ctypes.create_string_buffer(_SLOT * n)
        base = ctypes.addressof(buf)
        entry = buffers[n] = (buf, [base + i * _SLOT for i in range(n)])
    return entry


def _launch_args(tensors, stream_handle: int):
    """(addresses, keep-alive) of the launcher's arguments: one struct per tensor that is not
    None, in order, then the CUstream handle, packed into this thread's buffer for that many
    arguments. Keep the second item alive until the call returns; the next launch on this thread
    reuses the buffer, so read the addresses before it."""
    # None arguments are compile-time absent
    buf, addresses = _arg_buffer(1 + sum(t is not None for t in tensors))
    _pack_tensors(buf, 0, tensors, stream_handle)
    return addresses, buf


def _pack_tensors(buf, offset: int, tensors, stream_handle: int) -> None:
    """Pack the tensors that are not None from ``offset`` on, one slot each, then the stream."""
    for t in tensors:
        if t is None:
            continue
        if t.dim() == 1:
            _VECTOR.pack_into(buf, offset, t.data_ptr(), t.shape[0])
        else:
            (rows, cols), (s0, s1) = t.shape, t.stride()
            # the leading (non-unit) stride of the major _major(t) names, as _to_cute marks it
            _MATRIX.pack_into(buf, offset, t.data_ptr(), rows, cols,
                              s0 if _row_major(rows, cols, s0, s1) else s1)
        offset += _SLOT
    _POINTER.pack_into(buf, offset, stream_handle)


# Where this thread's launches take their transient device workspace (the tile counter, stream-K's
# partial sums and flags): None for fresh blocks of the caching allocator, else a function
# (words, device) -> int32 tensor that workspace_from installs.
_workspace_source = threading.local()


@contextlib.contextmanager
def workspace_from(take):
    """Launches in this thread take their workspace from ``take(words, device)`` (an int32 tensor
    of ``words`` elements, its contents undefined) for the length of the context instead of
    allocating it. launch_graphs captures under it, so that a captured group allocates nothing:
    an allocation during a capture goes to whichever pool routes this thread's allocations
    (``torch.cuda.use_mem_pool`` wins over the graph's own pool), and such a pool would hand the
    block to another tensor while the graph still writes it at every replay."""
    previous = getattr(_workspace_source, "take", None)
    _workspace_source.take = take
    try:
        yield
    finally:
        _workspace_source.take = previous


def _workspace(words: int, device: torch.device):
    """The installed source's workspace (see workspace_from), or None: allocate one."""
    take = getattr(_workspace_source, "take", None)
    return None if take is None else take(words, device)


def _tile_counter(device: torch.device) -> torch.Tensor:
    """A zeroed int32 tile counter for one launch of a dynamic-scheduler kernel.

    The kernel needs its counter at 0 when it starts (and leaves it at the number of claims it
    made). A fresh `torch.zeros(1)` per launch, on the launch stream, is the simplest race-free
    choice: the caching allocator hands the block out again only in stream order (after this
    kernel) and to no other stream meanwhile, so launches from two streams, two threads, or two
    CUDA graphs (captured as a memset node + the kernel, the counter held by the graph's pool)
    never share a live counter. A shared counter reset with `zero_()` would need all three of
    those cases locked or separated. The cost is the memset launch a reset would cost anyway.
    """
    counter = _workspace(1, device)
    if counter is None:
        return torch.zeros(1, dtype=torch.int32, device=device)
    return counter.zero_()


def _stream_k_words(m: int, n: int, k: int, cfg) -> tuple[int, int]:
    """(int32 words of a stream-K launch's workspace, how many of them are flags to zero)."""
    from .config import TILE_K, cluster_waves
    from .tile_scheduler import stream_k_flag_words, stream_k_grid, stream_k_workspace_words

    cs = cfg.cluster_m * cfg.cluster_n
    waves, rem, full = cluster_waves(cfg, m, n)
    clusters = waves * full + rem
    grid = stream_k_grid(clusters, -(-k // TILE_K), full)  # the launch's, as the kernel picks it
    words = stream_k_workspace_words(clusters, grid, cs, cfg.tile_m * cfg.tile_n)
    return words, min(words, max(1, stream_k_flag_words(clusters % grid, cs)))


def _stream_k_workspace(m: int, n: int, k: int, cfg, device: torch.device) -> torch.Tensor:
    """The int32 workspace of one stream-K launch (tile_scheduler, "Stream-K"): its flags zeroed,
    its partial-sum slots left as they are (each is written before it is read). Fresh per launch
    for the reasons _tile_counter gives."""
    words, flags = _stream_k_words(m, n, k, cfg)
    ws = _workspace(words, device)
    if ws is None:
        ws = torch.empty(words, dtype=torch.int32, device=device)
    ws[:flags].zero_()
    return ws


def transient_bytes(m: int, n: int, k: int, device: torch.device) -> int:
    """Device memory a plain or accumulating GEMM of this shape allocates for the length of its
    launch under the default config: a stream-K workspace, else nothing. The layer orders its
    backward's GEMMs by it, so that the larger workspace is gone before the other's output is
    made."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _transient_bytes(m, n, k, index)


@functools.lru_cache(maxsize=4096)  # asked twice per backward; a pure function of its arguments
def _transient_bytes(m: int, n: int, k: int, index: int) -> int:
    cfg = default_config(m, n, k, _num_sms(index), "store")
    return 4 * _stream_k_words(m, n, k, cfg)[0] if cfg.stream_k else 0


@functools.lru_cache(maxsize=4096)  # on every launch of the overlap's blocks, like default_config
def _block_config(whole_rows: int, n: int, k: int, num_sms: int, kind: str) -> GemmConfig:
    """The config of a block of rows of a larger GEMM (the tensor-parallel overlap runs a GEMM
    block by block): the whole GEMM's tile, cluster and schedule, so every output element is
    accumulated as the whole GEMM would. Not its stream-K split, which is sized for the whole
    grid."""
    return dataclasses.replace(default_config(whole_rows, n, k, num_sms, kind), stream_k=False)


def _pick_config(spec, a, bk, d_dtype, config, tuned, whole_rows=None):
    m, k = a.shape
    n = bk.shape[0]
    dev = a.device.index if a.device.index is not None else torch.cuda.current_device()
    if config is not None:
        return config
    if whole_rows is not None and whole_rows != m:  # a block that is the whole GEMM is just it
        return _block_config(whole_rows, n, k, _num_sms(dev), spec.kind)
    if tuned:
        from .tuning import tuned_config

        return tuned_config(spec, a, bk, d_dtype, _num_sms(dev))
    return default_config(m, n, k, _num_sms(dev), spec.kind)


# A function that rewrites the config of every launch made without config= or tuned=True, or
# None (normal use). The kernel developer's benchmark sets it to time configs other than the
# rule's (bench configs --also / --sweep) through the ops' own paths; while it is set, launches
# bypass the plan cache, whose plans are the rule's.
_config_rewrite = None


@contextlib.contextmanager
def rewriting_configs(rewrite):
    """Within this context, launches without config= or tuned=True run ``rewrite(cfg)`` instead of
    the rule's cfg (a block of the overlap's row-blocked GEMMs included)."""
    global _config_rewrite
    previous, _config_rewrite = _config_rewrite, rewrite
    try:
        yield
    finally:
        _config_rewrite = previous


# Whether the configs the rule picks (default_config, a row block's, tuned=True's) launch with
# programmatic dependent launch (GemmConfig.pdl). PARALLEL_MLP_PDL=1 in the environment turns it
# on; set_pdl switches it in a running process.
PDL_ENV = "PARALLEL_MLP_PDL"


def pdl_by_env() -> bool:
    """PARALLEL_MLP_PDL: "1" on, "0" (or unset) off; anything else is refused, as the other
    PARALLEL_MLP_ switches refuse theirs."""
    value = os.environ.get(PDL_ENV, "0").strip() or "0"
    if value not in ("0", "1"):
        raise ValueError(f"{PDL_ENV}={value!r}: must be 0 or 1")
    return value == "1"


_pdl = pdl_by_env()


def set_pdl(on: bool) -> bool:
    """Launch the rule's kernels with programmatic dependent launch (GemmConfig.pdl) from now on,
    or not; returns the previous setting. A launch with config= runs its config as given. Launch
    groups captured before (parallel_mlp.launch_graphs) replay the launches they captured: the
    same kernels, the same bits, launched as they were."""
    global _pdl
    if not isinstance(on, bool):
        raise ValueError(f"set_pdl(on={on!r}): must be True or False")
    previous, _pdl = _pdl, on
    if on != previous:
        _plans.clear()  # their configs carry the previous setting
    return previous


def pdl_launches() -> bool:
    """Whether the rule's kernels launch with programmatic dependent launch (set_pdl)."""
    return _pdl


@functools.lru_cache(maxsize=None)
def _with_pdl(cfg: GemmConfig) -> GemmConfig:
    return dataclasses.replace(cfg, pdl=True)


def _plan(spec: EpilogueSpec, a, bk, d_dtype, bias, config, tuned, whole_rows):
    """(config, compiled kernel) of a launch: the config rule (or the caller's config), checked
    against the device, and the kernel it names, compiled or loaded on first use."""
    from .compile import KernelKey, get_kernel

    cfg = _pick_config(spec, a, bk, d_dtype, config, tuned, whole_rows)
    if config is None and _pdl:
        cfg = _with_pdl(cfg)
    if config is None and not tuned and _config_rewrite is not None:
        cfg = _config_rewrite(cfg)
    if cfg.stream_k:
        dev = a.device.index if a.device.index is not None else torch.cuda.current_device()
        if cfg.num_sms > _num_sms(dev):
            # A tile's owner spins until the later clusters' pieces arrive: all of them must be
            # able to run at once, which a grid sized for more SMs than the GPU has cannot promise.
            raise ValueError(
                f"config.num_sms={cfg.num_sms} with stream_k=True on a GPU with {_num_sms(dev)} SMs: "
                "stream-K needs num_sms <= the device's SM count"
            )
    key = KernelKey(
        spec, cfg, _DTYPE_NAMES[a.dtype], _major(a), _major(bk), _DTYPE_NAMES[d_dtype],
        _DTYPE_NAMES[bias.dtype] if bias is not None else None,
    )
    return cfg, get_kernel(key)


# The plan of every default-config launch, by what decides it, so that a launch of a shape seen
# before skips the config rule, the KernelKey and the kernel table (a few microseconds of a
# small GEMM's host time, on every one of a step's six launches). Cleared when it gets large
# (e.g. many sequence lengths): a plan is cheap to make again.
_plans: dict = {}
_MAX_PLANS = 4096

# The current device's index, without torch.cuda.current_device()'s lazy-init check (the tensors
# being launched on prove CUDA is initialised).
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _launch(spec: EpilogueSpec, a, b, d=None, post=None, prein=None, dpre=None, bias=None, *, d_dtype, config=None, tuned=False, whole_rows=None):
    """Run the kernel D/epilogue(a @ b) with b [K, N] (the kernel reads it as bk = b.T, [N, K]).

    A launch of a plan seen before reads each operand's shape and strides once and packs bk's
    struct from b's (its sizes and strides swapped), so no transposed view is made: a view costs
    ~2 us of host time, a share of a host-bound step's six launches."""
    index = a.device.index
    (m, k), (a_s0, a_s1) = a.shape, a.stride()
    n, (b_s0, b_s1) = b.shape[1], b.stride()
    a_row = _row_major(m, k, a_s0, a_s1)
    bk_row = _row_major(n, k, b_s1, b_s0)
    if config is None and not tuned and _config_rewrite is None:
        plan_key = (spec, m, n, k, a.dtype, a_row, bk_row, d_dtype,
                    None if bias is None else bias.dtype, index, whole_rows)
        plan = _plans.get(plan_key)
        if plan is None:
            plan = _plan(spec, a, b.t(), d_dtype, bias, None, False, whole_rows)
            if len(_plans) >= _MAX_PLANS:
                _plans.clear()
            _plans[plan_key] = plan
        cfg, fn = plan
    else:
        cfg, fn = _plan(spec, a, b.t(), d_dtype, bias, config, tuned, whole_rows)
    counter = None
    if cfg.scheduler == "dynamic":
        counter = _tile_counter(a.device)
    elif cfg.stream_k:
        counter = _stream_k_workspace(m, n, k, cfg, a.device)
    buf, args = _arg_buffer(3 + (d is not None) + (post is not None) + (prein is not None)
                            + (dpre is not None) + (bias is not None) + (counter is not None))
    _MATRIX.pack_into(buf, 0, a.data_ptr(), m, k, a_s0 if a_row else a_s1)
    _MATRIX.pack_into(buf, _SLOT, b.data_ptr(), n, k, b_s1 if bk_row else b_s0)
    _pack_tensors(buf, 2 * _SLOT, (d, post, prein, dpre, bias, counter), _stream_handle(index))
    if _current_device() == index:
        fn.run_compiled_program(args)
    else:  # the launch goes to the current device's context
        with torch.cuda.device(index):
            fn.run_compiled_program(args)
    del buf


# One EpilogueSpec per variant, made once: a spec is built and validated on every launch otherwise.
_spec = functools.lru_cache(maxsize=None)(EpilogueSpec)


def _output(out, shape, a, name):
    """A new [shape] tensor like a, or `out` after checking it fits."""
    if out is None:
        return torch.empty(shape, dtype=a.dtype, device=a.device)
    if tuple(out.shape) != tuple(shape) or out.dtype != a.dtype or out.device != a.device:
        raise ValueError(f"{name} is {tuple(out.shape)} {out.dtype} on {out.device}, expected "
                         f"{tuple(shape)} {a.dtype} on {a.device}")
    return out


def _plain_rows(t: torch.Tensor, m: int, n: int, dtype: torch.dtype, device) -> bool:
    """Whether a caller's output is what a fresh one would be: [m, n] of ``dtype`` on
    ``device``, rows of n elements one after another (a whole tensor or a block of its rows),
    16-byte multiples starting at a 16-byte aligned address. Such a buffer goes straight to the
    launch, past _output's and _tensor_reason's checks (what the layer's launch groups and the
    tensor-parallel overlap's row blocks hand in)."""
    return (t.stride() == (n, 1) and t.shape == (m, n) and t.dtype == dtype
            and (n * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
            and t.device == device)


def _storable(m: int, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """An [m, n] output whose rows TMA can store: contiguous where n's rows are 16-byte
    multiples, else a view of rows padded to one. (Launched on unpadded rows, N=700 in bf16:
    1400 bytes, stream-K and whole tiles alike stored wrong sums; H200, 2026-12-02, 300 x 700 x
    40000 and 100 x 300 x 40000.)"""
    if (n * dtype.itemsize) % 16 == 0:  # _aligned's rule, without its generator
        return torch.empty(m, n, dtype=dtype, device=device)
    per = 16 // dtype.itemsize
    return torch.empty(m, -(-n // per) * per, dtype=dtype, device=device)[:, :n]


def _store_overruns(t: torch.Tensor) -> bool:
    """Whether the kernel's TMA stores into t, a caller's matrix, could write past its last
    column (its last row, column-major). TMA clips a store at the tensor's bounds in whole
    16-byte chunks of the global address, not element by element: an inner extent that is not a
    multiple of 16 bytes is written up to the next boundary. On an H200 a 1000 x 1001 bf16 act
    into column views of 1024-wide buffers zeroed the buffers' columns 1001-1007 (2026-12-05);
    our own outputs pad their rows (_storable), so that is their padding, but in a caller's
    column view it is the caller's data."""
    inner = t.shape[1] if _major(t) == "row" else t.shape[0]
    return (inner * t.element_size()) % 16 != 0


def _kernel_cannot_store(t: torch.Tensor) -> bool:
    """Whether the epilogue's TMA stores cannot write a caller's output in place: an address or
    stride TMA cannot take (_tensor_reason), rows that end inside a 16-byte chunk
    (_store_overruns), or a column-major layout (the kernels write row-major outputs; gemm
    alone turns a column-major out into a row-major problem by swapping its operands)."""
    return _tensor_reason(t, "out") is not None or _major(t) != "row" or _store_overruns(t)


def _aligned(*widths_and_sizes) -> bool:
    """Row strides (in elements, with their element sizes) that TMA can address: 16-byte multiples."""
    return all((w * es) % 16 == 0 for w, es in widths_and_sizes)


def _shapes(a, b):
    """(M, K, N) of a @ b, after checking that they are matrices of one 16-bit dtype with matching
    inner dims. On every launch: shapes unpacked once, dtypes compared by identity."""
    try:
        (m, k), (kb, n) = a.shape, b.shape
    except ValueError:
        raise ValueError(f"a and b must be matrices; got {tuple(a.shape)} and {tuple(b.shape)}") from None
    if k != kb:
        raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: inner dims differ")
    dtype = a.dtype
    if dtype is not b.dtype or (dtype is not torch.bfloat16 and dtype is not torch.float16):
        raise ValueError(f"a and b must both be bfloat16 or both float16; got {a.dtype}, {b.dtype}")
    return m, k, n


# ---- the ops -----------------------------------------------------------------------------------


def gemm(a, b, out=None, out_dtype=None, accumulate=False, *, config: Optional[GemmConfig] = None, tuned=False,
         whole_rows: Optional[int] = None, checked: bool = False):
    """out (+)= a @ b. `accumulate=True` adds into `out` (fp32: a TMA reduce-add, out is not read
    back through registers); an `out` TMA cannot store to in place (a misaligned view, rows ending
    inside a 16-byte chunk) gets the result copied or added in. `whole_rows`: a is a block of rows
    of an a with that many rows; the kernel is chosen as for the whole GEMM. `checked`: the caller has already checked that the
    cute path can run a and b (unsupported_reason), as the layer does once per call."""
    m, k, n = _shapes(a, b)
    if not checked:
        _check(a, b)
    if accumulate and out is None:
        raise ValueError("accumulate=True needs out=")
    fresh = out is None
    if fresh:
        dtype = out_dtype or a.dtype
        if m and n and k and (n * dtype.itemsize) % 16 == 0:
            # The common case, straight to the launch: a fresh row-major output whose rows TMA
            # can store (what the checks below would find, in a fraction of their host time).
            out = torch.empty(m, n, dtype=dtype, device=a.device)
            _launch(_spec("store"), a, b, d=out, d_dtype=dtype, config=config, tuned=tuned,
                    whole_rows=whole_rows)
            return out
        # Rows padded for TMA (their padding takes what a store writes past n): computed
        # there, handed back contiguous.
        out = _storable(m, n, dtype, a.device)
        if m and n and k:
            _launch(_spec("store"), a, b, d=out, d_dtype=dtype, config=config, tuned=tuned,
                    whole_rows=whole_rows)
        elif m and n:  # k == 0: a @ b is zeros
            out.zero_()
        return out.contiguous()
    if (m and n and k and out.dtype in _DTYPE_NAMES
          and (not accumulate or out.dtype == torch.float32)
          and _plain_rows(out, m, n, out.dtype, a.device)):
        # A caller's buffer laid out as a fresh one would be: straight to the launch.
        _launch(_spec("accumulate" if accumulate else "store"), a, b, d=out, d_dtype=out.dtype,
                config=config, tuned=tuned, whole_rows=whole_rows)
        return out
    if tuple(out.shape) != (m, n):
        raise ValueError(f"out is {tuple(out.shape)}, expected {(m, n)}")
    if accumulate and out.dtype != torch.float32:
        # No reduce-add for 16-bit D here: compute in fp32 and add, which rounds once.
        out.add_(gemm(a, b, out_dtype=torch.float32, config=config, tuned=tuned, whole_rows=whole_rows,
                      checked=True))
        return out
    if m == 0 or n == 0:
        return out
    if k == 0:
        if not accumulate:
            out.zero_()
        return out
    if _tensor_reason(out, "out") is not None or _store_overruns(out):
        # An out view TMA cannot address (misaligned stride or pointer), or whose neighbours a
        # store would overwrite (rows not a whole number of 16-byte chunks): compute into a
        # fresh output, then copy or add.
        r = gemm(a, b, out_dtype=torch.float32 if accumulate else out.dtype, config=config,
                 tuned=tuned, whole_rows=whole_rows, checked=True)
        out.add_(r) if accumulate else out.copy_(r)
        return out
    spec = _spec("accumulate" if accumulate else "store")
    if _major(out) == "row":
        _launch(spec, a, b, d=out, d_dtype=out.dtype, config=config, tuned=tuned, whole_rows=whole_rows)
    else:
        # Column-major out: out.T = b.T @ a.T is a row-major problem with the operands swapped
        # (its rows are b's columns, so a block of a's rows says nothing about them).
        _launch(spec, b.t(), a.t(), d=out.t(), d_dtype=out.dtype, config=config, tuned=tuned)
    return out


def gemm_act(a, b, activation, bias=None, store_preact=True, *, config: Optional[GemmConfig] = None, tuned=False,
             out_preact=None, out_postact=None, whole_rows: Optional[int] = None, checked: bool = False):
    """preact = a @ b (+ bias), postact = act(preact). Returns (preact or None, postact).
    `out_preact` / `out_postact`: write into these (e.g. row blocks of larger tensors); one the
    kernel cannot store to in place (_kernel_cannot_store) gets its result copied in."""
    act = get_activation(activation)
    m, k, n = _shapes(a, b)
    if not checked:
        _check(a, b, bias)
    if act.gated and n % 2:
        raise ValueError(f"gated activation {act.name}: b has an odd number of columns ({n})")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias is {tuple(bias.shape)}, expected {(n,)}")
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()  # the epilogue indexes bias with unit stride
    post_n = n // 2 if act.gated else n
    es = a.element_size()
    if (out_preact is None and out_postact is None and m and n and k
            and (n * es) % 16 == 0 and (post_n * es) % 16 == 0):
        # The common case, straight to the launch: fresh outputs whose rows TMA can store (what
        # the paths below would make, in a fraction of their host time).
        preact = torch.empty(m, n, dtype=a.dtype, device=a.device) if store_preact else None
        postact = torch.empty(m, post_n, dtype=a.dtype, device=a.device)
        _launch(_spec("act", act.name, bias is not None, store_preact), a, b, d=preact,
                post=postact, bias=bias, d_dtype=a.dtype, config=config, tuned=tuned,
                whole_rows=whole_rows)
        return preact, postact
    if (out_postact is not None and (out_preact is not None or not store_preact)
            and m and n and k and (n * es) % 16 == 0 and (post_n * es) % 16 == 0
            and _plain_rows(out_postact, m, post_n, a.dtype, a.device)
            and (not store_preact or _plain_rows(out_preact, m, n, a.dtype, a.device))):
        # The caller's buffers, laid out as fresh ones would be: straight to the launch.
        preact = out_preact if store_preact else None
        _launch(_spec("act", act.name, bias is not None, store_preact), a, b, d=preact,
                post=out_postact, bias=bias, d_dtype=a.dtype, config=config, tuned=tuned,
                whole_rows=whole_rows)
        return preact, out_postact
    # The caller's buffers are checked before anything runs; rows made here are padded where TMA
    # needs it (a gated N that is not a multiple of 16, say), as gemm's are, so the kernel runs
    # at every shape: preact then has the bits a plain gemm of the same shape gives, which
    # recompute's replay relies on. Padded rows are handed back contiguous.
    preact = _output(out_preact, (m, n), a, "out_preact") if store_preact and out_preact is not None else None
    postact = _output(out_postact, (m, post_n), a, "out_postact") if out_postact is not None else None
    if m == 0 or n == 0 or k == 0:
        preact = _output(preact, (m, n), a, "out_preact") if store_preact else None
        postact = _output(postact, (m, post_n), a, "out_postact")
        if m and n:  # k == 0: act of (bias or 0), not worth a kernel
            z = torch.zeros(m, n, dtype=torch.float32, device=a.device) + (0 if bias is None else bias.float())
            if preact is not None:
                preact.copy_(z)
            postact.copy_(act.forward(z))
        return preact, postact
    if any(t is not None and _kernel_cannot_store(t) for t in (preact, postact)):
        # A caller's buffer the kernel cannot store to in place: the kernel into rows made
        # here, then a copy.
        pre, post = gemm_act(a, b, activation, bias, store_preact, config=config, tuned=tuned,
                             whole_rows=whole_rows, checked=True)
        if postact is None:
            postact = post
        else:
            postact.copy_(post)
        if preact is None:
            return pre, postact
        return preact.copy_(pre), postact
    made_pre = store_preact and preact is None
    if made_pre:
        preact = _storable(m, n, a.dtype, a.device)
    made_post = postact is None
    if made_post:
        postact = _storable(m, post_n, a.dtype, a.device)
    spec = _spec("act", act.name, bias is not None, store_preact)
    _launch(spec, a, b, d=preact, post=postact, bias=bias, d_dtype=a.dtype, config=config, tuned=tuned,
            whole_rows=whole_rows)
    if made_pre and not preact.is_contiguous():
        preact = preact.contiguous()
    if made_post and not postact.is_contiguous():
        postact = postact.contiguous()
    return preact, postact


def gemm_dact(a, b, preact, activation, *, config: Optional[GemmConfig] = None, tuned=False,
              out_dpreact=None, out_postact=None, whole_rows: Optional[int] = None, checked: bool = False):
    """dpostact = a @ b; returns (dpreact = act'(preact) * dpostact, postact = act(preact)).
    `out_dpreact` / `out_postact`: write into these (e.g. row blocks of larger tensors); one the
    kernel cannot store to in place (_kernel_cannot_store) gets its result copied in."""
    act = get_activation(activation)
    m, k, n = _shapes(a, b)
    width = 2 * n if act.gated else n
    if tuple(preact.shape) != (m, width):
        raise ValueError(f"preact is {tuple(preact.shape)}, expected {(m, width)} for {act.name}")
    if preact.dtype != a.dtype:
        raise ValueError(f"preact has dtype {preact.dtype}, a has {a.dtype}")
    if not checked:
        _check(a, b)
    es = a.element_size()
    if (m and n and k and (width * es) % 16 == 0 and (n * es) % 16 == 0
            and preact.stride() == (width, 1) and preact.data_ptr() % 16 == 0
            and preact.device == a.device
            and (out_dpreact is None or _plain_rows(out_dpreact, m, width, a.dtype, a.device))
            and (out_postact is None or _plain_rows(out_postact, m, n, a.dtype, a.device))):
        # The common case, straight to the launch: a contiguous, aligned preact on a's device
        # (what _tensor_reason would pass) and outputs whose rows TMA can store, fresh or the
        # caller's laid out as fresh ones would be. postact is made first, as the layer's
        # launch groups make it (parallel_mlp/autograd.py says why).
        postact = (torch.empty(m, n, dtype=a.dtype, device=a.device) if out_postact is None
                   else out_postact)
        dpreact = (torch.empty(m, width, dtype=a.dtype, device=a.device) if out_dpreact is None
                   else out_dpreact)
        kw = dict(d_dtype=a.dtype, config=config, tuned=tuned, whole_rows=whole_rows)
        if act.gated:
            _launch(_spec("dact", act.name), a, b, post=postact, prein=preact, dpre=dpreact, **kw)
        else:
            _launch(_spec("dact", act.name), a, b, d=dpreact, post=postact, prein=preact, **kw)
        return dpreact, postact
    if preact.stride(1) != 1:
        preact = preact.contiguous()  # the epilogue reads preact row-major
    postact = _output(out_postact, (m, n), a, "out_postact")
    dpreact = _output(out_dpreact, (m, width), a, "out_dpreact")
    if m == 0 or n == 0:
        return dpreact, postact
    if k == 0:
        d, p = act.backward(preact, torch.zeros(m, n, dtype=a.dtype, device=a.device))
        dpreact.copy_(d)
        postact.copy_(p)
        return dpreact, postact
    if not _aligned((n, a.element_size()), (width, a.element_size())) or _tensor_reason(preact, "preact"):
        # Rows TMA cannot load or store (e.g. a gated h that is not a multiple of 8, or a
        # misaligned preact view): the reference math, still right, just not fused.
        d, p = act.backward(preact, a @ b)
        dpreact.copy_(d)
        postact.copy_(p)
        return dpreact, postact
    if any(t is not None and _kernel_cannot_store(t) for t in (out_dpreact, out_postact)):
        # A caller's buffer the kernel cannot store to in place: the kernel into fresh
        # outputs, then a copy.
        d, p = gemm_dact(a, b, preact, activation, config=config, tuned=tuned,
                         whole_rows=whole_rows, checked=True)
        dpreact.copy_(d)
        postact.copy_(p)
        return dpreact, postact
    spec = _spec("dact", act.name)
    kw = dict(d_dtype=a.dtype, config=config, tuned=tuned, whole_rows=whole_rows)
    if act.gated:
        _launch(spec, a, b, post=postact, prein=preact, dpre=dpreact, **kw)
    else:
        _launch(spec, a, b, d=dpreact, post=postact, prein=preact, **kw)
    return dpreact, postact
