"""Held timing: a function called back to back for a while, as training calls its kernels.

An H200 at its 700 W cap sets its clock by the energy the running kernels spend per cycle, and
settles over tens of milliseconds. Two kernels timed call by call, in turn, share one clock, so
their ratio compares cycles; held, each runs at the clock its own power draw allows, which is
what a training step sees. Used by ``parallel_mlp.bench`` and the kernels' ``bench_gemm``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

# The host stays this many calls ahead of the GPU (it waits on the event of the call this far
# back), so the queue never drains and never grows without bound.
HOLD_QUEUE = 8
# The first part of each hold is left out: the clock is still moving from the previous
# workload's level to this one's.
HOLD_SETTLE = 0.25
# How long each variant is held per turn, by default. The card's clock seems to swing with a period near
# a second: three columns of the SAME kernel held 0.5 s each in turn measured 1.47 / 1.42 /
# 1.48 ms (a 4-6% spread on every GEMM tried); held 1 s they agreed within 0.6%, held 1.5 s
# within 0.3% (bench_results/h200-2026-11-30-session7-position.log). Shorter holds sample the
# swing's phase, not the kernel.
DEFAULT_HOLD_S = 1.0


def hold(fn: Callable[[int], object], seconds: float, cuda: bool = True) -> list[float]:
    """Call ``fn(i)``, i = 0, 1, ..., back to back for ``seconds``; each call's ms, in order (CUDA
    events around each call on CUDA, else wall time)."""
    end_at = time.monotonic() + seconds
    return _back_to_back(fn, lambda i: time.monotonic() < end_at, cuda)


def hold_steps(fn: Callable[[int], object], steps: int, cuda: bool = True) -> list[float]:
    """``hold`` for a fixed number of calls: what ranks that must issue the same collectives
    run, since each rank's clock would end a timed hold after its own number of calls."""
    return _back_to_back(fn, lambda i: i < steps, cuda)


def _back_to_back(fn: Callable[[int], object], more: Callable[[int], bool], cuda: bool) -> list[float]:
    if not cuda:
        times, i = [], 0
        while more(i):
            t0 = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - t0) * 1e3)
            i += 1
        return times
    pairs, i = [], 0
    while more(i):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i)
        end.record()
        pairs.append((start, end))
        if i >= HOLD_QUEUE:
            pairs[i - HOLD_QUEUE][1].synchronize()
        i += 1
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in pairs]


def settled(times: list[float]) -> list[float]:
    """A hold's calls after its first HOLD_SETTLE (all of them when that would leave none)."""
    return times[int(len(times) * HOLD_SETTLE):] or times
