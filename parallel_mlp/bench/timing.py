"""Timing primitives: a function held (called back to back for a while, as training calls its
kernels), functions held in turns or called round-robin, and the host time of a launch.

An H200 at its 700 W cap sets its clock by the energy the running kernels spend per cycle, and
settles over tens of milliseconds. Two kernels timed call by call, in turn, share one clock, so
their ratio compares cycles; held, each runs at the clock its own power draw allows, which is
what a training step sees.

Used by the benchmarks and by the kernels' ``tuned=True`` (kernels/tuning.py times candidates
with ``median_ms_held``); the library imports this module lazily, and it needs torch alone.
The clock that ends a hold and times CPU calls is a parameter (``clock``, seconds, monotonic;
default ``time.perf_counter``), so tests can drive it without sleeping.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

# Seconds since an arbitrary start, never going back: time.perf_counter, or a test's fake.
Clock = Callable[[], float]

# The host stays this many calls ahead of the GPU (it waits on the event of the call this far
# back), so the queue never drains and never grows without bound.
HOLD_QUEUE = 8
# The first part of each hold is left out: the clock is still moving from the previous
# workload's level to this one's.
HOLD_SETTLE = 0.25
# How long each variant is held per turn, by default. The card's clock seems to swing with a
# period near a second: three columns of the SAME kernel held 0.5 s each in turn measured 1.47 /
# 1.42 / 1.48 ms (a 4-6% spread on every GEMM tried); held 1 s they agreed within 0.6%, held
# 1.5 s within 0.3% (measured 2026-11-30 on one H200: three columns of one config side by side,
# `python -m parallel_mlp.bench configs --h 14336 --only dpost,fc2,dx --also cache_hints=normal
# --also cache_hints=normal --hold-s S`). Shorter holds sample the swing's phase, not the kernel.
DEFAULT_HOLD_S = 1.0


def turn_order(n: int, round_index: int) -> list[int]:
    """The order in which ``n`` held variants take their turns in round ``round_index``: forward
    in even rounds, reversed in odd ones (A B C, C B A, ...), so that every variant's mean place
    in the rounds is the same. In one order, a drift through the rounds lands on the variants by
    their place: eager against a second copy of itself, first and last in each round, read
    0.98-0.99x at 23 of the sweep's 30 shapes (geometric mean 0.983x; H200, 2026-12-02, `bench
    sweep`), where a timing without bias by place reads 1; in alternating order, 0.988x and
    0.998x in two sweeps of the same day. With two rounds reversed, a drift linear in time adds
    the same to every variant's mean."""
    order = list(range(n))
    return order if round_index % 2 == 0 else order[::-1]


def heat(fns: list[Callable[[int], object]], seconds: float, cuda: bool = True,
         clock: Clock = time.perf_counter) -> int:
    """Untimed: call every fn once in turn, ``fn(i)``, i = 0, 1, ... per cycle, until ``seconds``
    have passed on ``clock`` (the cycle in flight finishes, the GPU waited for after each cycle);
    returns the cycles run. Before held turns, so that the first turns do not meet a card (and
    host) fresh from the idle between measurements: in the shape sweep, each variant's first
    turn of 0.7 s against its second (eager's first turn, then ours', their order reversed in
    the second round) ran 2.1% faster for the first variant, 1.2-1.3% for the second and 0.0-0.2%
    from the third on (geometric means over 25 held shapes, two sweeps of the H200, 2026-12-04),
    which read eager against its own copy 0.988-0.990x (the first round 0.980x, the second
    1.002x)."""
    end_at = clock() + seconds
    cycles = 0
    while clock() < end_at:
        for fn in fns:
            fn(cycles)
        if cuda:
            torch.cuda.synchronize()
        cycles += 1
    return cycles


def hold(fn: Callable[[int], object], seconds: float, cuda: bool = True,
         clock: Clock = time.perf_counter) -> list[float]:
    """Call ``fn(i)``, i = 0, 1, ..., back to back until ``seconds`` have passed on ``clock``
    (the call in flight finishes); each call's ms, in order (CUDA events around each call on
    CUDA, else two readings of ``clock``)."""
    end_at = clock() + seconds
    return _back_to_back(fn, lambda i: clock() < end_at, cuda, clock)


def hold_steps(fn: Callable[[int], object], steps: int, cuda: bool = True,
               clock: Clock = time.perf_counter) -> list[float]:
    """``hold`` for a fixed number of calls: what ranks that must issue the same collectives
    run, since each rank's clock would end a timed hold after its own number of calls."""
    return _back_to_back(fn, lambda i: i < steps, cuda, clock)


def _back_to_back(fn: Callable[[int], object], more: Callable[[int], bool], cuda: bool,
                  clock: Clock) -> list[float]:
    if not cuda:
        times, i = [], 0
        while more(i):
            t0 = clock()
            fn(i)
            times.append((clock() - t0) * 1e3)
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


def held_turns(fns, hold_s=None, rounds=3, warmup=1) -> list[list[float]]:
    """Each of several zero-argument CUDA functions held: run back to back for `hold_s` in turn,
    for `rounds` turns, after `warmup` untimed calls of each. Each then runs at the clock its own
    power draw allows, as in training, where median_ms_interleaved gives them one shared clock
    and so compares cycles. Returns, per function, each turn's median ms (round by round, so
    that two functions' turns of one round pair up); the turns' order reverses every round
    (turn_order). `hold_s` defaults to DEFAULT_HOLD_S."""
    hold_s = DEFAULT_HOLD_S if hold_s is None else hold_s
    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    turns = [[] for _ in fns]
    for r in range(rounds):
        for k in turn_order(len(fns), r):
            turns[k].append(statistics.median(settled(hold(lambda i, fn=fns[k]: fn(), hold_s))))
    return turns


def median_ms_held(fns, hold_s=None, rounds=3, warmup=1):
    """Median times (ms) of several functions held in turns (held_turns): a function's time is
    the median over its turns of each turn's median."""
    return [statistics.median(t) for t in held_turns(fns, hold_s, rounds, warmup)]


def graphed(fn: Callable[[], object], calls: int, warmup: int = 2) -> Callable[[], None]:
    """``fn`` called ``calls`` times in a row, captured once into a CUDA graph; returns the graph's
    replay. Timing a replay times those calls' kernels without their host side (the Python and
    driver calls of each launch are not replayed): a kernel of tens of microseconds, whose
    launches take nearly as long on a slow host, is then measured rather than its launches.
    ``fn`` runs ``warmup`` times first, on a side stream as capture requires (it compiles and
    allocates there); what it allocates inside the capture comes from the graph's own pool."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def median_ms_interleaved(fns, reps=10, warmup=1):
    """Median CUDA-event times (ms) of several functions, after `warmup` untimed rounds (the
    first call also compiles), called round-robin: f0, f1, ..., f0, f1, ... so that each sees
    the same clocks: a comparison of cycles (see the module's docstring).

    Events around every call, one synchronize at the end: the host runs ahead and keeps the
    queue full, so each event pair brackets the kernel, not the Python that launches it. (A
    synchronize per call would let the GPU idle while the next call's host side runs and add
    that launch overhead, ~0.1 ms for ours vs ~0.01 ms for torch.mm, to every sample.)"""
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


def host_us_per_call(fn, calls=200, warmup=3, clock: Clock = time.perf_counter):
    """Host wall time per call in µs over back-to-back calls of a tiny op: the launch overhead
    (Python, argument conversion, the launch itself), which the GPU waits for whenever the
    queue is empty, e.g. after a synchronize or with small per-rank shapes."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = clock()
    for _ in range(calls):
        fn()
    t1 = clock()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6
