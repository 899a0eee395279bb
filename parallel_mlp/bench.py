"""Benchmark: our fused kernels vs cuBLAS, PyTorch eager and torch.compile, in one process.

    python -m parallel_mlp.bench                      # one GPU: GEMMs, fused ops, whole MLP, cold start
    python -m parallel_mlp.bench --dry-run            # tiny shapes; on a machine without CUDA, the CPU
    torchrun --nproc-per-node 2 -m parallel_mlp.bench --tp    # the MLP at TP = world size

Sections (``--only`` picks some):

- ``gemms``: the six GEMMs of the MLP with the operand layouts the layer really uses (plus the
  wgrads accumulated into an fp32 main grad), ours vs ``torch.mm`` (cuBLAS); then ``gemm_act`` and
  ``gemm_dact`` vs a plain cuBLAS GEMM of the same shape and vs eager torch (GEMM + activation).
- ``mlp``: ParallelMLP fwd+bwd at TP=1 (default and recompute modes) vs a plain PyTorch module
  (eager and torch.compile), with peak memory per variant; then the cold start of a new process.

Timing follows the workplace's method: CUDA events around each call, warm-up first, the median of
``--iters`` calls, random inputs (never zeros), several input sets rotated when one set would sit in
L2, and a cuBLAS 8192^3 line at the start and end so the run states its own ceiling and drift.
Variants that are compared (ours vs cuBLAS, the MLP variants) are timed held: each runs back to
back for ``--hold-s`` seconds, in turn, for ``--rounds`` rounds (the median of its rounds). The
H200 is power-bound: at its 700 W cap the clock a kernel gets depends on the energy it spends per
cycle, and it settles over tens of milliseconds. Held, each variant runs at its own clock, as in
training; rounds in turn cancel the drift of the card's clock over seconds. (``--hold-s 0`` times
call by call, round-robin: the variants then share one clock, so the ratio compares cycles, not
time; that favoured our kernels, which take fewer cycles but more power than cuBLAS's, by up to
13% on the whole MLP; kernels/NOTES.md, session 5.)

Every measurement is guarded: an error (the kernels missing, a shape they reject, an OOM) is
recorded in its row of the JSON and the table, and the run goes on. The table is printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import bench_report
from .activations import get_activation
from .backends import TorchBackend, fp32_addmm_works, resolve
from .layer import ParallelMLP
from .params import split_gate_up
from .timing import DEFAULT_HOLD_S, hold, settled

DEFAULT_CONFIGS = "swiglu:14336,swiglu:7168,gelu_tanh_approx:16384"
# Tiny shapes for --dry-run: every code path, seconds on a CPU. Sizes stay multiples of 64 so the
# CuTe kernels' 16-byte alignment holds when a dry run happens on a GPU.
DRY_RUN = dict(tokens=256, d_model=128, configs="swiglu:384,swiglu:192,gelu_tanh_approx:512",
               iters=3, warmup=1, ceiling_size=256, hold_s=0.0)
# Leave room after the budget for the table, the JSON and the chart.
DEFAULT_BUDGET_S = 420.0
# torch.compile's first call can take tens of seconds: don't start one with less time than this.
COMPILE_RESERVE_S = 60.0
# After the budget, the longest a started row may take before the watchdog reports a hang.
WATCHDOG_MARGIN_S = 150.0


_START = time.monotonic()


def log(msg: str) -> None:
    """Progress goes to stderr, so stdout ends with the table alone."""
    print(f"[bench {time.monotonic() - _START:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ---- run context ----------------------------------------------------------------------------


@dataclass
class Ctx:
    """Everything a section needs: shapes, device, timing settings, and which backend is ours."""

    device: torch.device
    dtype: torch.dtype
    tokens: int
    d_model: int
    configs: list[tuple[str, int]]
    iters: int
    warmup: int
    backend: str
    deadline: float
    cold_start_config: tuple[str, int] | None = None
    ours: object = None            # the resolved backend class, or None when it cannot run
    ours_reason: str | None = None  # why not
    l2_bytes: int = 0
    hold_s: float = 0.0             # > 0: time variants held (time_held), else call by call
    rounds: int = 3                 # held: turns each variant gets
    current: str = ""               # the measurement in progress, for the watchdog's report
    checkpoint: Callable[[], None] = lambda: None  # saves the results so far
    cuda: bool = field(init=False)

    def __post_init__(self):
        self.cuda = self.device.type == "cuda"

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def rand(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        # Random, never zero: zeros hide unwritten outputs and can run faster than real data.
        return torch.randn(*shape, device=self.device, dtype=self.dtype).mul_(scale)


def parse_configs(text: str) -> list[tuple[str, int]]:
    """'swiglu:14336,gelu_tanh_approx:16384' -> [('swiglu', 14336), ('gelu_tanh_approx', 16384)]."""
    configs = []
    for item in text.split(","):
        name, _, hidden = item.strip().partition(":")
        get_activation(name)  # an unknown name fails here, with the list of valid ones
        if not hidden.isdigit() or int(hidden) <= 0:
            raise ValueError(f"--configs item {item!r}: expected activation:hidden, e.g. swiglu:14336")
        configs.append((name, int(hidden)))
    return configs


def config_label(act: str, h: int) -> str:
    return f"{act}:{h}"


def fc1_features(act: str, h: int) -> int:
    return 2 * h if get_activation(act).gated else h


def mlp_flops(tokens: int, d: int, act: str, h: int) -> float:
    """fwd+bwd = 3 x forward, forward = fc1 (2*T*d*F) + fc2 (2*T*h*d), as issue 3 counts it."""
    return 3.0 * (2 * tokens * d * fc1_features(act, h) + 2 * tokens * h * d)


# ---- timing ---------------------------------------------------------------------------------


def input_sets(ctx: Ctx, bytes_per_set: int, max_sets: int = 4) -> int:
    """How many input sets to rotate through so that repeated calls don't just measure the L2:
    one when a set is well over the L2, more when it would fit."""
    if bytes_per_set >= 2 * ctx.l2_bytes:
        return 1
    return max(1, min(max_sets, math.ceil(3 * ctx.l2_bytes / max(bytes_per_set, 1))))


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def time_calls(ctx: Ctx, fn, n_sets: int = 1) -> dict:
    """The time of ``fn(i)``, ``i`` cycling the input sets: time_side_by_side of fn alone (held,
    or the median of ctx.iters calls after ctx.warmup).

    For a measurement that stands alone (the ceiling, eager's fused ops); those
    whose ratio is taken go through time_side_by_side together, so that the card's drift cancels.
    """
    return time_side_by_side(ctx, {"fn": fn}, n_sets)["fn"]


def time_side_by_side(ctx: Ctx, fns: dict[str, Callable], n_sets: int = 1) -> dict[str, dict]:
    """Time several functions side by side: held (time_held) when ctx.hold_s > 0, else call by
    call, round-robin: ctx.warmup untimed rounds, then ctx.iters rounds, each calling every fn
    once in order with the same input set ``i``. Returns, per name, what time_calls returns.

    Why side by side: the H200 is power-bound, and its SM clock wanders 10-20% over seconds with
    the load. Timing all of one variant's calls and then the other's compares two clock states as
    much as two kernels (one run had cuBLAS at 803 TF/s and ours at 680 on a row, another run the
    reverse). Call by call, the variants share one clock, so the ratio compares their cycles but
    hides that one may draw more power per cycle and, run alone, get a lower clock; held turns
    (the default) give each its own clock and still cancel the drift.

    On CUDA each call sits between two events and the host never waits inside the loop, so the
    queue stays full; one synchronize at the end. On the CPU a perf_counter pair per call.
    """
    if ctx.hold_s > 0:
        return time_held(ctx, fns, n_sets)
    for i in range(ctx.warmup):
        for fn in fns.values():
            fn(i % n_sets)
    ctx.sync()
    if ctx.cuda:
        def event():
            return torch.cuda.Event(enable_timing=True)

        events = {name: [(event(), event()) for _ in range(ctx.iters)] for name in fns}
        for i in range(ctx.iters):
            for name, fn in fns.items():
                start, end = events[name][i]
                start.record()
                fn(i % n_sets)
                end.record()
        torch.cuda.synchronize(ctx.device)
        times = {name: [start.elapsed_time(end) for start, end in pairs]
                 for name, pairs in events.items()}
    else:
        times = {name: [] for name in fns}
        for i in range(ctx.iters):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn(i % n_sets)
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: {"ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t),
                   "iters": ctx.iters, "input_sets": n_sets} for name, t in times.items()}


def time_held(ctx: Ctx, fns: dict[str, Callable], n_sets: int = 1) -> dict[str, dict]:
    """Time each fn held, as training runs it: ctx.warmup untimed calls of each, then ctx.rounds
    rounds in which each fn in turn runs back to back for ctx.hold_s seconds (input sets cycling).
    A hold's time is the median of its settled calls (timing.settled); a fn's ``ms`` is
    the median of its holds, ``min_ms`` / ``max_ms`` the extremes of its holds' medians, and
    ``iters`` the calls timed. Returns the same keys as the call-by-call timing, plus ``hold_s``
    and ``rounds``."""
    for i in range(ctx.warmup):
        for fn in fns.values():
            fn(i % n_sets)
    ctx.sync()
    holds = {name: [] for name in fns}
    counted = {name: 0 for name in fns}
    for _ in range(ctx.rounds):
        for name, fn in fns.items():
            kept = settled(hold(lambda i, fn=fn: fn(i % n_sets), ctx.hold_s, ctx.cuda))
            holds[name].append(statistics.median(kept))
            counted[name] += len(kept)
    return {name: {"ms": statistics.median(h), "min_ms": min(h), "max_ms": max(h),
                   "iters": counted[name], "input_sets": n_sets, "hold_s": ctx.hold_s,
                   "rounds": ctx.rounds} for name, h in holds.items()}


def per_name(result: dict, names) -> dict[str, dict]:
    """An attempt() of an interleaved measurement gives a dict per name, or a single error (or
    skip) dict when it failed: then every name gets a copy of that one."""
    if all(name in result for name in names):
        return result
    return {name: dict(result) for name in names}


def with_tflops(timing: dict, flops: float) -> dict:
    timing["tflops"] = flops / (timing["ms"] * 1e-3) / 1e12
    return timing


def time_with_tflops(ctx: Ctx, fns: dict[str, Callable], n_sets: int, flops: float) -> dict:
    """time_side_by_side, with each fn's rate for ``flops`` per call."""
    times = time_side_by_side(ctx, fns, n_sets)
    return {name: with_tflops(t, flops) for name, t in times.items()}


def attempt(ctx: Ctx, what: str, fn, *args, min_time_s: float = 0.0) -> dict:
    """Run one measurement; an exception becomes ``{"error": ...}`` so one broken row never ends
    the run, and a measurement that would start past the time budget is skipped."""
    if ctx.time_left() < min_time_s:
        return {"skipped": f"over the time budget ({ctx.time_left():.0f} s left)"}
    ctx.current = what
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - recorded in the results, never swallowed silently
        log(f"{what} failed: {type(e).__name__}: {e}")
        traceback.print_exc(file=sys.stderr)
        if ctx.cuda:
            torch.cuda.empty_cache()  # after an OOM, let the next row start from a clean pool
        return {"error": f"{type(e).__name__}: {e}"[:600]}


def ours_or_reason(ctx: Ctx):
    """The measurement for a row of ours when our backend cannot run here: say so, per row."""
    if ctx.ours is None:
        return {"unavailable": ctx.ours_reason}
    return None


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp32: a cheap guard against timing a kernel that computes
    something else (bf16 operands land between 1e-3 and 1e-2)."""
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# ---- ceiling ---------------------------------------------------------------------------------


def spin_up(ctx: Ctx, fn, seconds: float) -> None:
    """Keep the device busy for a while, so clocks have ramped up before the first measurement."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        fn()
        ctx.sync()


def bench_ceiling(ctx: Ctx, n: int) -> dict:
    """cuBLAS n^3 in our dtype: the rate this run can hope for, measured, not from a datasheet."""
    a, b = ctx.rand(n, n), ctx.rand(n, n)
    # An idle H200 sits near 345 MHz; a few seconds of GEMMs bring the clocks up before timing.
    spin_up(ctx, lambda: torch.mm(a, b), 3.0 if ctx.cuda else 0.0)
    out = time_calls(ctx, lambda i: torch.mm(a, b))
    return with_tflops(out, 2.0 * n ** 3) | {"size": n}


# ---- the six GEMMs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmCase:
    """out [M, N] (+)= a [M, K] @ b [K, N]; ``a_t`` / ``b_t``: the operand is a transposed view."""

    name: str
    m: int
    n: int
    k: int
    a_t: bool
    b_t: bool
    accumulate: bool = False


def mlp_gemm_cases(tokens: int, d: int, act: str, h: int) -> list[GemmCase]:
    """The GEMMs autograd.py issues, with its layouts: weights are [out, in] row-major, so the
    forward reads W.T views, and the wgrads read activations.T views."""
    T, f = tokens, fc1_features(act, h)
    return [
        GemmCase("fc1 fwd   x @ W1.T", T, f, d, False, True),
        GemmCase("fc2 fwd   post @ W2.T", T, d, h, False, True),
        GemmCase("fc2 dgrad dy @ W2", T, h, d, False, False),
        GemmCase("fc1 dgrad dpre @ W1", T, d, f, False, False),
        GemmCase("fc2 wgrad dy.T @ post", d, h, T, True, False),
        GemmCase("fc1 wgrad dpre.T @ x", f, d, T, True, False),
        GemmCase("fc2 wgrad +=fp32 main", d, h, T, True, False, accumulate=True),
        GemmCase("fc1 wgrad +=fp32 main", f, d, T, True, False, accumulate=True),
    ]


def make_operand(ctx: Ctx, rows: int, cols: int, transposed: bool) -> torch.Tensor:
    """A [rows, cols] operand; when ``transposed``, a .t() view of a contiguous [cols, rows]."""
    if transposed:
        return ctx.rand(cols, rows).t()
    return ctx.rand(rows, cols)


def cublas_accumulate_fn(ctx: Ctx):
    """How cuBLAS accumulates into an fp32 main grad from torch, which is what the torch backend
    does: one addmm with beta=1 and an fp32 output where this torch has it (as Megatron/TE do),
    else mm-then-add (backends.fp32_addmm_works)."""

    def accumulate(a, b, out):
        return TorchBackend.gemm(a, b, out=out, accumulate=True)

    if fp32_addmm_works(ctx.device, ctx.dtype):
        return "addmm(beta=1, out_dtype=fp32)", accumulate
    return "mm(out_dtype=fp32) + add_", accumulate


def bench_gemm(ctx: Ctx, case: GemmCase, accumulate_fn) -> dict:
    set_bytes = ctx.dtype.itemsize * (case.m * case.k + case.k * case.n + case.m * case.n)
    n_sets = input_sets(ctx, set_bytes)
    sets = [(make_operand(ctx, case.m, case.k, case.a_t), make_operand(ctx, case.k, case.n, case.b_t))
            for _ in range(n_sets)]
    flops = 2.0 * case.m * case.n * case.k
    main_grad = torch.randn(case.m, case.n, device=ctx.device, dtype=torch.float32)

    def cublas(i):
        if case.accumulate:
            return accumulate_fn(*sets[i], main_grad)
        return torch.mm(*sets[i])

    def ours(i):
        if case.accumulate:
            return ctx.ours.gemm(*sets[i], out=main_grad, accumulate=True)
        return ctx.ours.gemm(*sets[i])

    # cuBLAS and ours call by call, so that their ratio compares kernels at the same clocks; when
    # ours cannot run, cuBLAS alone.
    fns = {"cublas": cublas}
    if ctx.ours is not None:
        fns["ours"] = ours
    row = per_name(attempt(ctx, f"{' vs '.join(fns)} {case.name}", time_with_tflops, ctx, fns,
                           n_sets, flops), fns)
    row["ours"] = ours_or_reason(ctx) or row["ours"]
    if ctx.ours is not None:
        row["rel_err"] = attempt(ctx, f"check {case.name}", check_gemm, ctx, case, sets[0],
                                 accumulate_fn)
    return row


def check_gemm(ctx: Ctx, case: GemmCase, operands, accumulate_fn) -> float:
    a, b = operands
    if not case.accumulate:
        return rel_err(ctx.ours.gemm(a, b), torch.mm(a, b))
    base = torch.randn(case.m, case.n, device=ctx.device, dtype=torch.float32)
    ours, ref = base.clone(), base.clone()
    ctx.ours.gemm(a, b, out=ours, accumulate=True)
    accumulate_fn(a, b, ref)
    return rel_err(ours - base, ref - base)  # the added product, not the (random) base


def section_gemms(ctx: Ctx, results: dict) -> None:
    name, accumulate_fn = cublas_accumulate_fn(ctx)
    results["meta"]["cublas_accumulate"] = name
    rows = results.setdefault("gemms", [])
    for act, h in ctx.configs:
        for case in mlp_gemm_cases(ctx.tokens, ctx.d_model, act, h):
            log(f"gemm {config_label(act, h)} {case.name}")
            row = {"config": config_label(act, h), "name": case.name, "m": case.m, "n": case.n,
                   "k": case.k, "a_transposed": case.a_t, "b_transposed": case.b_t,
                   "accumulate_fp32": case.accumulate}
            row |= attempt(ctx, case.name, bench_gemm, ctx, case, accumulate_fn)
            row["ratio"] = ratio(row.get("cublas"), row.get("ours"))  # ours / cuBLAS throughput
            rows.append(row)
            ctx.checkpoint()
            free_memory(ctx)


def ratio(base: dict | None, other: dict | None) -> float | None:
    """base time / other time: other's throughput relative to base (None if either is missing)."""
    if not (isinstance(base, dict) and isinstance(other, dict)):
        return None
    if "ms" not in base or "ms" not in other:
        return None
    return base["ms"] / other["ms"]


def free_memory(ctx: Ctx) -> None:
    if ctx.cuda:
        torch.cuda.empty_cache()


# ---- fused GEMM + activation -----------------------------------------------------------------


def eager_activation(name: str):
    """The activation as a PyTorch user writes it: torch ops on bf16 tensors, gated halves taken
    with chunk() (the layout plain modules use; any layout is the same math up to a permutation
    of W1's rows)."""

    def gated(f):
        def apply(pre):
            g, u = pre.chunk(2, dim=-1)
            return f(g, u)
        return apply

    table = {
        "gelu_tanh_approx": lambda x: F.gelu(x, approximate="tanh"),
        "gelu": F.gelu,
        "relu": F.relu,
        "relu_sq": lambda x: F.relu(x).square(),
        "swiglu": gated(lambda g, u: F.silu(g) * u),
        "swiglu_oai": gated(lambda g, u: g * torch.sigmoid(1.702 * g) * (u + 1)),
        "reglu": gated(lambda g, u: F.relu(g) * u),
        "geglu": gated(lambda g, u: F.gelu(g, approximate="tanh") * u),
        "geglu_erf": gated(lambda g, u: F.gelu(g) * u),
        "glu": gated(lambda g, u: torch.sigmoid(g) * u),
    }
    return table[name]


def eager_dact(dy, w2, preact, act_fn):
    """What eager torch runs for gemm_dact's outputs: the dgrad GEMM, then the activation
    recomputed and differentiated by autograd (separate elementwise kernels)."""
    dpost = dy @ w2
    with torch.enable_grad():
        pre = preact.detach().requires_grad_(True)
        post = act_fn(pre)
    (dpre,) = torch.autograd.grad(post, pre, dpost)
    return dpre, post.detach()


def fused_ops(ctx: Ctx, act: str, h: int) -> dict:
    """For each fused op, as functions of an input set ``s``: its FLOPs, ours, the plain cuBLAS GEMM of the same
    shape, eager torch, and the pairs of outputs (ours, reference) its check compares."""
    T, d, f = ctx.tokens, ctx.d_model, fc1_features(act, h)
    act_fn = eager_activation(act)
    ref = TorchBackend  # the correctness reference: the same interleaved layout as ours
    return {
        "gemm_act": dict(
            flops=2.0 * T * f * d,
            ours=lambda s: ctx.ours.gemm_act(s["x"], s["w1"].t(), act),
            cublas=lambda s: torch.mm(s["x"], s["w1"].t()),
            eager=lambda s: act_fn(s["x"] @ s["w1"].t()),
            reference=lambda s: ref.gemm_act(s["x"], s["w1"].t(), act)),
        "gemm_act no-preact": dict(
            flops=2.0 * T * f * d,
            ours=lambda s: ctx.ours.gemm_act(s["x"], s["w1"].t(), act, store_preact=False),
            cublas=lambda s: torch.mm(s["x"], s["w1"].t()),
            eager=lambda s: act_fn(s["x"] @ s["w1"].t()),
            reference=lambda s: (None, ref.gemm_act(s["x"], s["w1"].t(), act)[1])),
        "gemm_dact": dict(
            flops=2.0 * T * h * d,
            ours=lambda s: ctx.ours.gemm_dact(s["dy"], s["w2"], s["preact"], act),
            cublas=lambda s: torch.mm(s["dy"], s["w2"]),
            eager=lambda s: eager_dact(s["dy"], s["w2"], s["preact"], act_fn),
            reference=lambda s: ref.gemm_dact(s["dy"], s["w2"], s["preact"], act)),
    }


def check_outputs(ours: tuple, reference: tuple) -> float:
    """The worst relative error over an op's outputs (None entries: not produced)."""
    return max(rel_err(o, r) for o, r in zip(ours, reference) if r is not None)


def fused_input_set(ctx: Ctx, act: str, h: int) -> dict:
    T, d, f = ctx.tokens, ctx.d_model, fc1_features(act, h)
    s = dict(x=ctx.rand(T, d), w1=ctx.rand(f, d, scale=d ** -0.5),
             dy=ctx.rand(T, d), w2=ctx.rand(d, h, scale=d ** -0.5))
    s["preact"] = s["x"] @ s["w1"].t()
    return s


def bench_fused(ctx: Ctx, act: str, h: int) -> list[dict]:
    """gemm_act (with and without storing preact) and gemm_dact at the MLP's shapes."""
    first = fused_input_set(ctx, act, h)
    n_sets = input_sets(ctx, nbytes(*first.values()))
    sets = [first] + [fused_input_set(ctx, act, h) for _ in range(n_sets - 1)]

    def on_sets(fn):
        return lambda i: fn(sets[i])

    rows = []
    for op, spec in fused_ops(ctx, act, h).items():
        log(f"fused {config_label(act, h)} {op}")
        flops = spec["flops"]
        # The plain cuBLAS GEMM and ours side by side for the ratio the target is on. Eager is
        # timed on its own: called in turn, its elementwise kernels, which draw less power,
        # would raise the clock for whichever call came next.
        fns = {"cublas": on_sets(spec["cublas"])}
        if ctx.ours is not None:
            fns["ours"] = on_sets(spec["ours"])
        pair = per_name(attempt(ctx, f"{' vs '.join(fns)} {op}", time_with_tflops, ctx, fns,
                                n_sets, flops), fns)
        row = {"config": config_label(act, h), "op": op, "cublas": pair["cublas"]}
        eager = on_sets(spec["eager"])
        row["eager"] = attempt(ctx, f"eager {op}", lambda fn=eager, flops=flops:
                               with_tflops(time_calls(ctx, fn, n_sets), flops))
        row["ours"] = ours_or_reason(ctx) or pair["ours"]
        if ctx.ours is not None:
            row["rel_err"] = attempt(ctx, f"check {op}", lambda spec=spec: check_outputs(
                spec["ours"](first), spec["reference"](first)))
        # ours time / plain cuBLAS GEMM time: the price of the fused activation (target <= 1.05).
        row["time_vs_cublas"] = ratio(row["ours"], row["cublas"])
        row["speedup_vs_eager"] = ratio(row["eager"], row["ours"])
        rows.append(row)
    return rows


def section_fused(ctx: Ctx, results: dict) -> None:
    rows = results.setdefault("fused", [])
    for act, h in ctx.configs:
        out = attempt(ctx, f"fused {config_label(act, h)}", bench_fused, ctx, act, h)
        if isinstance(out, dict):  # the setup itself failed (e.g. OOM): one row says so
            out = [{"config": config_label(act, h), "op": "all", "ours": out}]
        rows.extend(out)
        ctx.checkpoint()
        free_memory(ctx)


# ---- the whole MLP ---------------------------------------------------------------------------


class EagerMLP(nn.Module):
    """The PyTorch reference a user would write: x @ W1.T -> activation in torch ops -> @ W2.T,
    differentiated by autograd. W1 in the chunked gate/up layout."""

    def __init__(self, w1: torch.Tensor, w2: torch.Tensor, activation: str):
        super().__init__()
        self.w1 = nn.Parameter(w1)
        self.w2 = nn.Parameter(w2)
        self.act = eager_activation(activation)

    def forward(self, x):
        return self.act(x @ self.w1.t()) @ self.w2.t()


def chunked_w1(w1: torch.Tensor, gated: bool) -> torch.Tensor:
    """Our interleaved gated W1 -> the [gate rows; up rows] layout EagerMLP chunks, so that both
    compute the same function and can check each other."""
    return split_gate_up(w1).reshape(w1.shape).contiguous() if gated else w1.clone()


def build_parallel_mlp(w1, w2, act: str, h: int, **kwargs) -> ParallelMLP:
    """ParallelMLP holding the given weights (this rank's shards; TP = the default group's size,
    1 without torch.distributed). Built on the meta device and materialized where the weights
    are, so no time goes to drawing the default init on the CPU."""
    d = w1.shape[1]
    model = ParallelMLP(d, h, activation=act, device="meta", dtype=w1.dtype, **kwargs)
    model = model.to_empty(device=w1.device)
    with torch.no_grad():
        model.fc1.weight.copy_(w1)
        model.fc2.weight.copy_(w2)
    return model


def train_step(model: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """One fwd+bwd as training runs it: fresh grads (zero_grad(set_to_none)), and dx, since an MLP
    inside a network must return it. Returns the output."""
    model.zero_grad(set_to_none=True)
    x.grad = None
    y = model(x)
    y.backward(dy)
    return y


def clear_grads(model: nn.Module, xs) -> None:
    model.zero_grad(set_to_none=True)
    for x in xs:
        x.grad = None


def model_bytes(model: nn.Module) -> int:
    return nbytes(*model.parameters(), *model.buffers())


def first_step(ctx: Ctx, model: nn.Module, xs, dys, reference):
    """The first call (compiles or loads kernels), timed, and a check of y and dx against the
    reference: the first variant's outputs, which this call provides when there is none yet.
    Returns (result, reference)."""
    t0 = time.perf_counter()
    y = train_step(model, xs[0], dys[0])
    ctx.sync()
    out = {"first_step_s": time.perf_counter() - t0}
    if reference is None:
        reference = (y.detach().clone(), xs[0].grad.clone())
    else:
        out["rel_err_y"] = rel_err(y, reference[0])
        out["rel_err_dx"] = rel_err(xs[0].grad, reference[1])
    clear_grads(model, xs)
    return out, reference


def step_peak_memory(ctx: Ctx, model: nn.Module, xs, dys, held_by_others: int = 0,
                     steps: int = 2) -> dict:
    """Peak memory of a few training steps of this model alone, after its first call (whose
    one-time buffers stay out). A pass of its own because interleaved variants share the one peak
    counter. ``held_by_others``: bytes of other variants' models that are alive meanwhile (built
    for the interleaved timing), left out so that peak_mem_gb is what this variant needs alone."""
    if not ctx.cuda:
        return {}
    clear_grads(model, xs)
    ctx.sync()
    torch.cuda.reset_peak_memory_stats(ctx.device)
    before = torch.cuda.memory_allocated(ctx.device)
    for i in range(steps):
        train_step(model, xs[i % len(xs)], dys[i % len(dys)])
    ctx.sync()
    peak = torch.cuda.max_memory_allocated(ctx.device)
    clear_grads(model, xs)
    return {"peak_mem_gb": (peak - held_by_others) / 2 ** 30,
            "peak_over_start_gb": (peak - before) / 2 ** 30}


def prepare_mlp_variant(ctx: Ctx, model: nn.Module, xs, dys, reference, held_by_others: int = 0):
    """Everything of a variant but its timing: first call, check, peak memory.
    Returns (result, reference)."""
    out, reference = first_step(ctx, model, xs, dys, reference)
    out |= step_peak_memory(ctx, model, xs, dys, held_by_others)
    return out, reference


# Measured in the MLP section; torch.compile comes last, in a section of its own.
MLP_VARIANTS = ("eager", "ours", "ours_recompute", "torch_backend")


def mlp_builders(ctx: Ctx, act: str, h: int, w1: torch.Tensor, w2: torch.Tensor) -> dict:
    """Each variant's constructor, all holding the same weights so that they check each other."""
    gated = get_activation(act).gated

    def compiled():
        import torch._dynamo

        torch._dynamo.reset()
        # dynamic=False: each config is one fixed shape. Dynamo would otherwise mark dims dynamic
        # when it sees the second config's shapes and compile shape-generic, slower kernels.
        return torch.compile(EagerMLP(chunked_w1(w1, gated), w2.clone(), act), dynamic=False)

    return {
        "eager": lambda: EagerMLP(chunked_w1(w1, gated), w2.clone(), act),
        "ours": lambda: build_parallel_mlp(w1, w2, act, h, backend=ctx.backend),
        "ours_recompute": lambda: build_parallel_mlp(w1, w2, act, h, backend=ctx.backend,
                                                     recompute=True),
        "torch_backend": lambda: build_parallel_mlp(w1, w2, act, h, backend="torch"),
        "compile": compiled,
    }


def bench_mlp(ctx: Ctx, act: str, h: int, names) -> dict:
    """The named variants of one config. Each in turn is built, called once (first-call time, and
    a check against the first variant's outputs, the reference) and measured for peak memory; then
    their timed steps run side by side (time_side_by_side: held, each at its own clock, by
    default)."""
    T, d = ctx.tokens, ctx.d_model
    f = fc1_features(act, h)
    flops = mlp_flops(T, d, act, h)
    # nn.Linear-like scale keeps activations O(1) through both layers.
    w1, w2 = ctx.rand(f, d, scale=d ** -0.5), ctx.rand(d, h, scale=h ** -0.5)
    n_sets = input_sets(ctx, nbytes(w1, w2) + 2 * T * d * ctx.dtype.itemsize)
    xs = [ctx.rand(T, d).requires_grad_(True) for _ in range(n_sets)]
    dys = [ctx.rand(T, d) for _ in range(n_sets)]
    builders = mlp_builders(ctx, act, h, w1, w2)
    label = config_label(act, h)

    row = {"config": label, "activation": act, "hidden": h, "flops": flops, "variants": {}}
    models = {}  # the variants ready to time, kept alive until the interleaved timing
    reference = None
    for name in names:
        log(f"mlp {label} {name}")
        if name.startswith("ours") and ctx.ours is None:
            row["variants"][name] = {"unavailable": ctx.ours_reason}
            continue
        reserve = COMPILE_RESERVE_S if name == "compile" else 0.0
        held = sum(model_bytes(m) for m in models.values())

        def prepare(build=builders[name], ref=reference, held=held):
            model = build()
            return (model, *prepare_mlp_variant(ctx, model, xs, dys, ref, held))

        out = attempt(ctx, f"mlp {name}", prepare, min_time_s=reserve)
        if isinstance(out, tuple):
            models[name], out, reference = out
        row["variants"][name] = out
        free_memory(ctx)

    if models:
        log(f"mlp {label} timing {', '.join(models)} side by side")
        steps = {name: (lambda i, model=model: train_step(model, xs[i], dys[i]))
                 for name, model in models.items()}
        timings = per_name(attempt(ctx, f"mlp {' vs '.join(models)}", time_with_tflops, ctx,
                                   steps, n_sets, flops), models)
        for name in models:
            row["variants"][name] |= timings[name]
    return finish_mlp_row(row)


def finish_mlp_row(row: dict) -> dict:
    """The ratios: every variant vs eager, and recompute time / default time. torch.compile is
    compared with eager's second run, the one timed interleaved with it, when that has a time."""
    v = row["variants"]
    for name, res in v.items():
        if isinstance(res, dict) and "ms" in res:
            base = v.get("eager")
            if name == "compile" and "ms" in v.get("eager_again", {}):
                base = v["eager_again"]
            res["speedup_vs_eager"] = ratio(base, res)
    row["recompute_ratio"] = ratio(v.get("ours_recompute"), v.get("ours"))
    return row


def empty_mlp_row(act: str, h: int, **variants) -> dict:
    return {"config": config_label(act, h), "activation": act, "hidden": h, "variants": variants}


def section_mlp(ctx: Ctx, results: dict) -> None:
    names = [n for n in MLP_VARIANTS if not (n == "torch_backend" and ctx.backend == "torch")]
    rows = results.setdefault("mlp", [])
    for act, h in ctx.configs:
        out = attempt(ctx, f"mlp {config_label(act, h)}", bench_mlp, ctx, act, h, names)
        rows.append(out if "variants" in out else empty_mlp_row(act, h, setup=out))
        ctx.checkpoint()
        free_memory(ctx)


def section_compile(ctx: Ctx, results: dict) -> None:
    """torch.compile last: its first call takes tens of seconds, so everything else is measured
    first and compile runs while the budget lasts. Eager runs again beside it, kept as its own row
    ("eager (again)") although the MLP section already timed eager: it is compile's correctness
    reference, and, timed interleaved with compile, the same-clock base of compile's speedup. Its
    time next to the first eager's also shows how far the clocks moved between the sections."""
    rows = results.setdefault("mlp", [])
    by_config = {r["config"]: r for r in rows}
    for act, h in ctx.configs:
        row = by_config.get(config_label(act, h))
        if row is None:  # the MLP section failed before this config: compile still gets a row
            row = empty_mlp_row(act, h)
            rows.append(row)
        if ctx.time_left() < COMPILE_RESERVE_S:
            row["variants"]["compile"] = {
                "skipped": f"over the time budget ({ctx.time_left():.0f} s left)"}
            continue
        out = attempt(ctx, f"compile {config_label(act, h)}", bench_mlp, ctx, act, h,
                      ["eager", "compile"])
        if "variants" in out:
            row["variants"]["eager_again"] = out["variants"]["eager"]
            row["variants"]["compile"] = out["variants"]["compile"]
        else:
            row["variants"]["compile"] = out
        finish_mlp_row(row)
        ctx.checkpoint()
        free_memory(ctx)


# ---- cold start ------------------------------------------------------------------------------

# Run in a fresh interpreter: import, build the MLP, one fwd+bwd; times are from the parent's
# launch (PMLP_T0) so interpreter start and `import torch` count too, as a user sees them.
# build "device": parameters made and initialised on the GPU, as Megatron and Nanotron build;
# build "meta": on the meta device, then to_empty + init, as FSDP-style code does. torch's first
# meta op imports its meta registrations and sympy (~0.3 s), whatever the backend.
COLD_START_CHILD = r"""
import json, os, sys, time
t0 = float(os.environ["PMLP_T0"])
import torch
t_torch = time.time() - t0
import parallel_mlp
t_import = time.time() - t0
act, h, d, T, backend, device, dtype, build = sys.argv[1:9]
h, d, T, dtype = int(h), int(d), int(T), getattr(torch, dtype)
if device.startswith("cuda"):
    torch.empty(1, device=device)  # the CUDA context, timed on its own
t_cuda = time.time() - t0
if build == "meta":
    m = parallel_mlp.ParallelMLP(d, h, activation=act, backend=backend, device="meta", dtype=dtype)
    m = m.to_empty(device=device)
    m.reset_parameters()
else:
    m = parallel_mlp.ParallelMLP(d, h, activation=act, backend=backend, device=device, dtype=dtype)
x = torch.randn(T, d, device=device, dtype=dtype, requires_grad=True)
dy = torch.randn(T, d, device=device, dtype=dtype)
if device.startswith("cuda"):
    torch.cuda.synchronize()
t_ready = time.time() - t0
prof_path = os.environ.get("PMLP_COLD_PROFILE")
if prof_path:
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
y = m(x)
if device.startswith("cuda"):
    torch.cuda.synchronize()
t_fwd = time.time() - t0
# A scalar loss whose gradient at y is dy, as a training step backpropagates: backward(dy) with
# an explicit gradient would make torch import sympy (~0.4 s) on the way, whatever the backend.
(y * dy).sum().backward()
if device.startswith("cuda"):
    torch.cuda.synchronize()
t_first = time.time() - t0
if prof_path:
    prof.disable()
    prof.dump_stats(prof_path)
print("PMLP_COLD_START " + json.dumps(dict(torch_import_s=t_torch, import_s=t_import, cuda_init_s=t_cuda,
                                           ready_s=t_ready, first_fwd_s=t_fwd, first_fwd_bwd_s=t_first,
                                           sympy_imported="sympy" in sys.modules)))
"""


def cold_start_once(ctx: Ctx, backend: str, act: str, h: int, timeout: float,
                    profile: str | None = None, build: str = "device") -> dict:
    """One fresh interpreter; with `profile`, a cProfile of its first fwd+bwd is written there;
    `build` is where the model is made ("device" or "meta", see COLD_START_CHILD)."""
    repo_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PMLP_T0=repr(time.time()))
    env.pop("PMLP_COLD_PROFILE", None)
    if profile:
        env["PMLP_COLD_PROFILE"] = profile
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH")) if p)
    dtype = str(ctx.dtype).removeprefix("torch.")
    argv = [sys.executable, "-c", COLD_START_CHILD, act, str(h), str(ctx.d_model),
            str(ctx.tokens), backend, str(ctx.device), dtype, build]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=repo_root, capture_output=True, text=True,
                          timeout=timeout, check=False)
    wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith("PMLP_COLD_START "):
            return json.loads(line.split(" ", 1)[1]) | {"process_wall_s": wall}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    raise RuntimeError(f"cold-start child exited {proc.returncode}: {' | '.join(tail)}")


def bench_cold_start(ctx: Ctx, backend: str) -> dict:
    """Twice: the first run may fill the on-disk kernel cache, the second is what a new training
    process pays with the cache warm, and is the number reported. Then once more with the model
    built on the meta device, reported beside it (torch's meta setup is most of the difference)."""
    act, h = ctx.cold_start_config
    # PMLP_COLD_PROFILE_DIR=DIR: also write DIR/cold_start_<backend>.prof (cProfile of the warm
    # run's first fwd+bwd), to see where a new process spends its time.
    prof_dir = os.environ.get("PMLP_COLD_PROFILE_DIR")
    runs = []
    for i in range(2):
        timeout = max(10.0, min(180.0, ctx.time_left()))
        profile = str(Path(prof_dir) / f"cold_start_{backend}.prof") if prof_dir and i == 1 else None
        runs.append(cold_start_once(ctx, backend, act, h, timeout, profile))
    timeout = max(10.0, min(180.0, ctx.time_left()))
    meta = cold_start_once(ctx, backend, act, h, timeout, build="meta")
    return {"config": config_label(act, h), "backend": backend, "runs": runs,
            "first_fwd_bwd_s": runs[-1]["first_fwd_bwd_s"], "meta_build": meta}


def section_cold_start(ctx: Ctx, results: dict) -> None:
    out = results.setdefault("cold_start", {})
    backends = [ctx.backend] + (["torch"] if ctx.backend != "torch" else [])
    for backend in backends:  # torch too: how much of the time is Python, torch and CUDA init
        log(f"cold start ({backend})")
        if backend != "torch" and ctx.ours is None:
            out[backend] = {"unavailable": ctx.ours_reason}
            continue
        out[backend] = attempt(ctx, f"cold start {backend}", bench_cold_start, ctx, backend,
                               min_time_s=10.0)
        ctx.checkpoint()


# ---- driver ----------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m parallel_mlp.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=None, help="T, rows of x (default 8192)")
    p.add_argument("--d-model", type=int, default=None, help="d (default 4096)")
    p.add_argument("--configs", default=None,
                   help=f"activation:hidden list (default {DEFAULT_CONFIGS}); with --tp, hidden "
                        "is the global size")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--backend", default="cute", choices=["cute", "torch"],
                   help="what 'ours' runs on (default cute)")
    p.add_argument("--iters", type=int, default=None, help="timed calls per row (default 30)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 5)")
    p.add_argument("--only", choices=["gemms", "mlp", "cold-start", "all"], default="all")
    p.add_argument("--skip-compile", action="store_true", help="no torch.compile baseline")
    p.add_argument("--skip-cold-start", action="store_true", help="no cold-start subprocesses")
    p.add_argument("--json", default="bench.json", help="where to write every number")
    p.add_argument("--png", default=None, help="chart (needs matplotlib, the 'bench' extra)")
    p.add_argument("--hold-s", type=float, default=None,
                   help="seconds each compared variant runs back to back per round (default 1; "
                        "0: call by call, which compares cycles at a shared clock, not time)")
    p.add_argument("--rounds", type=int, default=3, help="held timing: turns per variant")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help="rows that would start after this many seconds are skipped")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes and few iterations; automatic when CUDA is absent")
    p.add_argument("--tp", action="store_true",
                   help="TP benchmark under torchrun: ParallelMLP vs a Megatron-like eager MLP")
    args = p.parse_args(argv)
    if args.hold_s is not None and args.hold_s < 0:
        p.error(f"--hold-s {args.hold_s:g}: must be >= 0 (0 times call by call)")
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: must be >= 1")
    return args


def apply_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill unset flags: the issue's shapes, or tiny ones for a dry run (forced without CUDA)."""
    if not torch.cuda.is_available() and not args.dry_run:
        log("no CUDA device: running the CPU dry run (tiny shapes, torch backend)")
        args.dry_run = True
    base = DRY_RUN if args.dry_run else dict(tokens=8192, d_model=4096, configs=DEFAULT_CONFIGS,
                                             iters=30, warmup=5, ceiling_size=8192, hold_s=DEFAULT_HOLD_S)
    for key, value in base.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if not torch.cuda.is_available() and args.backend == "cute":
        args.backend = "torch"  # the CuTe kernels need sm_90; the CPU run tests the script
        args.backend_note = "cute needs CUDA: ours runs on the torch backend in this dry run"
    return args


def probe_ours(ctx: Ctx) -> None:
    """Decide once whether ``ctx.backend`` can run here, so each row can say why not without
    paying for the failure again."""
    a, b = ctx.rand(128, 128), ctx.rand(128, 128).t()
    try:
        ctx.ours = resolve(ctx.backend, a, b)
    except Exception as e:  # noqa: BLE001 - ValueError by contract; anything else says the same
        ctx.ours, ctx.ours_reason = None, f"{e}" if isinstance(e, ValueError) else repr(e)
        log(f"ours unavailable: {ctx.ours_reason}")


def run_metadata(args: argparse.Namespace, ctx: Ctx) -> dict:
    meta = {"torch": torch.__version__, "python": sys.version.split()[0],
            "device": torch.cuda.get_device_name(ctx.device) if ctx.cuda else "cpu",
            "cuda": torch.version.cuda, "dtype": args.dtype, "tokens": args.tokens,
            "d_model": args.d_model, "configs": args.configs, "iters": args.iters,
            "warmup": args.warmup, "hold_s": args.hold_s, "rounds": args.rounds,
            "backend": args.backend, "dry_run": args.dry_run,
            "ours_unavailable": ctx.ours_reason, "l2_bytes": ctx.l2_bytes,
            "argv": sys.argv[1:], "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if getattr(args, "backend_note", None):
        meta["backend_note"] = args.backend_note
    try:
        from importlib.metadata import version
        meta["cutlass_dsl"] = version("nvidia-cutlass-dsl")
    except Exception:  # noqa: BLE001 - not installed: fine, just not recorded
        meta["cutlass_dsl"] = None
    try:
        from .kernels.compile import cache_dir
        meta["kernel_cache_dir"] = str(cache_dir())
    except Exception:  # noqa: BLE001 - kernels not importable here
        meta["kernel_cache_dir"] = None
    try:
        repo = Path(__file__).resolve().parent.parent

        def git(*args):
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                                  timeout=5, check=False).stdout.strip()

        # "+changes" when tracked files differ from HEAD: a copied working tree (as on a lent GPU
        # host) may carry an older .git than the code it runs.
        head = git("rev-parse", "--short", "HEAD")
        dirty = head and git("status", "--porcelain", "--untracked-files=no")
        meta["git"] = f"{head}+changes" if dirty else head
    except Exception:  # noqa: BLE001
        meta["git"] = None
    return meta


def make_ctx(args: argparse.Namespace, device: torch.device, start: float) -> Ctx:
    ctx = Ctx(device=device, dtype=getattr(torch, args.dtype), tokens=args.tokens,
              d_model=args.d_model, configs=parse_configs(args.configs), iters=args.iters,
              warmup=args.warmup, backend=args.backend, deadline=start + args.budget_s,
              hold_s=args.hold_s, rounds=args.rounds)
    # The cold start uses the case (swiglu h=14336) or, on other shapes, the first config.
    swiglu = [c for c in ctx.configs if c[0] == "swiglu"]
    ctx.cold_start_config = swiglu[0] if swiglu else ctx.configs[0]
    if ctx.cuda:
        props = torch.cuda.get_device_properties(device)
        ctx.l2_bytes = getattr(props, "L2_cache_size", 50 * 2 ** 20)
    else:
        ctx.l2_bytes = 32 * 2 ** 20  # a nominal cache, so the dry run exercises input rotation
    return ctx


def run_single(args: argparse.Namespace) -> dict:
    start = time.monotonic()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")
    ctx = make_ctx(args, device, start)
    torch.manual_seed(0)
    probe_ours(ctx)
    results = {"meta": run_metadata(args, ctx)}

    def save():
        bench_report.write_json(results, args.json)

    ctx.checkpoint = save
    watchdog = start_watchdog(ctx, results, args)

    log("ceiling: cuBLAS GEMM")
    results["ceiling"] = {"start": attempt(ctx, "ceiling", bench_ceiling, ctx, args.ceiling_size)}
    # Most important first, in case the budget runs out: the whole MLP, the GEMMs, the cold start
    # (after the kernel cache is warm), and torch.compile, the slow one, last.
    sections = []
    if args.only in ("mlp", "all"):
        sections += [section_mlp]
    if args.only in ("gemms", "all"):
        sections += [section_gemms, section_fused]
    if args.only in ("mlp", "all", "cold-start"):
        if not args.skip_cold_start:
            sections += [section_cold_start]
    if args.only in ("mlp", "all"):
        if not args.skip_compile:
            sections += [section_compile]
    for section in sections:
        try:
            section(ctx, results)
        except Exception as e:  # noqa: BLE001 - a bug in one section must not lose the others
            log(f"{section.__name__} failed: {e}")
            traceback.print_exc(file=sys.stderr)
            results.setdefault("errors", []).append(f"{section.__name__}: {type(e).__name__}: {e}")
        save()  # partial results survive a crash or a kill in a later section
    # The same GEMM again at the end: a drop means clocks or thermals moved during the run.
    results["ceiling"]["end"] = attempt(ctx, "ceiling", bench_ceiling, ctx, args.ceiling_size)
    results["meta"]["wall_s"] = time.monotonic() - start
    results["targets"] = bench_report.evaluate_targets(results)
    save()
    watchdog.cancel()
    return results


def start_watchdog(ctx: Ctx, results: dict, args: argparse.Namespace) -> threading.Timer:
    """A hung kernel blocks the main thread in a synchronize forever. Past the budget plus a
    margin, print and save what was measured, name the measurement that hangs, and exit, so the
    one run on a GPU still reports instead of dying silently at the caller's time limit."""
    limit = args.budget_s + WATCHDOG_MARGIN_S

    def fire():
        msg = f"watchdog: still running after {limit:.0f} s, stuck in: {ctx.current}"
        log(msg)
        try:
            results.setdefault("errors", []).append(msg)
            results["targets"] = bench_report.evaluate_targets(results)
            bench_report.write_json(results, args.json)
            print(bench_report.format_tables(results), flush=True)
        finally:
            os._exit(3)

    timer = threading.Timer(limit, fire)
    timer.daemon = True
    timer.start()
    return timer


def main(argv=None) -> int:
    args = apply_defaults(parse_args(argv))
    if args.tp:
        from . import bench_tp
        return bench_tp.main(args)
    results = run_single(args)
    if args.png:
        log(bench_report.write_png(results, args.png))
    log(f"wrote {args.json}")
    print(bench_report.format_tables(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
