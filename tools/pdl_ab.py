"""The fused step with its kernels launched with programmatic dependent launch (GemmConfig.pdl,
``ops.set_pdl``) beside the same step without it, and eager (a GPU is needed).

    python3 tools/pdl_ab.py [--hold-s 0.4] [--rounds 6] [--shapes T:d:h:act,...]

For each shape: one ``ParallelMLP`` (backend "auto", or "cute" where auto would take the small
step), its steps with pdl on and off in alternating held turns as the sweep holds them (the
switch flipped before each step, each setting with its own launch graphs, so that neither replays
the other's captures), eager and eager's second copy (the run's spread): ms per fwd+bwd, each
one's ratio to eager, and pdl's gain over the same step without it (the median of the rounds'
paired ratios). What pdl can save is the gap between a step's kernels: each kernel's launch and
its CTAs' setup, overlapped with the SMs' last tiles of the kernel before it.
"""

from __future__ import annotations

import argparse

import torch

from launch_graphs_ab import (  # same folder: its step's models and timing, alike
    device_and_host_line, eager_two_ways_copy, fused_and_eager)
from parallel_mlp import autograd
from parallel_mlp.bench.models import train_step
from parallel_mlp.kernels import ops
from parallel_mlp.kernels.warmup import parse_shapes
from parallel_mlp.launch_graphs import LaunchGraphs

# The sweep's GPU-bound steps furthest from the GEMM bound, the headline, and the host-bound
# steps the fused kernels run (where the GPU's share is a few short kernels).
SHAPES = "8192:1024:2816:swiglu,65536:1024:2816:swiglu,65536:1024:1024:gelu_tanh_approx," \
         "8192:4096:2048:gelu_tanh_approx,8192:4096:1376:swiglu,8192:4096:14336:swiglu," \
         "2048:2048:2816:swiglu,4096:1024:4096:gelu_tanh_approx,512:1024:2816:swiglu"


def _switched(model, x, dy, pdl: bool, graphs: LaunchGraphs):
    def step():
        ops.set_pdl(pdl)
        autograd.GRAPHS = graphs
        train_step(model, x, dy)
    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hold-s", type=float, default=0.4)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--shapes", default=SHAPES, metavar="T:d:h:act,...")
    args = p.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as e:
        p.error(str(e))
    if not torch.cuda.is_available():
        raise SystemExit("pdl_ab.py needs a CUDA GPU")
    print(device_and_host_line(args.hold_s, args.rounds))
    print(f"{'shape':38s} {'path':5s} {'eager ms':>9s} {'pdl':>8s} {'no pdl':>8s} {'copy':>8s} "
          f"{'pdl/eager':>9s} {'off/eager':>9s} {'pdl gain':>8s}")
    kept_graphs, kept_pdl = autograd.GRAPHS, ops.pdl_launches()
    try:
        for T, d, h, act in shapes:
            ours, eager, copy, x, dy, backend = fused_and_eager(T, d, h, act, launch_graphs=True)
            fns = [lambda: train_step(eager, x, dy), _switched(ours, x, dy, True, LaunchGraphs()),
                   _switched(ours, x, dy, False, LaunchGraphs()), lambda: train_step(copy, x, dy)]
            ms, over_eager, gain = eager_two_ways_copy(fns, args.hold_s, args.rounds)
            label = f"T={T} d={d} {act} h={h}"
            print(f"{label:38s} {backend:5s} {ms[0]:9.3f} {ms[1]:8.3f} {ms[2]:8.3f} {ms[3]:8.3f} "
                  f"{over_eager[1]:8.3f}x {over_eager[2]:8.3f}x {gain:7.3f}x", flush=True)
            del ours, eager, copy, fns
            torch.cuda.empty_cache()
    finally:
        autograd.GRAPHS = kept_graphs
        ops.set_pdl(kept_pdl)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
