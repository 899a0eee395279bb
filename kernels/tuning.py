"""`tuned=True`: time the candidate configs once per problem, remember the winner on disk.

The choice is keyed by (variant, dtypes, operand majorness, M, N, K, SM count) and kept in
``$PARALLEL_MLP_CACHE_DIR/tune.json`` (default ``~/.cache/parallel_mlp``); later calls and later
processes reuse it without timing. Timing runs the real op on the caller's tensors, into scratch
outputs, so it never writes to the caller's outputs.
"""

from __future__ import annotations

import json
import os
import threading
import dataclasses
from dataclasses import asdict

import torch

from .compile import cache_dir
from .config import TUNE_CANDIDATES, GemmConfig, default_config

_lock = threading.Lock()
_choices: dict | None = None


def _path():
    return cache_dir() / "tune.json"


def _load():
    global _choices
    if _choices is None:
        try:
            _choices = json.loads(_path().read_text())
        except (OSError, ValueError):
            _choices = {}
    return _choices


def _save():
    p = _path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(_choices, indent=1, sort_keys=True))
        os.replace(tmp, p)
    except OSError:
        pass


def median_ms(fn, reps=10, warmup=1):
    """Median CUDA-event time of ``fn`` in ms, after ``warmup`` untimed calls (the first call
    also compiles). Shared by tuning and ``bench_gemm``.

    Events around every call, one synchronize at the end: the host runs ahead and keeps the
    queue full, so each event pair brackets the kernel, not the Python that launches it. (A
    synchronize per call would let the GPU idle while the next call's host side runs and add
    that launch overhead, ~0.1-0.5 ms for ours vs ~0.01 ms for torch.mm, to every sample.)
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[len(times) // 2]


def median_ms_interleaved(fns, reps=10, warmup=1):
    """Median CUDA-event times (ms) of several functions, called round-robin: f0, f1, ..., f0,
    f1, ... so that each sees the same clocks. An H200 under a GEMM is power-bound and its SM
    clock wanders by 10-20% over seconds; timing one function's reps after another's compares
    clock states as much as kernels. Same event discipline as `median_ms`."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    pairs = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
             for _ in fns]
    for r in range(reps):
        for fn, ev in zip(fns, pairs):
            ev[r][0].record()
            fn()
            ev[r][1].record()
    torch.cuda.synchronize()
    out = []
    for ev in pairs:
        times = sorted(s.elapsed_time(e) for s, e in ev)
        out.append(times[len(times) // 2])
    return out


def host_us_per_call(fn, calls=200, warmup=3):
    """Host wall time per call in µs over back-to-back calls of a tiny op: the launch overhead
    (Python, argument conversion, the launch itself), which the GPU waits for whenever the
    queue is empty, e.g. after a synchronize or with small per-rank shapes."""
    import time

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def tuned_config(spec, a, bk, d_dtype, num_sms: int) -> GemmConfig:
    from . import ops

    m, k = a.shape
    n = bk.shape[0]
    key = f"{spec.key}|{a.dtype}|{ops._major(a)}|{ops._major(bk)}|{d_dtype}|{m}x{n}x{k}|sm{num_sms}"
    with _lock:
        choices = _load()
        if key in choices:
            return GemmConfig(**choices[key])
    default = default_config(m, n, k, num_sms, spec.kind)
    best, best_t = default, float("inf")
    b = bk.t()
    # The default competes too: it may be a config the candidate list does not hold (pingpong).
    candidates = [default] + [dataclasses.replace(c, num_sms=num_sms, l2_prefetch=default.l2_prefetch)
                              for c in TUNE_CANDIDATES]
    for cfg in dict.fromkeys(candidates):
        if spec.kind in ("store", "accumulate"):
            out = torch.zeros(m, n, dtype=d_dtype, device=a.device)
            run = lambda: ops.gemm(a, b, out=out, accumulate=spec.kind == "accumulate", config=cfg)  # noqa: E731
        elif spec.kind == "act":
            bias = None
            if spec.has_bias:
                bias = torch.zeros(n, dtype=a.dtype, device=a.device)
            run = lambda: ops.gemm_act(a, b, spec.activation, bias=bias, store_preact=spec.store_preact, config=cfg)  # noqa: E731
        else:
            width = 2 * n if spec.gated else n
            pre = torch.randn(m, width, dtype=a.dtype, device=a.device)
            run = lambda: ops.gemm_dact(a, b, pre, spec.activation, config=cfg)  # noqa: E731
        try:
            t = median_ms(run)
        except Exception:
            continue  # a candidate that does not build or launch here is simply not chosen
        if t < best_t:
            best, best_t = cfg, t
    with _lock:
        _load()[key] = asdict(best)
        _save()
    return best
