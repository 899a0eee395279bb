"""The fused function with its launch groups replayed from CUDA graphs, beside the same function
launching kernel by kernel, and eager, at host-bound steps (a GPU is needed).

    python3 tools/launch_graphs_ab.py [--hold-s 0.3] [--rounds 6]

For each shape: ``ParallelMLP`` (auto, or cute where auto would take the small step) with
``launch_graphs.GRAPHS`` on and off (the same module, the switch flipped between turns), eager
and eager's second copy (the run's spread), held in alternating turns as the sweep holds them:
ms per fwd+bwd and each one's ratio to eager; then each one's host µs per step back to back
(``bench.timing.host_us_per_call``: Python, launches and graph launches, no waiting), with
autograd's device threads on (PyTorch's default). The graphs' counters say how many groups
were replayed.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from parallel_mlp.activations import ACTIVATIONS
from parallel_mlp.bench.harness import Ctx
from parallel_mlp.bench.models import EagerMLP, build_parallel_mlp, chunked_w1, train_step
from parallel_mlp.bench.sweep import host_probe_us
from parallel_mlp.bench.timing import held_turns, host_us_per_call
from parallel_mlp.launch_graphs import GRAPHS
from parallel_mlp.small_step import applies

SHAPES = [  # T, d, h, activation: the sweep's host-bound fused steps, then small ones run fused
    (8192, 1024, 2816, "swiglu"), (2048, 2048, 2816, "swiglu"),
    (8192, 2048, 4096, "gelu_tanh_approx"), (4096, 1024, 4096, "gelu_tanh_approx"),
    (512, 1024, 2816, "swiglu"), (512, 8192, 2752, "swiglu")]


def fused_and_eager(T: int, d: int, h: int, act: str, launch_graphs: bool):
    """(ParallelMLP, EagerMLP, a second EagerMLP, x, dy, the ParallelMLP's backend) of one shape,
    bf16 on the GPU, the same weights in each: backend "auto", or "cute" where auto would take
    the small step (``launch_graphs``: whether the rule may count on replayed launch groups), so
    that the fused kernels run."""
    gated = ACTIVATIONS[act].gated
    g = torch.Generator(device="cuda").manual_seed(0)
    w1 = (torch.randn((2 if gated else 1) * h, d, device="cuda", generator=g) * d ** -0.5).bfloat16()
    w2 = (torch.randn(d, h, device="cuda", generator=g) * h ** -0.5).bfloat16()
    x = torch.randn(T, d, device="cuda", generator=g).bfloat16().requires_grad_()
    dy = torch.randn(T, d, device="cuda", generator=g).bfloat16()
    small = applies(T, d, w1.shape[0], h, d, device_type="cuda", backend="auto", tp_size=1,
                    recompute=False, fuse_grad_accum=False, compiling=False,
                    gate_ops=ACTIVATIONS[act].gate is not None, launch_graphs=launch_graphs)
    backend = "cute" if small else "auto"
    ours = build_parallel_mlp(w1, w2, act, h, backend=backend)
    eager = EagerMLP(chunked_w1(w1, gated), w2.clone(), act)
    copy = EagerMLP(chunked_w1(w1, gated), w2.clone(), act)
    return ours, eager, copy, x, dy, backend


def device_and_host_line(hold_s: float, rounds: int) -> str:
    """The run's first line: the GPU, the host's speed (a tiny eager step's host time, the sweep's
    probe) and the timing."""
    ctx = Ctx(device=torch.device("cuda"), dtype=torch.bfloat16, tokens=0, d_model=0, configs=[],
              iters=10, warmup=3, backend="auto", deadline=float("inf"), hold_s=hold_s,
              rounds=rounds, quiet=True)
    return (f"{torch.cuda.get_device_name()}; host probe {host_probe_us(ctx):.0f} µs "
            f"(a tiny eager step's host time); held {hold_s} s x {rounds} turns")


def eager_two_ways_copy(fns, hold_s: float, rounds: int):
    """``fns``: eager, the step one way, the same step the other way, eager's second copy, held in
    alternating turns as the sweep holds them. Returns each one's median ms, each one's ratio to
    eager (the median of the rounds' paired ratios) and the first way's gain over the second
    (the median of the second's turn over the first's in the same round)."""
    turns = held_turns(fns, hold_s, rounds, warmup=5)
    ms = [statistics.median(t) for t in turns]
    over_eager = [statistics.median(e / o for e, o in zip(turns[0], t)) for t in turns]
    gain = statistics.median(second / first for first, second in zip(turns[1], turns[2]))
    return ms, over_eager, gain


def _switched(model, x, dy, enabled: bool):
    def step():
        GRAPHS.enabled = enabled
        train_step(model, x, dy)
    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hold-s", type=float, default=0.3)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args(argv)
    print(device_and_host_line(args.hold_s, args.rounds))
    print(f"{'shape':38s} {'path':5s} {'eager ms':>9s} {'graphs':>8s} {'plain':>8s} "
          f"{'copy':>8s} {'g/eager':>8s} {'p/eager':>8s} {'g/p':>6s}  host µs: graphs plain eager")
    for T, d, h, act in SHAPES:
        ours, eager, copy, x, dy, backend = fused_and_eager(T, d, h, act, launch_graphs=False)
        fns = [lambda: train_step(eager, x, dy), _switched(ours, x, dy, True),
               _switched(ours, x, dy, False), lambda: train_step(copy, x, dy)]
        GRAPHS.clear()
        ms, paired, g_over_p = eager_two_ways_copy(fns, args.hold_s, args.rounds)
        host = [host_us_per_call(fns[k], calls=100) for k in (1, 2, 0)]
        GRAPHS.enabled = True
        label = f"T={T} d={d} {act} h={h}"
        print(f"{label:38s} {backend:5s} {ms[0]:9.3f} {ms[1]:8.3f} {ms[2]:8.3f} {ms[3]:8.3f} "
              f"{paired[1]:7.3f}x {paired[2]:7.3f}x {g_over_p:5.3f}x  {host[0]:6.0f} {host[1]:6.0f} "
              f"{host[2]:6.0f}   {dict(GRAPHS.stats)}")
        del ours, eager, copy
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
