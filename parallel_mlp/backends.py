"""The op interface of the MLP's GEMMs, and the choice of implementation per call.

Three ops (``b`` is usually a transposed view of a weight)::

    gemm(a, b, out=None, out_dtype=None, accumulate=False) -> out      # out (+)= a @ b
    gemm_act(a, b, activation, bias=None, store_preact=True) -> (preact | None, postact)
    gemm_dact(a, b, preact, activation) -> (dpreact, postact)          # dpostact = a @ b

and ``transient_bytes(m, n, k, device)``: the memory a GEMM of that shape allocates for the
length of one call (the backward orders its GEMMs by it). ``gemm``'s ``replay=True`` marks
recompute's replay of fc1: it must run the kernel ``gemm_act`` ran, for the same bits.

For the tensor-parallel overlap, which runs a GEMM block of rows by block of rows, gemm_act and
gemm_dact also take their outputs (``out_preact``, ``out_postact``, ``out_dpreact``: row blocks of
the whole outputs), and every op takes ``whole_rows``: the rows of the GEMM ``a`` is a block of,
so that the kernel chosen for the block is the whole GEMM's (cute; the torch backend ignores it).

``torch`` is the reference and the fallback: cuBLAS (or the CPU matmul) plus the activation math of
:mod:`parallel_mlp.activations`. ``cute`` runs the CuTe DSL kernels of ``parallel_mlp.kernels`` on
sm_90. ``auto`` takes ``cute`` where it applies (as :class:`AutoBackend`: the CuTe kernels, but
cuBLAS for the plain GEMMs with too few tiles to fill the GPU, ``cublas_runs``) and
otherwise ``torch``, saying why once at debug level.
"""

from __future__ import annotations

import logging

import torch

from . import fused_act
from .activations import get_activation

log = logging.getLogger(__name__)

BACKENDS = ("auto", "cute", "torch")


def check_backend_name(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not known; choose one of {BACKENDS}")
    return backend


# ---- torch: the reference -------------------------------------------------------------------


def _mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with an fp32 result accumulated in fp32, without rounding through a.dtype."""
    if a.dtype == torch.float32:
        return a @ b
    if a.is_cuda:
        # cuBLAS accumulates in fp32 and writes fp32 directly: no bf16 rounding of the product.
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


_FP32_ADDMM_WORKS: dict[tuple[int, torch.dtype], bool] = {}  # by (CUDA device index, operand dtype)


def fp32_addmm_works(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this torch on this device has the fp32-output addmm of `dtype` operands (cuBLAS,
    beta = 1, C = D: how Megatron and Transformer Engine accumulate main_grad) and it adds up
    right, checked once per device and dtype on a small case against the fp32 product. While a CUDA graph
    is being captured the check cannot run (it synchronizes): False for that call, unchecked."""
    if device.type != "cuda":
        return False
    key = (device.index if device.index is not None else torch.cuda.current_device(), dtype)
    if key not in _FP32_ADDMM_WORKS:
        if torch.cuda.is_current_stream_capturing():
            return False
        _FP32_ADDMM_WORKS[key] = _check_fp32_addmm(torch.device("cuda", key[0]), dtype)
    return _FP32_ADDMM_WORKS[key]


def _check_fp32_addmm(device: torch.device, dtype: torch.dtype) -> bool:
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(64, 96, device=device, generator=g).to(dtype)
    b = torch.randn(96, 32, device=device, generator=g).to(dtype)
    out = torch.randn(64, 32, device=device, generator=g)
    want = out + a.float() @ b.float()
    try:
        torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return bool(((out - want).abs().max() <= 1e-3 * want.abs().max()).item())


def _accumulate_fp32(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out += a @ b for an fp32 out: one addmm writing fp32 in place where it works (no product
    tensor: at a 28672x4096 main_grad that is 470 MB written and read again), else the fp32
    product, then add_."""
    if a.dtype in (torch.bfloat16, torch.float16) and a.dtype == b.dtype and fp32_addmm_works(out.device, a.dtype):
        return torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
    return out.add_(_mm_fp32(a, b))


class TorchBackend:
    """cuBLAS/CPU matmul plus the reference activation math (computed in fp32; one fused kernel
    on CUDA, see fused_act)."""

    name = "torch"

    @staticmethod
    def transient_bytes(m, n, k, device):
        return 0  # cuBLAS's workspace is allocated once per handle, not per call

    @staticmethod
    def gemm(a, b, out=None, out_dtype=None, accumulate=False, whole_rows=None, replay=False):
        if accumulate:
            if out is None:
                raise ValueError("gemm(accumulate=True) needs out= to accumulate into")
            if out.dtype == torch.float32:
                return _accumulate_fp32(a, b, out)
            return out.add_(a @ b)
        dtype = out_dtype or (out.dtype if out is not None else a.dtype)
        result = _mm_fp32(a, b).to(dtype) if dtype == torch.float32 else (a @ b).to(dtype)
        if out is None:
            return result
        return out.copy_(result)

    @staticmethod
    def gemm_act(a, b, activation, bias=None, store_preact=True, out_preact=None,
                 out_postact=None, whole_rows=None):
        act = get_activation(activation)
        preact = a @ b if bias is None else torch.addmm(bias, a, b)
        postact = fused_act.forward(act, preact)
        if postact is None:
            width = preact.shape[1] // 2 if act.gated else preact.shape[1]
            postact = preact.new_empty(preact.shape[0], width)
            for rows in _row_chunks(preact):
                postact[rows] = act.forward(preact[rows])
        preact = _into(out_preact, preact) if store_preact else None
        return preact, _into(out_postact, postact)

    @staticmethod
    def gemm_dact(a, b, preact, activation, out_dpreact=None, out_postact=None, whole_rows=None):
        act = get_activation(activation)
        dpostact = a @ b
        fused = fused_act.backward(act, preact, dpostact)
        if fused is not None:
            dpreact, postact = fused
        else:
            dpreact = torch.empty_like(preact)
            postact = torch.empty_like(dpostact)
            for rows in _row_chunks(preact):
                dpreact[rows], postact[rows] = act.backward(preact[rows], dpostact[rows])
        return _into(out_dpreact, dpreact), _into(out_postact, postact)


def _into(out, t):
    """t, or t copied into the caller's buffer (the reference path computes, then places)."""
    if out is None:
        return t
    if out.shape != t.shape or out.dtype != t.dtype:
        raise ValueError(f"output buffer is {tuple(out.shape)} {out.dtype}, the result "
                         f"{tuple(t.shape)} {t.dtype}")
    return out.copy_(t)


# Unfused, the activation math runs in fp32 with several temporaries per element; doing it a block of
# rows at a time keeps that working set to ~256 MB instead of several times the whole tensor.
_CHUNK_ELEMENTS = 1 << 26


def _row_chunks(t: torch.Tensor):
    step = max(1, _CHUNK_ELEMENTS // max(1, t.shape[1]))
    return [slice(i, i + step) for i in range(0, t.shape[0], step)] or [slice(0, 0)]


# ---- cute: the CuTe DSL kernels ---------------------------------------------------------------


class CuteBackend:
    """Adapter to ``parallel_mlp.kernels.ops``, imported lazily (it needs the CuTe DSL).

    Its ops run without checking their operands again: every caller gets this backend from
    :func:`resolve`, which checked them (the layer's own intermediates are made fit by the ops),
    and those checks are a good share of a small GEMM's host time."""

    name = "cute"
    _module = None

    @classmethod
    def _ops(cls):
        if cls._module is None:
            from .kernels import ops

            cls._module = ops
        return cls._module

    @classmethod
    def unsupported_reason(cls, *tensors: torch.Tensor) -> str | None:
        # Cheap checks first, so CPU runs never pay for importing the DSL.
        for t in tensors:
            if isinstance(t, torch.Tensor) and not t.is_cuda:
                return f"a {t.device.type} tensor was given; the CuTe kernels run on CUDA (sm_90)"
        try:
            ops = cls._ops()
        except Exception as e:  # the DSL is missing or broken: say so instead of crashing
            return f"the CuTe DSL kernels cannot be imported ({type(e).__name__}: {e})"
        return ops.unsupported_reason(*tensors)

    @classmethod
    def transient_bytes(cls, m, n, k, device):
        return cls._ops().transient_bytes(m, n, k, device)

    @classmethod
    def on_cublas(cls, a, b, out, accumulate=False) -> bool:
        """Whether ``gemm(a, b, out=out, accumulate=accumulate)`` runs on cuBLAS, not ours."""
        return False

    @classmethod
    def gemm(cls, a, b, out=None, out_dtype=None, accumulate=False, whole_rows=None,
             replay=False):
        return cls._ops().gemm(a, b, out=out, out_dtype=out_dtype, accumulate=accumulate,
                               whole_rows=whole_rows, checked=True)

    @classmethod
    def gemm_act(cls, a, b, activation, bias=None, store_preact=True, out_preact=None,
                 out_postact=None, whole_rows=None):
        return cls._ops().gemm_act(a, b, activation, bias=bias, store_preact=store_preact,
                                   out_preact=out_preact, out_postact=out_postact,
                                   whole_rows=whole_rows, checked=True)

    @classmethod
    def gemm_dact(cls, a, b, preact, activation, out_dpreact=None, out_postact=None,
                  whole_rows=None):
        return cls._ops().gemm_dact(a, b, preact, activation, out_dpreact=out_dpreact,
                                    out_postact=out_postact, whole_rows=whole_rows, checked=True)


# ---- auto: the CuTe kernels, with cuBLAS for the plain GEMMs it runs faster -----------------

# A plain GEMM (no activation) whose output has at most CUBLAS_MAX_WAVES waves of 128x128 tiles
# over the GPU's SMs, and at least CUBLAS_MIN_FLOP, runs on cuBLAS under backend="auto".
# Ours against cuBLAS for the four plain GEMMs of a step (fc2, dx, the wgrads bf16 and
# accumulated into fp32) at the 30 shapes of the sweep's grid, each a CUDA graph held 0.2 s x 4
# (`python3 tools/plain_gemms.py`, H200, 2026-12-03, benchmarks/h200-plain-gemms.json): all 36
# GEMMs with up to 2.5 waves (330 tiles on 132 SMs) ran slower on ours, 0.75-0.99x cuBLAS (fc2
# and dx at T=512-4096: 0.75-0.95x; the wgrads of 64-96 tiles at T=65536 in stream-K:
# 0.84-0.89x); from 2.67 waves ours ran 0.86-1.21x, faster at some (dW1 of 5632 x 1024 at K =
# 8192 and 65536: 1.05x and 1.13x). Whole steps, auto's fused function against the same with
# every GEMM on ours, held in one run (`bench sweep --all-cute --tokens 512,1000,2048,4096,65536`,
# H200, 2026-12-03, on a slow host): 1.016-1.050x where the GEMMs so moved had 90-378 GFLOP
# (T=1000 d=4096 swiglu 1.028x, T=65536 d=2048 h=704 1.048x, T=65536 d=1024 gelu h=1024 1.050x)
# but 0.835-0.913x at the host-bound steps, whose moved GEMMs had 3-47 GFLOP (T=512, T=2048
# d=2048, T=4096 d=1024): the GEMMs' time saved is less than the host's time the cuBLAS calls
# cost there (not taken apart), so those stay on ours. Ours keeps the fused ops, whose
# activation cuBLAS cannot run, and recompute's replay of fc1, which must give gemm_act's bits.
CUBLAS_MAX_WAVES = 2.5
CUBLAS_MIN_FLOP = 64e9

def _sm_count(device: torch.device) -> int:
    """The SMs of a CUDA device (the kernels' own cached count); 0 for any other (the CuTe path
    on a CPU tensor exists only where tests or the host-time stub fake it: nothing goes to
    cuBLAS there)."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return CuteBackend._ops()._num_sms(index)


def cublas_runs(m: int, n: int, k: int, num_sms: int) -> bool:
    """Whether auto runs a plain GEMM ([m, k] @ [k, n]) on cuBLAS: at most CUBLAS_MAX_WAVES
    waves of 128x128 output tiles over ``num_sms`` SMs, and at least CUBLAS_MIN_FLOP."""
    return (2 * m * n * k >= CUBLAS_MIN_FLOP
            and -(-m // 128) * -(-n // 128) <= CUBLAS_MAX_WAVES * num_sms)


class AutoBackend(CuteBackend):
    """``backend="auto"`` where the CuTe kernels apply: ours, but cuBLAS for a long plain GEMM
    with too few tiles for our kernels (``cublas_runs``), as PyTorch's own matmul runs it (fp32
    accumulation; ``torch.backends.cuda.matmul`` settings apply). Into an fp32 main grad by
    cuBLAS's fp32-output addmm (``fp32_addmm_works``); a 16-bit gradient accumulated in place,
    or an output of another dtype than the operands', stays on ours (one rounding of the fp32
    sum)."""

    name = "auto"

    @classmethod
    def _on_cublas(cls, a, b, out, out_dtype, accumulate, whole_rows) -> bool:
        # Below the FLOP floor first, from the sizes alone: that is every GEMM of a host-bound
        # step, where each microsecond of Python counts (the whole rule: ~3 us on a 2-core VM).
        n = b.shape[1]
        if 2 * n * (a.numel() if whole_rows is None else whole_rows * a.shape[1]) < CUBLAS_MIN_FLOP:
            return False
        m = a.shape[0] if whole_rows is None else whole_rows
        if not cublas_runs(m, n, a.shape[1], _sm_count(a.device)):
            return False
        if accumulate:  # without out, ours says what is missing
            return (out is not None and out.dtype == torch.float32
                    and fp32_addmm_works(out.device, a.dtype))
        return (out_dtype or (out.dtype if out is not None else a.dtype)) == a.dtype

    @classmethod
    def on_cublas(cls, a, b, out, accumulate=False) -> bool:
        return cls._on_cublas(a, b, out, None, accumulate, None)

    @classmethod
    def transient_bytes(cls, m, n, k, device):
        if cublas_runs(m, n, k, _sm_count(device)):
            return TorchBackend.transient_bytes(m, n, k, device)
        return super().transient_bytes(m, n, k, device)

    @classmethod
    def gemm(cls, a, b, out=None, out_dtype=None, accumulate=False, whole_rows=None,
             replay=False):
        if not replay and cls._on_cublas(a, b, out, out_dtype, accumulate, whole_rows):
            if accumulate:
                return _accumulate_fp32(a, b, out)
            return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)
        return super().gemm(a, b, out=out, out_dtype=out_dtype, accumulate=accumulate,
                            whole_rows=whole_rows)


def for_step(ops, rows: int, w1_shape, w2_shape):
    """The backend a fused step runs on, given the one ``resolve`` chose for its operands: where
    none of the step's plain GEMMs reaches CUBLAS_MIN_FLOP (fc2 and dx, the two weight gradients;
    ``rows`` the rows they run over, gathered under sequence parallelism), AutoBackend would send
    none of them to cuBLAS, and CuteBackend runs the same kernels without asking per GEMM. The
    questions (four a step, and AutoBackend's workspace sizes) cost a host-bound step host time:
    answered here once, the fused step at swiglu T=512 d=1024 h=2816 took 3.6-5.3% less of it
    (kernels stubbed as `bench host --stub` stubs them, launch groups replayed, 41 rounds
    alternating with the per-GEMM questions, four runs; 2-core VM, 2026-12-06). ``w1_shape`` is
    fc1's [rows, in_features], ``w2_shape`` fc2's [out_features, hidden]."""
    if ops is AutoBackend:
        (features, d_in), (d_out, hidden) = w1_shape, w2_shape
        if 2 * rows * max(features * d_in, hidden * d_out) < CUBLAS_MIN_FLOP:
            return CuteBackend
    return ops


_warned: set[str] = set()


def resolve(backend: str, *tensors: torch.Tensor):
    """The backend object to run ops on these tensors with.

    ``tensors`` are the operands of the call (None entries are ignored), and may include shapes
    (tuples) of tensors the call will make, whose rows must also suit the kernels; the CuTe path
    must accept all of them (CUDA sm_90, bf16/fp16, 16-byte aligned strides) or ``auto`` falls
    back.
    """
    if backend == "torch":
        return TorchBackend
    tensors = tuple(t for t in tensors if t is not None)
    reason = CuteBackend.unsupported_reason(*tensors)
    if reason is None:
        return AutoBackend if backend == "auto" else CuteBackend
    if backend == "cute":
        raise ValueError(f"backend='cute' cannot run here: {reason}")
    if reason not in _warned:
        _warned.add(reason)
        log.debug("parallel_mlp: backend='auto' falls back to 'torch': %s", reason)
    return TorchBackend
