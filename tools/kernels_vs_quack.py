"""Each GPU kernel of one fwd+bwd step, ours beside quack's MLP: which of the step's GEMMs the
other runs faster, at the shapes where the sweep reads quack's step ahead of ours.

    python3 tools/kernels_vs_quack.py [--shape T,d,h,act ...] [--rounds N]

For each shape: ``ParallelMLP(backend="auto")`` and quack's ``quack.mlp.MLP`` (its heuristic
configs, as the sweep runs it) on the same weights, each warmed and then held for 1 s, then
``--rounds`` rounds in which each runs ten steps under torch.profiler, the models in turn (the
order reversed each round), then ``--rounds`` held turns of 1 s each (the sweep's timing: the
median of a turn's settled calls, each between two CUDA events). Printed per model: its kernels
in launch order with the mean time of each per step and the GPU's idle time before it (µs; the
kernel name shortened), their sums, and the held step's time; then quack's step time over ours
round by round. Kernels run back to back on a GPU-bound step, so each time is its own, and a
step's time above its kernels' sum is time the GPU spent waiting; the two models' lists are
matched by hand (both launch fc1 + activation, fc2, then the backward's GEMMs).
"""

from __future__ import annotations

import argparse
import sys

import torch

from parallel_mlp.bench import quack_baseline
from parallel_mlp.bench.host_overhead import parse_shape
from parallel_mlp.bench.models import ours_and_quack, train_step
import statistics

from parallel_mlp.bench.timing import hold, settled, turn_order

SHAPES = [(8192, 8192, 8192, "gelu_tanh_approx"), (16384, 8192, 11008, "swiglu"),
          (8192, 4096, 14336, "swiglu")]
STEPS = 10


def profile_steps(fn) -> list[tuple[str, float, float]]:
    """[(kernel name, start µs, µs)] of STEPS calls of fn, in launch order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(STEPS):
            fn(i)
        torch.cuda.synchronize()
    events = sorted((e.time_range.start, e.name, e.time_range.end - e.time_range.start)
                    for e in prof.events()
                    if e.device_type == torch.autograd.DeviceType.CUDA)
    return [(name, start, dt) for start, name, dt in events]


def per_step(kernels: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """The kernels of one step (the list cut in STEPS equal parts): each kernel's name, its mean
    µs over the steps and the mean µs the GPU idled before it (from the end of the kernel before:
    for a step's first kernel, the previous step's last; the first profiled kernel has none and
    counts in no mean). A list that does not cut into equal steps comes back kernel by kernel."""
    gaps = [None] + [start - (p_start + p_dt)
                     for (_, p_start, p_dt), (_, start, _) in zip(kernels, kernels[1:])]
    n = len(kernels) // STEPS
    if n == 0 or n * STEPS != len(kernels):
        return [(name, dt, gap or 0.0) for (name, _, dt), gap in zip(kernels, gaps)]
    out = []
    for k in range(n):
        durations = [kernels[s * n + k][2] for s in range(STEPS)]
        idle = [gaps[s * n + k] for s in range(STEPS) if gaps[s * n + k] is not None]
        out.append((kernels[k][0], sum(durations) / STEPS, sum(idle) / len(idle) if idle else 0.0))
    return out


def short(name: str) -> str:
    return name if len(name) <= 96 else name[:60] + "..." + name[-33:]


def probe(shape, rounds: int) -> None:
    tokens, d, h, act = shape
    runs, x, dy = ours_and_quack(shape)
    fns = {name: (lambda i, m=m: train_step(m, x, dy)) for name, m in runs.items()}
    for fn in fns.values():
        for i in range(3):
            fn(i)
    torch.cuda.synchronize()
    for fn in fns.values():
        hold(fn, 1.0)
    lists = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in (names[k] for k in turn_order(len(names), r)):
            hold(fns[name], 0.3)  # the card at this model's own clock before it is profiled
            lists[name].append(per_step(profile_steps(fns[name])))
    held = {name: [] for name in fns}
    for r in range(rounds):
        for name in (names[k] for k in turn_order(len(names), r)):
            held[name].append(statistics.median(settled(hold(fns[name], 1.0))))
    print(f"== T={tokens} d={d} h={h} {act}", flush=True)
    for name, steps in lists.items():
        n = min(len(s) for s in steps)
        print(f"  {name}: {n} kernels a step, µs and the GPU's idle µs before each (mean of {rounds} "
              f"rounds x {STEPS} steps, under the profiler)")
        total = idle = 0.0
        for k in range(n):
            us = sum(s[k][1] for s in steps) / len(steps)
            gap = sum(s[k][2] for s in steps) / len(steps)
            total, idle = total + us, idle + gap
            print(f"    {us:9.1f} {gap:7.1f}  {short(steps[0][k][0])}")
        print(f"    {total:9.1f} {idle:7.1f}  sums; the held step {statistics.median(held[name]) * 1e3:.1f} µs")
    ratios = [q / o for q, o in zip(held["quack"], held["ours"])]
    print("  quack / ours, held, round by round: " + " ".join(f"{r:.4f}" for r in ratios)
          + f"; median {statistics.median(ratios):.4f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", type=parse_shape,
                   help="T,d,h,act (repeatable; default: T=8192 d=8192 gelu_tanh_approx h=8192, "
                        "T=16384 d=8192 swiglu h=11008, T=8192 d=4096 swiglu h=14336)")
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("kernels_vs_quack.py needs a CUDA GPU")
    if not quack_baseline.installed():
        raise SystemExit(f"kernels_vs_quack.py needs quack: {quack_baseline.INSTALL_HINT}")
    for shape in args.shape or SHAPES:
        probe(shape, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
