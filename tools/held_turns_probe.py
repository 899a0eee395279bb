"""Why a host-bound fused step reads slower in the sweep's held turns than in a steady loop: the
same models timed several ways in one process, one change at a time.

    python3 tools/held_turns_probe.py [--shape T,d,h,act ...] [--rounds N]

For each shape: the fused function at every size (the sweep's ``ours_fused``), ``ParallelMLP``
on ``backend="auto"`` (the small step where its rule takes it, else the same fused function) and
eager, over four input sets in turn as the sweep rotates them, timed

  turns      as the sweep times host-bound steps: 0.05 s turns of back-to-back calls, each call
             between two CUDA events, the order reversed every round, the median of each turn's
             settled calls, then the median over turns (harness.time_held's way);
  turns, gc  the same with Python's garbage collector off during the turns;
  alone      each model's turns with no other model between them (its keys cannot churn);
  loop       300 calls back to back without events, synchronized at the end, best of three
             (tools/fused_step_probe.py's way);

then, for the fused step in ``turns``, its settled calls' median by input set and the share of
calls over twice the median, the launch groups' counts per turn, and, from torch.profiler over
ten steady steps of each model, the GPU's busy time against the steps' span and the longest idle
gaps between kernels (what the GPU waited on the host for).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch

from parallel_mlp.bench.harness import add_changes, launch_counts
from parallel_mlp.bench.host_overhead import parse_shape
from parallel_mlp.bench.models import build_parallel_mlp, fused_and_eager, train_step
from parallel_mlp.bench.timing import hold, settled, turn_order

SHAPES = [(512, 1024, 512, "gelu_tanh_approx"), (4096, 1024, 4096, "gelu_tanh_approx"),
          (512, 1024, 2816, "swiglu")]
INPUT_SETS = 4
TURN_S = 0.05
ON_GPU = True  # CUDA events around each call (False: the host's clock, for the CPU tests)


def build(shape):
    from parallel_mlp import ParallelMLP

    models, inputs = fused_and_eager(shape, INPUT_SETS)
    ours = models["ours"]
    auto = build_parallel_mlp(ours.fc1.weight.detach(), ours.fc2.weight.detach(), shape[3],
                               shape[2], cls=ParallelMLP, backend="auto")
    return {"fused": ours, "auto": auto, "eager": models["eager"]}, inputs


def step_fn(model, inputs):
    def fn(i):
        x, dy = inputs[i % INPUT_SETS]
        train_step(model, x, dy)
    return fn


def turns(fns: dict, rounds: int, collector_off: bool = False):
    """{name: (median ms over turns, [per-call ms of every turn], launch-group counts)}"""
    names = list(fns)
    calls = {n: [] for n in names}
    medians = {n: [] for n in names}
    counts = {n: {} for n in names}
    for r in range(rounds):
        for n in (names[k] for k in turn_order(len(names), r)):
            before = launch_counts()
            if collector_off:
                gc.disable()
            try:
                times = hold(fns[n], TURN_S, cuda=ON_GPU)
            finally:
                gc.enable()
            add_changes(counts[n], before, launch_counts())
            calls[n].append(times)
            medians[n].append(statistics.median(settled(times)))
    return {n: (statistics.median(medians[n]), calls[n], counts[n]) for n in names}


def loop_ms(fn, steps: int = 300) -> float:
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            fn(i)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / steps * 1e3)
    return best


def gpu_gaps(fn, steps: int = 10):
    """(busy ms per step, span ms per step, [(gap µs, kernel before, kernel after), ...])"""
    for i in range(20):
        fn(i)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            fn(i)
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    if not spans:
        return 0.0, 0.0, []
    busy = sum(end - start for start, end, _ in spans)
    gaps = []
    for (s0, e0, n0), (s1, _, n1) in zip(spans, spans[1:]):
        if s1 > e0:
            gaps.append((s1 - e0, n0, n1))
    gaps.sort(reverse=True)
    span = spans[-1][1] - spans[0][0]
    return busy / steps / 1e3, span / steps / 1e3, gaps[:6]


def probe(shape, rounds: int) -> None:
    from parallel_mlp.launch_graphs import GRAPHS

    models, inputs = build(shape)
    fns = {n: step_fn(m, inputs) for n, m in models.items()}
    label = ",".join(map(str, shape))
    for i in range(30):  # first calls: compiles, keys seen and captured
        for fn in fns.values():
            fn(i)
    torch.cuda.synchronize()
    print(f"== {label}", flush=True)
    held = turns(fns, rounds)
    held_gc = turns(fns, rounds, collector_off=True)
    alone = {n: turns({n: fn}, rounds)[n][0] for n, fn in fns.items()}
    loop = {n: loop_ms(fn) for n, fn in fns.items()}
    print(f"  {'model':12s} {'turns':>8s} {'turns,gc':>9s} {'alone':>8s} {'loop':>8s}  ms a step")
    for n in fns:
        print(f"  {n:12s} {held[n][0]:8.3f} {held_gc[n][0]:9.3f} {alone[n]:8.3f} {loop[n]:8.3f}")
    _, calls, counts = held["fused"]
    med = held["fused"][0]
    by_set = {s: [] for s in range(INPUT_SETS)}
    slow = total = 0
    for times in calls:
        start = int(len(times) * 0.25)
        for i, t in enumerate(times[start:], start):
            by_set[i % INPUT_SETS].append(t)
            total += 1
            slow += t > 2 * med
    print("  fused in turns: settled median by input set "
          + ", ".join(f"{s}: {statistics.median(v):.3f}" for s, v in by_set.items() if v)
          + f"; calls over 2x the median {slow}/{total}; first-quarter median "
          + f"{statistics.median(t for times in calls for t in times[:int(len(times) * .25)] or [0]):.3f}")
    print("  fused launch groups per turn: "
          + ", ".join(f"{k} {v / rounds:.1f}" for k, v in sorted(counts.items())))
    print(f"  graphs kept {len(GRAPHS)}")
    for n, fn in fns.items():
        busy, span, gaps = gpu_gaps(fn)
        print(f"  {n}: GPU busy {busy:.3f} of a {span:.3f} ms span per step; longest gaps: "
              + "; ".join(f"{g:.0f} us {a[:40]} -> {b[:40]}" for g, a, b in gaps[:4]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", type=parse_shape,
                   help="T,d,h,act (repeatable; default: T=512 d=1024 gelu_tanh_approx h=512, "
                        "T=4096 d=1024 gelu_tanh_approx h=4096, T=512 d=1024 swiglu h=2816)")
    p.add_argument("--rounds", type=int, default=24)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("held_turns_probe.py needs a CUDA GPU")
    for shape in args.shape or SHAPES:
        probe(shape, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
